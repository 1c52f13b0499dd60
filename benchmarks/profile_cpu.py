"""Where a CPU decode token's time goes: each op of the one-token plan, timed inside the plan.

    python benchmarks/profile_cpu.py [--size 1.5b] [--versions 4,6,7] [--strategies "cpu fp32i8"]
        [--tokens 40] [--threads 2] [--workdir DIR] [--batch B]

With --batch B, the step profiled is the batched engine's (a BatchDecoder step of B sequences,
one token each, on the in-place plan of B rows) instead of one-token ``forward``.

For each seeded random-weight checkpoint (bench_model's, written to --workdir when missing) and
strategy, the model decodes a few warm-up tokens, then --tokens more with the plan's step
profile on (StepPlan.set_profiling, csrc/cpu/step_plan.cpp: each op call's wall time,
summed per step). It prints, per op and per token: how many steps call it, its time and share of
the token, the bytes of the constant tensors its steps read (the weights and their side tensors;
not the state) and the rate they were read at, then the time between the steps (the plan's own
work and Python's: the token's wall time less the steps'), and the machine's read bandwidth
right before and after (best of 3 sums over 1 GiB in huge pages, bench_model's adjacent
reading). The rates of the products against that bandwidth say whether they stream at the
memory's limit; the other ops' time is the per-token cost that no weight format reduces.
The figures are means over the profiled tokens; run it twice to see the machine's drift.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_model import SIZES, AdjacentBandwidth, bench_checkpoint  # noqa: E402
from benchmarks.common import emit, header  # noqa: E402


def op_rows(ops: list, ns: list, weight_bytes: list, runs: int) -> list:
    """Per op name, in order of first appearance: steps per token, ms per token and weight MB per
    token, from the plan's per-step lists summed over ``runs`` tokens."""
    rows: dict = {}
    for op, t, b in zip(ops, ns, weight_bytes):
        r = rows.setdefault(op, {"op": op, "steps": 0, "ms": 0.0, "MB": 0.0})
        r["steps"] += 1
        r["ms"] += t / runs / 1e6
        r["MB"] += b / 1e6
    return list(rows.values())


def decoder(m, batch: int):
    """A function that decodes one token of every sequence (``forward``'s one-token call for
    batch 0, else a BatchDecoder step of ``batch`` sequences) and the (B, in place) key of the
    plan it runs on, after a few warm-up tokens."""
    if batch == 0:
        _, state = m.forward([1, 2, 3, 4], None)
        box = [state]

        def one(t: int) -> None:
            _, box[0] = m.forward([100 + t % 1000], box[0])
        key = (1, False)
    else:
        from rwkv.engine import BatchDecoder

        dec = BatchDecoder(m, batch)
        handles = [dec.add() for _ in range(batch)]

        def one(t: int) -> None:
            dec.step({h: 100 + (t + i) % 1000 for i, h in enumerate(handles)})
        key = (batch, True)
    for t in range(4):  # the first call builds the plan, the next ones lay out products
        one(10 + t)
    return one, key


def profile(path: Path, strategy: str, tokens: int, bandwidth: AdjacentBandwidth,
            batch: int = 0) -> dict:
    from rwkv.model import RWKV

    m = RWKV(model=str(path), strategy=strategy, verbose=False)
    one, key = decoder(m, batch)
    plans = m._rt.plans
    plan = plans.get(*key) if plans is not None else None
    if plan is None:
        why = plans.failed if plans is not None else (
            "the model has no step plans: RWKV_CPU_PLAN=0, a strategy with layers off the CPU, or no "
            "compiled kernels")
        return {"error": f"no step plan to profile ({why})"}
    bw_before = bandwidth.measure()
    plan.set_profiling(True)
    t0 = time.perf_counter()
    for t in range(tokens):
        one(t)
    wall_ms = (time.perf_counter() - t0) / tokens * 1e3
    plan.set_profiling(False)
    runs = plan.profiled_runs()
    if runs != tokens:
        raise RuntimeError(f"the plan profiled {runs} runs of the {tokens} tokens decoded")
    rows = op_rows(plan.step_ops(), plan.step_ns(), plan.step_weight_bytes(), runs)
    return {"token_ms": wall_ms, "rows": rows, "bandwidth_before_GBps": bw_before,
            "bandwidth_after_GBps": bandwidth.measure()}


def print_table(title: str, res: dict) -> None:
    print(f"\n### {title}")
    if "error" in res:
        print(res["error"])
        return
    token = res["token_ms"]
    steps = sum(r["ms"] for r in res["rows"])
    print(f"{token:.2f} ms/token; read bandwidth {res['bandwidth_before_GBps']:.1f} GB/s before, "
          f"{res['bandwidth_after_GBps']:.1f} after\n")
    print("| op | steps/token | ms/token | % of token | weight MB/token | GB/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in sorted(res["rows"], key=lambda r: -r["ms"]):
        rate = f"{r['MB'] / r['ms']:.1f}" if r["MB"] >= 10 and r["ms"] > 0 else ""
        print(f"| {r['op']} | {r['steps']} | {r['ms']:.3f} | {100 * r['ms'] / token:.1f} | "
              f"{r['MB']:.1f} | {rate} |")
    between = token - steps
    print(f"| (between steps) | | {between:.3f} | {100 * between / token:.1f} | | |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1.5b", choices=sorted(SIZES))
    p.add_argument("--versions", default="4,6,7")
    p.add_argument("--strategies", default="cpu fp32i8")
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None)
    p.add_argument("--batch", type=int, default=0,
                   help="profile the batched engine's step of this many sequences (default: one-token "
                        "forward)")
    a = p.parse_args(argv)
    if a.tokens < 1:
        p.error("--tokens must be at least 1")
    if not 0 <= a.batch <= 64:
        p.error("--batch must be 0 (one-token forward) or 1..64")
    torch.set_num_threads(a.threads)
    header("profile_cpu", size=a.size, tokens=a.tokens)
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="rwkv-profile-"))
    bandwidth = AdjacentBandwidth()
    for version in a.versions.split(","):
        path = bench_checkpoint(workdir, a.size, version)
        for strategy in (s.strip() for s in a.strategies.split(",")):
            res = profile(path, strategy, a.tokens, bandwidth, a.batch)
            emit({"kind": "profile", "size": a.size, "version": version, "strategy": strategy,
                  "batch": a.batch, **res})
            what = f", B = {a.batch}" if a.batch else ""
            print_table(f"{a.size} RWKV-{version} `{strategy}`{what}", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
