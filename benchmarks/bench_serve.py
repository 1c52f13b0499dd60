"""Throughput and latency of ``python -m rwkv serve`` under concurrent streaming clients, against
the same requests served one at a time, in ONE run.

    python benchmarks/bench_serve.py [--requests 64] [--max-tokens 64] [--concurrency 1,8,32]
        [--strategy "cpu fp32"] [--model PATH] [--max-batch 32] [--ray --replicas 2]

Starts the server on a free loopback port (the shipped model by default), then sends the same
--requests completion requests (prompts of 1-6 sentences, sampled with a seed each, the
end-of-text token banned so every request generates --max-tokens tokens) at each concurrency in
turn. Concurrency 1 is the requests served one at a time. Per concurrency: generated tokens/s
(all completion tokens over the wall time), time to first token and inter-token latency (p50,
p99, as the streaming client sees them), and the throughput over concurrency 1's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import emit, header  # noqa: E402
from tests.serve_client import MODEL_NAME, LoadRequest, ServerProcess, mixed_requests, run_load  # noqa: E402


def pct(values: list, q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def requests(n: int, max_tokens: int) -> list:
    out = []
    for i, r in enumerate(mixed_requests(n, seed=3, hang_up_share=0.0)):
        body = {k: v for k, v in r.body.items() if k in ("prompt", "messages", "model", "stream")}
        body.update(max_tokens=max_tokens, temperature=0.8, top_p=0.9, seed=i, logit_bias={"0": -100})
        out.append(LoadRequest(body))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--strategy", default="cpu fp32")
    p.add_argument("--model", default="")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--ray", action="store_true")
    p.add_argument("--replicas", type=int, default=2)
    ns = p.parse_args(argv)
    args = ["--strategy", ns.strategy, "--max-batch", str(ns.max_batch), "--cache-mb", "0"]
    if ns.model:
        args += ["--model", ns.model, "--model-name", MODEL_NAME]
    if ns.ray:
        args += ["--ray", "--replicas", str(ns.replicas), "--replica-cpus", "0.5"]
    emit(header("bench_serve", strategy=ns.strategy, max_batch=ns.max_batch, ray=ns.ray,
                replicas=ns.replicas if ns.ray else 1))
    server = ServerProcess(*args, timeout=300)
    rows = []
    try:
        asyncio.run(run_load(server.url, requests(4, 8), concurrency=4))  # warm-up
        for c in [int(x) for x in ns.concurrency.split(",")]:
            reqs = requests(ns.requests, ns.max_tokens)
            wall = asyncio.run(run_load(server.url, reqs, concurrency=c))
            failed = sum(1 for r in reqs if r.status != 200 or r.error)
            tokens = sum(r.completion_tokens for r in reqs)
            ttft = [r.ttft for r in reqs if r.ttft is not None]
            itl = [g for r in reqs for g in r.gaps]
            row = {"concurrency": c, "requests": len(reqs), "failed": failed, "wall_s": wall,
                   "tokens_per_s": tokens / wall, "ttft_p50_s": statistics.median(ttft) if ttft else None,
                   "ttft_p99_s": pct(ttft, 0.99), "itl_p50_ms": pct(itl, 0.5) * 1e3, "itl_p99_ms": pct(itl, 0.99) * 1e3}
            rows.append(row)
            emit(row)
    finally:
        server.stop()
    base = rows[0]["tokens_per_s"] if rows and rows[0]["concurrency"] == 1 else None
    print(f"\n{'clients':>7} {'tok/s':>8} {'vs 1':>6} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7} {'failed':>6}")
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base:5.2f}x" if base else "   n/a"
        print(f"{r['concurrency']:>7} {r['tokens_per_s']:8.1f} {ratio:>6} {r['ttft_p50_s']:8.3f}s {r['ttft_p99_s']:6.3f}s "
              f"{r['itl_p50_ms']:6.1f}ms {r['itl_p99_ms']:5.1f}ms {r['failed']:>6}")
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
