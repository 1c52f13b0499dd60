"""One-token decode on step plans: the engine's B = 1 step against a one-token ``forward`` call, and
the one-token plan with and without the grouped product ops, interleaved in ONE run.

    python benchmarks/bench_plans.py [--sizes 0.1b] [--versions 7,6]
        [--strategies "cpu fp32,cpu fp32i8"] [--tokens 41] [--threads 2] [--workdir DIR]

For each seeded random-weight checkpoint (benchmarks/bench_model.py's shapes) and strategy:

1. ``forward``, one token at a time from a state (the one-token plan, the caller's state never
   written), against one ``BatchDecoder`` step of a single sequence (the in-place plan of B = 1
   rows, the state in the engine's slot), round-robin; the median of each and their ratio.
2. Three one-token programs of the same model (rwkv/models/program.py) run the same token from the same
state, round-robin, and the median time of each is printed with its number of steps:
- ``grouped``: the plan the model uses (``linear_one_chain`` for a time mix's products and their
  low-rank second factors, ``linear_one_ffn`` for a channel mix's, ``linear_one_group``);
- ``no chain/ffn``: the chain as two ``linear_one_group`` calls, the channel mix as a group and
  a ``linear_one_residual``;
- ``separate``: every product its own ``linear_one``/``mm8_one_i16`` call.
The ratios against ``grouped`` say what folding the grouped ops into single products would cost
a token (their results are the same up to the grouping's threads: the same kernels per column).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_model import add_checkpoint_options, each_checkpoint  # noqa: E402
from benchmarks.common import emit, header  # noqa: E402


def variants(model) -> dict:
    """The three one-token plans of the model (module docstring), built from its programs."""
    from rwkv.models.common import ProjectionChain, ProjectionGroup

    rt = model._rt
    mods = rt.att + rt.ffn

    def members(kind):
        return [v for m in mods for v in vars(m).values() if isinstance(v, kind)]

    plans = {"grouped": rt.program(1, False).build()}
    saved = [(c, "op", c.op) for c in members(ProjectionChain)] + [(f, "one_op", f.one_op) for f in rt.ffn]
    for obj, name, _ in saved:
        setattr(obj, name, None)
    plans["no chain/ffn"] = rt.program(1, False).build()
    groups = [(g, "op", g.op) for g in members(ProjectionGroup)]
    for obj, name, _ in groups:
        setattr(obj, name, None)
    plans["separate"] = rt.program(1, False).build()
    for obj, name, value in saved + groups:  # the model as it was
        setattr(obj, name, value)
    return plans


def engine_b1(model, size: str, version: str, strategy: str, tokens: int) -> None:
    """Part 1 of the module docstring."""
    from rwkv.engine import BatchDecoder

    _, state = model.forward([1, 2, 3], None)
    engine = BatchDecoder(model, max_batch=8)
    h = engine.add(state=state)
    engine.step({h: 4})
    calls = {"forward": lambda: model.forward([5], list(state)), "engine B=1": lambda: engine.step({h: 5})}
    times: dict = {k: [] for k in calls}
    for _ in range(3):
        for fn in calls.values():
            fn()
    for _ in range(tokens):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    a, b = (statistics.median(times[k]) * 1e3 for k in calls)
    emit({"size": size, "version": version, "strategy": strategy, "forward_ms": a, "engine_b1_ms": b,
          "engine_over_forward": b / a})
    print(f"  {size} v{version} {strategy:<11} forward {a:8.3f} ms  engine B=1 {b:8.3f} ms  "
          f"x {b / a:.3f}", flush=True)


def bench(path: Path, size: str, version: str, strategy: str, tokens: int) -> None:
    from rwkv.model import RWKV

    model = RWKV(model=str(path), strategy=strategy, verbose=False)
    engine_b1(model, size, version, strategy, tokens)
    _, state = model.forward([1, 2, 3], None)
    plans = variants(model)
    emb = model._rt.emb
    times: dict = {k: [] for k in plans}
    for _ in range(3):  # warm-up, the products' layouts made
        for plan in plans.values():
            plan.run_row(emb, 5, list(state))
    for _ in range(tokens):
        for name, plan in plans.items():
            t0 = time.perf_counter()
            plan.run_row(emb, 5, list(state))
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["grouped"])
    for name, plan in plans.items():
        ms = statistics.median(times[name]) * 1e3
        row = {"size": size, "version": version, "strategy": strategy, "plan": name, "steps": plan.steps(),
               "token_ms": ms, "vs_grouped": ms / (base * 1e3)}
        emit(row)
        print(f"  {size} v{version} {strategy:<11} {name:<13} {plan.steps():4d} steps  {ms:8.3f} ms  "
              f"x {row['vs_grouped']:.3f} of grouped", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_options(p, "0.1b", "7,6", "cpu fp32,cpu fp32i8")
    p.add_argument("--tokens", type=int, default=41)
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    torch.set_grad_enabled(False)
    emit(header("bench_plans", threads=ns.threads))
    for size, version, strategy, path in each_checkpoint(ns):
        bench(path, size, version, strategy, ns.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
