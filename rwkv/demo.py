"""The main job: generate text with the small trained model that ships in the repository.

    python -m rwkv.demo [--prompt TEXT] [--tokens N] [--strategy "cpu fp32"] [--seed S]

Uses ``models/rwkv7-tiny/`` (found next to the package in a source checkout, or given with
--model/--tokenizer). If no shipped model is present, it says so and generates from a seeded
random-weight checkpoint instead (noise, but it exercises the whole path).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "models" / "rwkv7-tiny"
DEFAULT_PROMPT = "The old man looked at the sea and said"


def _random_checkpoint(tmp: str) -> str:
    sys.path.insert(0, str(REPO))
    from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

    return str(save_checkpoint(Path(tmp) / "random-v7.pth", make_checkpoint("7", n_layer=2, n_embd=128,
                                                                          vocab=65536, seed=0)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rwkv.demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(SHIPPED / "rwkv7-tiny.pth"))
    p.add_argument("--tokenizer", default=str(SHIPPED / "tokenizer.json"),
                   help="tokenizers JSON file, or rwkv_vocab_v20230424 for the World vocabulary")
    p.add_argument("--strategy", default="cpu fp32")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--tokens", type=int, default=120)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top_p", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from rwkv import ops
    from rwkv.model import RWKV
    from rwkv.utils import PIPELINE, PIPELINE_ARGS

    tmp = None
    if not os.path.exists(a.model):
        tmp = tempfile.mkdtemp(prefix="rwkv-demo-")
        print(f"No shipped model at {a.model}: using a seeded RANDOM-weight RWKV-7 checkpoint instead "
              "(its output is noise).")
        a.model, a.tokenizer = _random_checkpoint(tmp), "rwkv_vocab_v20230424"
    print(f"rwkv demo: model {a.model}, strategy {a.strategy!r}, kernels {ops.backend_report().splitlines()[0]}")
    t0 = time.perf_counter()
    model = RWKV(model=a.model, strategy=a.strategy, verbose=False)
    pipeline = PIPELINE(model, a.tokenizer)
    print(f"loaded v{model.version} ({model.args.n_layer} layers, n_embd {model.args.n_embd}) in "
          f"{time.perf_counter() - t0:.2f}s\n")
    args = PIPELINE_ARGS(temperature=a.temperature, top_p=a.top_p, alpha_frequency=0.25,
                         alpha_presence=0.25, token_ban=[0])
    print(a.prompt, end="", flush=True)
    t0 = time.perf_counter()
    n = 0
    stream = pipeline.generate_stream(a.prompt, token_count=a.tokens, args=args, generator=a.seed)
    for piece in stream:
        print(piece, end="", flush=True)
    n = len(stream.result.tokens)
    dt = time.perf_counter() - t0
    print(f"\n\n[{n} tokens in {dt:.2f}s, {n / max(dt, 1e-9):.1f} tokens/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
