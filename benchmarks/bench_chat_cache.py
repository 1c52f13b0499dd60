"""A scripted chat with and without the prefix cache: tokens fed through the model and time per turn.

    .venv/bin/python benchmarks/bench_chat_cache.py [--model PATH --strategy 'cpu fp32'] [--turns 4]

Without --model a random tiny checkpoint is generated (tests/fixtures/make_tiny_models.py; 4 layers,
n_embd 256, World vocabulary). Each turn sends a message and generates a reply of --reply tokens with
greedy sampling. With the cache, turn k feeds only its own new tokens; without it, the whole
conversation so far (the way a stateless client resends it).
"""

import argparse
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MESSAGES = ["Hello! Can you tell me about the RWKV architecture?", "How does it compare to transformers?",
            "What about memory use during inference?", "Thanks, and one more: how do states work?",
            "Summarise our conversation.", "Goodbye!"]


def _model(ns, tmp):
    from rwkv.model import RWKV
    path = ns.model
    if path is None:
        from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint
        path = os.path.join(tmp, "bench-chat.pth")
        save_checkpoint(path, make_checkpoint("7", n_layer=4, n_embd=256, vocab=65536, seed=0))
    return RWKV(model=path, strategy=ns.strategy, verbose=False)


class Counting:
    def __init__(self, model):
        self.model, self.fed = model, 0

    def forward(self, tokens, state, full_output=False):
        self.fed += len(tokens)
        return self.model.forward(tokens, state, full_output)


def run_chat(pipe, args, turns, reply_tokens, cache):
    from rwkv.cli.chat import ChatSession
    session = ChatSession(pipe, args, max_tokens=reply_tokens, cache=cache)
    rows = []
    for msg in MESSAGES[:turns]:
        fed0, t0 = pipe.model.fed, time.perf_counter()
        if cache is None:  # a stateless client: the conversation is recomputed from scratch
            session.cache.clear()
        turn = session.send(msg)
        for _ in turn:
            pass
        rows.append((len(session.last_prompt), pipe.model.fed - fed0, time.perf_counter() - t0))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--strategy", default="cpu fp32")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--reply", type=int, default=32, help="reply length in tokens")
    ns = ap.parse_args()
    from rwkv.generation import PrefixCache
    from rwkv.utils import PIPELINE, PIPELINE_ARGS
    with tempfile.TemporaryDirectory() as tmp:
        pipe = PIPELINE(Counting(_model(ns, tmp)), "rwkv_vocab_v20230424")
        args = PIPELINE_ARGS(temperature=0, token_ban=[0])
        pipe.generate("warm up", 8, args)  # first calls pick kernels and allocate; keep them out
        cached = run_chat(pipe, args, ns.turns, ns.reply, PrefixCache(max_entries=8, max_bytes=1 << 30))
        plain = run_chat(pipe, args, ns.turns, ns.reply, None)
    print(f"{'turn':>4} {'prompt':>7} | {'fed (cache)':>11} {'s':>7} | {'fed (none)':>10} {'s':>7}")
    for k, ((n, f1, t1), (_, f2, t2)) in enumerate(zip(cached, plain), 1):
        print(f"{k:>4} {n:>7} | {f1:>11} {t1:>7.3f} | {f2:>10} {t2:>7.3f}")
    print(f"total tokens fed: {sum(r[1] for r in cached)} with the cache, {sum(r[1] for r in plain)} without")


if __name__ == "__main__":
    main()
