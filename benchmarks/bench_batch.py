"""Aggregate decode throughput of the batched engine against single-sequence decoding, in ONE run.

    python benchmarks/bench_batch.py [--sizes 0.1b,1.5b] [--versions 7,6]
        [--strategies "cpu fp32,cpu bf16,cpu fp32i8"] [--batches 1,2,4,8,16,32,64]
        [--steps 5] [--threads 2] [--workdir DIR]

For each seeded random-weight checkpoint (benchmarks/bench_model.py's shapes) and strategy, and
each batch size B: B sequences in a ``BatchDecoder`` advance one token per step, together; the
row gives the median step time and the aggregate tokens/s (B / step). Beside it, in the same run
and right before the row, the same model decodes single-sequence ``forward`` calls one token at
a time (the upstream-style loop, the one-token fast path): B sequential calls give B tokens in B
times one call's time, so their tokens/s is 1 / (median call time) whatever B is.

Each row also shows its floors, measured in the same run:
- bandwidth floor: the bytes a step must read (every weight once, the embedding's B rows, and the
  B states read and written) over the read bandwidth measured right before the row (the best of
  3 sums over 1 GiB in huge pages);
- compute floor: the step's multiply-adds (2 * B * N * M over every matrix) at the rate torch's
  own GEMM reaches in that run for the strategy's activation dtype on a compute-bound product of
  the model's width ([256, C] @ [C, 4C]; fp32 through oneDNN, as the model's prefill; int8
  strategies at the fp32 rate);
and ``x floor``: the step time over the larger floor. For fp32 and bf16 weights on CPU the row
also shows torch's own GEMMs on the step's products alone (B rows times every matrix, read from
memory as a step reads them: oneDNN's linear for fp32), timed in the same run, and the step over
that time: what the best general library does with the same products on this machine.

The last lines compare B = 8 with B = 1 (aggregate tokens/s), per model and strategy.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_model import AdjacentBandwidth, add_checkpoint_options, each_checkpoint  # noqa: E402
from benchmarks.common import emit, header  # noqa: E402


def weight_bytes(model) -> int:
    """Bytes of weights one step reads (the embedding excluded: rows, counted per sequence)."""
    return sum(t.numel() * t.element_size() for k, t in model.w.items() if k != "emb.weight")


def state_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.generate_zero_state())


def matrix_shapes(model) -> list:
    """(N, M) of every matrix product of one token (2-D weights; row slabs counted whole)."""
    shapes = []
    for k, t in model.w.items():
        if k == "emb.weight" or t.dim() < 2 or k.endswith(("_mx", "_rx", "_my", "_ry")):
            continue
        if t.dim() == 3 and "time_maa_w2" not in k:  # row slabs [S, N/S, M]
            shapes.append((t.shape[0] * t.shape[1], t.shape[2]))
        elif t.dim() == 3:  # RWKV-6's maa_w2 [5, D, C]: five [D, C] products
            shapes += [(t.shape[1], t.shape[2])] * t.shape[0]
        else:
            shapes.append((t.shape[0], t.shape[1]))
    return shapes


def gemm_rate(dtype: torch.dtype, C: int, device: str = "cpu") -> float:
    """Multiply-adds x2 per second of torch's GEMM on [256, C] @ [C, 4C] in dtype (best of 5): on
    CPU for fp32 oneDNN's linear, the GEMM the model's fp32 prefill runs (MKL's sgemm is slower
    on some CPUs), else ``a @ w``."""
    from rwkv.models.common import onednn_linear

    a = torch.randn(256, C).to(dtype=dtype, device=device)
    w = torch.randn(4 * C, C).to(dtype=dtype, device=device)  # [M, N], as oneDNN takes it
    linear = onednn_linear() if device == "cpu" and dtype == torch.float32 else None
    gemm = (lambda: linear(a, w, None, "none", [], None)) if linear is not None else (lambda: a @ w.t())
    gemm()
    best = float("inf")
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        gemm()
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * 256 * C * 4 * C / best


def step_matrices(model) -> list:
    """Every matrix one step multiplies, as the model stores it (row slabs and RWKV-6's maa_w2 as
    their parts), for fp32 and bf16 weights; [] for int8 weights (torch has no GEMM for them)."""
    if any(t.dtype == torch.uint8 and t.dim() >= 2 for t in model.w.values()):
        return []
    mats = []
    for k, t in model.w.items():
        if k != "emb.weight" and t.dim() >= 2 and t.dtype in (torch.float32, torch.bfloat16):
            mats += list(t.unbind(0)) if t.dim() == 3 else [t]
    return mats


def torch_products_time(mats: list, B: int, repeat: int = 3) -> float | None:
    """Median seconds of torch's own GEMMs on one step's products: B rows times every matrix of
    ``mats`` (step_matrices), one after another, the weights read from memory as a step reads
    them (fp32 column-major: oneDNN's linear, the fastest fp32 GEMM torch has on CPU; otherwise
    ``x @ W``); None without matrices."""
    from rwkv.models.common import onednn_linear

    if not mats:
        return None
    linear = onednn_linear()
    xs = {}
    calls = []
    for w in mats:
        key = (w.shape[0], w.dtype)
        x = xs.setdefault(key, torch.randn(B, w.shape[0]).to(w.dtype))
        if linear is not None and w.dtype == torch.float32 and w.t().is_contiguous():
            calls.append(lambda x=x, w=w: linear(x, w.t(), None, "none", [], None))
        else:
            calls.append(lambda x=x, w=w: x @ w)
    times = []
    for _ in range(repeat + 1):  # the first pass lets oneDNN make its kernels
        t0 = time.perf_counter()
        for call in calls:
            call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def sync() -> None:
    """Wait for the GPU's queued work (a step's time then includes its kernels)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_single(model, calls: int) -> float:
    """Median seconds of one single-sequence one-token forward (after 3 warm-up tokens)."""
    V = model.args.vocab_size
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(0, V, (calls + 3,), generator=g).tolist()
    _, st = model.forward([toks[0]], None)
    for t in toks[1:3]:
        _, st = model.forward([t], st)
    times = []
    sync()
    for t in toks[3:]:
        t0 = time.perf_counter()
        _, st = model.forward([t], st)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_batch(model, B: int, steps: int) -> float:
    """Median seconds of one BatchDecoder step over B sequences (after 2 warm-up steps)."""
    from rwkv.engine import BatchDecoder

    V = model.args.vocab_size
    eng = BatchDecoder(model, B)
    handles = [eng.add(state=None) for _ in range(B)]
    g = torch.Generator().manual_seed(B)
    times = []
    for i in range(steps + 2):
        feed = dict(zip(handles, torch.randint(0, V, (B,), generator=g).tolist()))
        sync()
        t0 = time.perf_counter()
        eng.step(feed)
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(path: Path, size: str, version: str, strategy: str, batches: list, steps: int, bw: AdjacentBandwidth,
          rows: list) -> None:
    from rwkv.model import RWKV

    model = RWKV(str(path), strategy, verbose=False)
    C = model.args.n_embd
    act = torch.bfloat16 if "bf16" in strategy else torch.float16 if "fp16" in strategy else torch.float32
    rate = gemm_rate(act, C, "cuda" if strategy.startswith("cuda") else "cpu")
    shapes = matrix_shapes(model)
    mats = step_matrices(model) if not strategy.startswith("cuda") else []
    wbytes, sbytes = weight_bytes(model), state_bytes(model)
    emb_row = C * model.w["emb.weight"].element_size()
    for B in batches:
        single = time_single(model, max(4, min(B, 8)))
        gbps = bw.measure()
        step = time_batch(model, B, steps)
        bw_floor = (wbytes + B * (emb_row + 2 * sbytes)) / (gbps * 1e9)
        compute_floor = sum(2 * B * n * m for n, m in shapes) / rate
        gemms = torch_products_time(mats, B)
        row = {"size": size, "version": version, "strategy": strategy, "B": B, "step_ms": step * 1e3,
               "batch_tps": B / step, "sequential_tps": 1 / single, "speedup": single * B / step,
               "bw_floor_ms": bw_floor * 1e3, "compute_floor_ms": compute_floor * 1e3,
               "x_floor": step / max(bw_floor, compute_floor), "read_GBps": gbps, "gemm_GFLOPs": rate / 1e9,
               "torch_products_ms": None if gemms is None else gemms * 1e3,
               "x_torch": None if gemms is None else step / gemms}
        rows.append(row)
        emit(row)
        vs_torch = "" if gemms is None else \
            f"  torch's products {gemms * 1e3:7.1f} ms (step x{step / gemms:.2f})"
        print(f"  {size} v{version} {strategy:<11} B={B:<3} step {step * 1e3:8.1f} ms  batch {B / step:8.1f} tok/s  "
              f"sequential {1 / single:7.1f} tok/s  x{single * B / step:5.2f}  floors bw {bw_floor * 1e3:7.1f} "
              f"compute {compute_floor * 1e3:7.1f} ms  step/floor {row['x_floor']:.2f}{vs_torch}", flush=True)
    del model
    gc.collect()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_options(p, "0.1b,1.5b", "7,6", "cpu fp32,cpu bf16,cpu fp32i8")
    p.add_argument("--batches", default="1,2,4,8,16,32,64")
    p.add_argument("--steps", type=int, default=5)
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    torch.set_grad_enabled(False)
    batches = [int(b) for b in ns.batches.split(",")]
    emit(header("bench_batch", threads=ns.threads))
    bw = AdjacentBandwidth()
    rows: list = []
    for size, version, strategy, path in each_checkpoint(ns):
        bench(path, size, version, strategy, batches, ns.steps, bw, rows)
    print("\nB = 8 against B = 1 (aggregate tokens/s):")
    for key in dict.fromkeys((r["size"], r["version"], r["strategy"]) for r in rows):
        by_b = {r["B"]: r for r in rows if (r["size"], r["version"], r["strategy"]) == key}
        if 1 in by_b and 8 in by_b:
            print(f"  {key[0]} v{key[1]} {key[2]:<11} {by_b[8]['batch_tps'] / by_b[1]['batch_tps']:.2f}x")
    worst = max(rows, key=lambda r: r["x_floor"]) if rows else None
    if worst:
        print(f"largest step/floor: {worst['x_floor']:.2f} ({worst['size']} v{worst['version']} "
              f"{worst['strategy']} B={worst['B']})")
        within = sum(r["x_floor"] <= 1.5 for r in rows)
        print(f"rows within 1.5x of the larger floor: {within} of {len(rows)}")
    timed = [r for r in rows if r["torch_products_ms"] is not None]
    if timed:
        ok = sum(r["step_ms"] <= 1.5 * max(r["bw_floor_ms"], r["torch_products_ms"]) for r in timed)
        print(f"rows within 1.5x of the larger of the bandwidth floor and torch's products: {ok} of "
              f"{len(timed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
