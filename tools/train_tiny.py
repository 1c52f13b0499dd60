#!/usr/bin/env python3
"""Train the tiny RWKV-7 model shipped in models/rwkv7-tiny/ (CPU, one thread).

    .venv/bin/python tools/train_tiny.py                 # tokenizer + training + eval + verify
    .venv/bin/python tools/train_tiny.py --resume        # continue from the last periodic checkpoint
    .venv/bin/python tools/train_tiny.py --verify-only   # only the upstream equivalence check

Steps: (1) deterministic split of the LAMBADA passages (tools/tiny_model_lib.split_passages),
(2) byte-level BPE on the training split only (id 0 = end of text), (3) AdamW training of
``TinyRWKV7`` on random windows of the training token stream, periodic checkpoints,
(4) held-out perplexity vs a unigram baseline, (5) export to the upstream training-checkpoint layout
and a logits equivalence check against the upstream ``rwkv`` package (subprocess, ``cpu fp32``) plus a
sample generation through upstream's PIPELINE.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_model_lib as lib  # noqa: E402


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def heldout_batches(tok, held: list[str], max_len: int, batch: int):
    """Each held-out passage as [EOT] + ids (truncated to max_len+1); yields (inp, tgt, mask)."""
    seqs = []
    for p in held:
        ids = [lib.EOT_ID] + tok.encode(p).ids
        seqs.append(ids[: max_len + 1])
    for i in range(0, len(seqs), batch):
        chunk = seqs[i:i + batch]
        T = max(len(s) for s in chunk) - 1
        inp = torch.zeros(len(chunk), T, dtype=torch.long)
        tgt = torch.zeros(len(chunk), T, dtype=torch.long)
        mask = torch.zeros(len(chunk), T, dtype=torch.bool)
        for j, s in enumerate(chunk):
            n = len(s) - 1
            inp[j, :n] = torch.tensor(s[:-1])
            tgt[j, :n] = torch.tensor(s[1:])
            mask[j, :n] = True
        yield inp, tgt, mask


@torch.no_grad()
def evaluate(model, tok, held, max_len=512, batch=16):
    model.eval()
    nll, n, correct = 0.0, 0, 0
    targets = []
    for inp, tgt, mask in heldout_batches(tok, held, max_len, batch):
        logits, _ = model(inp)
        lp = F.log_softmax(logits.float(), -1)
        tok_lp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        nll -= tok_lp[mask].sum().item()
        correct += (logits.argmax(-1) == tgt)[mask].sum().item()
        n += mask.sum().item()
        targets.extend(tgt[mask].tolist())
    model.train()
    return math.exp(nll / n), correct / n, n, targets


def run_upstream(code: str, *args: str) -> str:
    """Run code with the isolated upstream package (never our repo) on sys.path."""
    env = dict(os.environ, RWKV_V7_ON="1", RWKV_JIT_ON="1", RWKV_CUDA_ON="0")
    env.pop("PYTHONPATH", None)
    pre = ("import os, sys\ndrop = {os.path.realpath(os.path.join(%r, d)) for d in ('', 'tools', 'tests')}\n"
           "sys.path[:] = [%r] + [p for p in sys.path if p and os.path.realpath(p) not in drop]\n"
           "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
           % (lib.REPO, os.path.join(lib.REPO, ".upstream")))
    r = subprocess.run([sys.executable, "-c", pre + code, *args], env=env, cwd="/tmp",
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("upstream subprocess failed:\n" + r.stdout + r.stderr)
    return r.stdout


UPSTREAM_LOGITS = r"""
import json, torch
from rwkv.model import RWKV
assert os.path.realpath(sys.modules["rwkv"].__file__).startswith(os.path.realpath(sys.path[0]))
m = RWKV(sys.argv[1], "cpu fp32")
toks = json.load(open(sys.argv[2]))
out, _ = m.forward(toks, None, full_output=True)
torch.save(out.float(), sys.argv[3])
"""

UPSTREAM_SAMPLE = r"""
import json, numpy as np
from rwkv.model import RWKV
from rwkv.utils import PIPELINE, PIPELINE_ARGS
m = RWKV(sys.argv[1], "cpu fp32")
p = PIPELINE(m, sys.argv[2])
prompt = sys.argv[3]
greedy = p.generate(prompt, token_count=60, args=PIPELINE_ARGS(temperature=1.0, top_p=0.0,
                    alpha_frequency=0.25, alpha_presence=0.25, token_stop=[0]))
