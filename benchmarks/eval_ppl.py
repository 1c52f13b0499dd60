#!/usr/bin/env python3
"""Held-out perplexity / next-token accuracy of models/rwkv7-tiny for our package and upstream's.

    .venv/bin/python benchmarks/eval_ppl.py [--max-tokens 4000] [--max-len 256] [--json out.json]

Text: the first held-out passages of the deterministic LAMBADA split (tools/tiny_model_lib.py; never
trained on), each scored independently from a zero state as [EOT] + passage tokens (truncated to
--max-len tokens), until --max-tokens predicted tokens.  Every strategy sees exactly the same token
sequences.  Our package (`rwkv.model.RWKV`) runs in this process; upstream's (rwkv 0.8.32 from
.upstream/, RWKV_V7_ON=1, RWKV_JIT_ON=1, RWKV_CUDA_ON=0) runs in a subprocess that never sees our
repository.  Upstream v7 has no int8 strategies: those cells print "n/a".  The unigram baseline is an
add-one unigram model estimated on the training split's token stream, scored on the same targets.
Prints a markdown table for benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "models", "rwkv7-tiny", "rwkv7-tiny")  # without .pth, as upstream wants
UPSTREAM_DIR = os.path.join(REPO, ".upstream")

CPU_STRATEGIES = ["cpu fp32", "cpu bf16", "cpu fp32i8", "cpu bf16i8"]
CUDA_STRATEGIES = ["cuda fp16", "cuda fp16i8"]


def score(RWKV, strategy: str, seqs: list[list[int]], model_path: str = MODEL) -> dict:
    """Sum of -log p and correct argmax over all next-token predictions of every sequence."""
    import torch

    model = RWKV(model_path, strategy)
    nll, correct, n = 0.0, 0, 0
    t0 = time.time()
    with torch.no_grad():
        for s in seqs:
            logits, _ = model.forward(list(s[:-1]), None, full_output=True)
            logits = logits.float().cpu().reshape(len(s) - 1, -1)
            tgt = torch.tensor(s[1:])
            lp = torch.log_softmax(logits, -1).gather(-1, tgt[:, None]).squeeze(-1)
            if not torch.isfinite(lp).all():
                return dict(error="non-finite logits")
            nll -= lp.sum().item()
            correct += (logits.argmax(-1) == tgt).sum().item()
            n += len(tgt)
    dt = time.time() - t0
    return dict(ppl=math.exp(nll / n), acc=correct / n, n=n, tok_s=n / dt)


def upstream_worker(strategies: list[str], seq_file: str, model_path: str):
    """Runs in the subprocess: upstream first on sys.path, our repository absent."""
    drop = {os.path.realpath(os.path.join(REPO, d)) for d in ("", "benchmarks", "tools", "tests")}
    sys.path[:] = [UPSTREAM_DIR] + [p for p in sys.path if p and os.path.realpath(p) not in drop]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]  # pip -e finders
    from rwkv.model import RWKV

    assert os.path.abspath(sys.modules["rwkv"].__file__).startswith(UPSTREAM_DIR)
    seqs = json.load(open(seq_file))
    out = {}
    for st in strategies:
        try:
            out[st] = score(RWKV, st, seqs, model_path)
        except Exception as e:  # e.g. an i8 strategy: upstream v7 asserts
            out[st] = dict(error=f"{type(e).__name__}: {e}"[:200])
    print("RESULT" + json.dumps(out), flush=True)


def run_upstream(strategies, seq_file, model_path, threads=0) -> dict:
    env = dict(os.environ, RWKV_V7_ON="1", RWKV_JIT_ON="1", RWKV_CUDA_ON="0")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--upstream-worker", seq_file,
                        "--strategies", json.dumps(strategies), "--model", model_path,
                        "--threads", str(threads)], env=env, cwd="/tmp",
                       capture_output=True, text=True)
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT")]
    if r.returncode != 0 or not lines:
        msg = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
        return {st: dict(error=f"upstream failed: {msg[0]}") for st in strategies}
    return json.loads(lines[-1][6:])


def fmt(res: dict | None, key: str, spec: str) -> str:
    if res is None:
        return "n/a"
    if "error" in res:
        return "error"
    return format(res[key], spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL, help="checkpoint path without .pth")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--strategies", default=None, help="JSON list (default: cpu set, + cuda if present)")
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--upstream-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.upstream_worker:
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        upstream_worker(json.loads(args.strategies), args.upstream_worker, args.model)
        return

    sys.path.insert(0, REPO)
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import torch
    import tiny_model_lib as lib

    if args.threads:
        torch.set_num_threads(args.threads)

    tok = lib.load_tokenizer()
    train_p, held_p = lib.load_split()
    seqs, n = [], 0
    for p in held_p:
        s = ([lib.EOT_ID] + tok.encode(p).ids)[: args.max_len + 1]
        s = s[: args.max_tokens - n + 1]
        if len(s) < 2:
            break
        seqs.append(s)
        n += len(s) - 1
    targets = [t for s in seqs for t in s[1:]]
    uni = lib.unigram_ppl(lib.encode_passages(tok, train_p), targets, tok.get_vocab_size())
    lp = lib.unigram_logprobs(lib.encode_passages(tok, train_p), tok.get_vocab_size())
    top = int(lp.argmax())
    uni_acc = sum(1 for t in targets if t == top) / len(targets)

    if args.strategies:
        strategies = json.loads(args.strategies)
    else:
        strategies = CPU_STRATEGIES + (CUDA_STRATEGIES if torch.cuda.is_available() else [])
    print(f"held-out text: {len(seqs)} passages, {len(targets)} predicted tokens "
          f"(max {args.max_len} per passage); model {args.model}.pth", flush=True)

    from rwkv.model import RWKV

    ours = {}
    for st in strategies:
        try:
            ours[st] = score(RWKV, st, seqs, args.model)
        except Exception as e:
            ours[st] = dict(error=f"{type(e).__name__}: {e}"[:200])
        print(f"  ours     {st:12s} {ours[st]}", flush=True)

    up_strats = [s for s in strategies if "i8" not in s]  # upstream v7: fp16/bf16/fp32 only
    upstream = {}
    if not args.no_upstream and os.path.exists(os.path.join(UPSTREAM_DIR, "rwkv", "model.py")):
        seq_file = "/tmp/rwkv7_tiny_eval_seqs.json"
        json.dump(seqs, open(seq_file, "w"))
        upstream = run_upstream(up_strats, seq_file, args.model, args.threads)
        for st in up_strats:
            print(f"  upstream {st:12s} {upstream[st]}", flush=True)

    print()
    print(f"Held-out perplexity of `{os.path.relpath(args.model, REPO)}` ({len(targets)} tokens of {len(seqs)} held-out "
          f"LAMBADA passages; lower is better). Unigram baseline: perplexity {uni:.2f}, "
          f"accuracy {uni_acc:.4f}.")
    print()
    print("| strategy | ours ppl | ours acc | ours tok/s | upstream ppl | upstream acc | upstream tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for st in strategies:
        o, u = ours.get(st), upstream.get(st)
        print(f"| `{st}` | {fmt(o, 'ppl', '.3f')} | {fmt(o, 'acc', '.4f')} | {fmt(o, 'tok_s', '.0f')} | "
              f"{fmt(u, 'ppl', '.3f')} | {fmt(u, 'acc', '.4f')} | {fmt(u, 'tok_s', '.0f')} |")
    print(f"| unigram baseline | {uni:.3f} | {uni_acc:.4f} | | {uni:.3f} | {uni_acc:.4f} | |")
    if args.json:
        json.dump(dict(tokens=len(targets), passages=len(seqs), unigram_ppl=uni, unigram_acc=uni_acc,
                       ours=ours, upstream=upstream), open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