np.random.seed(0)
topp = p.generate(prompt, token_count=60, args=PIPELINE_ARGS(temperature=1.0, top_p=0.7,
                  token_stop=[0]))
print("JSON" + json.dumps({"greedy": greedy, "top_p": topp}))
"""


def verify_upstream(model_path: str, tok, held, n_tokens=96):
    """Upstream cpu fp32 logits == TinyRWKV7 fp32 logits on held-out tokens (from the saved file)."""
    sd = torch.load(model_path, map_location="cpu", weights_only=True)
    model = lib.TinyRWKV7.from_state_dict(sd).eval()
    toks = [lib.EOT_ID] + tok.encode(held[0] + "\n\n" + held[1]).ids
    toks = toks[:n_tokens]
    os.makedirs("/tmp/rwkv7-tiny-train", exist_ok=True)
    tp, op = "/tmp/rwkv7-tiny-train/verify_toks.json", "/tmp/rwkv7-tiny-train/verify_up.pt"
    json.dump(toks, open(tp, "w"))
    run_upstream(UPSTREAM_LOGITS, model_path[:-4], tp, op)
    up = torch.load(op)
    with torch.no_grad():
        ours = model(torch.tensor([toks]))[0][0]
    abs_err = (up - ours).abs().max().item()
    rel = abs_err / ours.abs().max().item()
    agree = (up.argmax(-1) == ours.argmax(-1)).float().mean().item()
    return dict(tokens=len(toks), max_abs_diff=abs_err, max_rel_diff=rel, argmax_agreement=agree)


def sample_upstream(model_path: str, tok_path: str, prompt: str):
    out = run_upstream(UPSTREAM_SAMPLE, model_path[:-4], tok_path, prompt)
    line = [l for l in out.splitlines() if l.startswith("JSON")][-1]
    return json.loads(line[4:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--n_embd", type=int, default=256)
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--head_size", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr_final", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max_minutes", type=float, default=42.0, help="stop early (and still save) after this")
    ap.add_argument("--ckpt_every", type=int, default=100)
    ap.add_argument("--eval_every", type=int, default=200)
    ap.add_argument("--work_dir", default="/tmp/rwkv7-tiny-train")
    ap.add_argument("--out_dir", default=lib.MODEL_DIR)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="storage dtype of the .pth")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--verify-only", dest="verify_only", action="store_true")
    ap.add_argument("--prompt", default="\"I don't know,\" she said. \"")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.work_dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    tok_path = os.path.join(args.out_dir, "tokenizer.json")
    model_path = os.path.join(args.out_dir, "rwkv7-tiny.pth")

    train_p, held_p = lib.load_split()
    log(f"passages: {len(train_p)} train, {len(held_p)} held out (seed {lib.SPLIT_SEED})")

    if args.verify_only:
        tok = lib.load_tokenizer(tok_path)
        log(f"upstream equivalence: {verify_upstream(model_path, tok, held_p)}")
        log(f"samples: {json.dumps(sample_upstream(model_path, tok_path, args.prompt))}")
        return

    if args.resume and os.path.exists(tok_path):
        tok = lib.load_tokenizer(tok_path)
    else:
        tok = lib.train_tokenizer(train_p, args.vocab, tok_path)
    V = tok.get_vocab_size()
    train_ids = torch.tensor(lib.encode_passages(tok, train_p), dtype=torch.long)
    log(f"tokenizer: vocab {V}; training stream {len(train_ids)} tokens")

    model = lib.TinyRWKV7(V, args.n_embd, args.n_layer, args.head_size)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: n_embd {args.n_embd}, n_layer {args.n_layer}, head_size {args.head_size}, "
        f"{n_params / 1e6:.2f} M params")
    opt = torch.optim.AdamW(lib.param_groups(model, args.wd), lr=args.lr, betas=(0.9, 0.99), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    step, tokens_seen, train_time = 0, 0, 0.0
    t_start = time.time()
    state_path = os.path.join(args.work_dir, "train_state.pt")
    if args.resume and os.path.exists(state_path):
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, tokens_seen, train_time = st["step"], st["tokens_seen"], st["train_time"]
        log(f"resumed at step {step}")
    t_start = time.time()

    def elapsed():
        return train_time + (time.time() - t_start)

    def lr_at(s):
        # cosine decay over the steps -- or over the time budget if that runs out first, so the
        # schedule always finishes annealed even on a slower (shared) machine
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        prog = min(1.0, max((s - args.warmup) / max(1, args.steps - args.warmup),
                            elapsed() / (args.max_minutes * 60)))
        return args.lr_final + 0.5 * (args.lr - args.lr_final) * (1 + math.cos(math.pi * prog))

    def save(final=False):
        torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), gen=gen.get_state(), step=step,
                        tokens_seen=tokens_seen, train_time=train_time, args=vars(args)),
                   state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)
        dt = torch.float32 if args.dtype == "fp32" else torch.bfloat16
        torch.save(model.export_state_dict(dt), model_path + ".tmp")
        os.replace(model_path + ".tmp", model_path)
        json.dump(dict(config=model.config, step=step, tokens_seen=tokens_seen,
                       train_time_s=round(train_time, 1), final=final, args=vars(args)),
                  open(os.path.join(args.work_dir, "progress.json"), "w"), indent=1)

    model.train()
    t_win, tok_win, loss_win = time.time(), 0, []
    T, B = args.ctx, args.batch
    while step < args.steps:
        if elapsed() > args.max_minutes * 60:
            log(f"time limit reached at step {step}")
            break
        starts = torch.randint(0, len(train_ids) - T - 1, (B,), generator=gen)
        chunk = torch.stack([train_ids[s:s + T + 1] for s in starts.tolist()])
        inp, tgt = chunk[:, :-1], chunk[:, 1:]
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        logits, _ = model(inp)
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += B * T
        tok_win += B * T
        loss_win.append(loss.item())
        if step % 10 == 0:
            dt = time.time() - t_win
            log(f"step {step}/{args.steps} loss {sum(loss_win) / len(loss_win):.4f} lr {lr_at(step):.2e} "
                f"{tok_win / dt:.0f} tok/s tokens {tokens_seen}")
            t_win, tok_win, loss_win = time.time(), 0, []
        if step % args.ckpt_every == 0:
            train_time += time.time() - t_start
            t_start = time.time()
            save()
            log(f"checkpoint saved (step {step}, {train_time / 60:.1f} min of training)")
        if step % args.eval_every == 0 and step < args.steps:
            ppl, acc, n, _ = evaluate(model, tok, held_p[:64], max_len=256)
            log(f"held-out (64 passages) ppl {ppl:.2f} acc {acc:.3f}")
            t_win = time.time()
    train_time += time.time() - t_start
    save(final=True)
    log(f"training done: {step} steps, {tokens_seen} tokens, {train_time / 60:.1f} min, "
        f"{args.threads} thread(s)")

    ppl, acc, n, targets = evaluate(model, tok, held_p, max_len=4096)
    uni = lib.unigram_ppl(train_ids.tolist(), targets, V)
    log(f"held-out: {n} tokens, perplexity {ppl:.2f}, next-token accuracy {acc:.4f}; "
        f"unigram baseline perplexity {uni:.2f}")
    size = os.path.getsize(model_path)
    log(f"saved {model_path} ({size / 1e6:.2f} MB, {args.dtype})")
    res = dict(heldout_tokens=n, heldout_ppl=ppl, heldout_acc=acc, unigram_ppl=uni, steps=step,
               tokens_seen=tokens_seen, train_minutes=train_time / 60, params=n_params, file_bytes=size)
    try:
        res["upstream_check"] = verify_upstream(model_path, tok, held_p)
        log(f"upstream equivalence: {res['upstream_check']}")
        res["samples"] = sample_upstream(model_path, tok_path, args.prompt)
        log(f"samples: {json.dumps(res['samples'])}")
    except Exception as e:  # keep the trained model even if upstream is missing
        log(f"upstream check failed: {e}")
    json.dump(res, open(os.path.join(args.work_dir, "result.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
