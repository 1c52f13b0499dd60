"""fp32 products of several rows on CPU: the path our prefill takes (torch's oneDNN linear,
rwkv.models.common.onednn_linear) against ``x @ W`` (what upstream runs; torch sends fp32 to its
BLAS, MKL in the x86 wheels), interleaved in one process, same inputs.

    python benchmarks/bench_gemm.py [--threads 2] [--rows 16 128 512] [--shapes 2048x2048 2048x8192 ...]
        [--rounds 12]

W is column-major [N, M] (the model's layout); oneDNN gets W.t() ([M, N], no copy). Prints one
JSON line per (shape, rows): median GFLOP/s of each and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from common import emit, header  # noqa: E402

from rwkv.models.common import onednn_linear  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="*", default=[16, 128, 512])
    p.add_argument("--shapes", nargs="*", default=["2048x2048", "2048x8192", "8192x2048"],
                   help="N x M of the weight")
    p.add_argument("--rounds", type=int, default=12)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    linear = onednn_linear()
    header("bench_gemm.py", threads=a.threads)
    if linear is None:
        print("this torch has no oneDNN: our prefill uses x @ W too; nothing to compare")
        return 0
    gen = torch.Generator().manual_seed(0)
    for shape in a.shapes:
        N, M = (int(v) for v in shape.split("x"))
        W = torch.randn(M, N, generator=gen).t()
        for T in a.rows:
            x = torch.randn(T, N, generator=gen)
            fns = {"onednn": lambda: linear(x, W.t(), None, "none", [], None), "x@W": lambda: x @ W}
            want = (x.double() @ W.double())
            for name, fn in fns.items():  # warm-up, and a sanity check of both
                err = float((fn().double() - want).abs().max())
                if err > 1e-4 * float(want.abs().max()):
                    raise SystemExit(f"{name} {shape} T={T}: max error {err:.3g}")
            rates = {k: [] for k in fns}
            for r in range(a.rounds):
                for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                    t0 = time.perf_counter()
                    fns[k]()
                    rates[k].append(2 * T * N * M / (time.perf_counter() - t0) / 1e9)
            med = {k: round(statistics.median(v), 1) for k, v in rates.items()}
            emit({"shape": shape, "rows": T, "onednn_GFLOPs": med["onednn"], "x@W_GFLOPs": med["x@W"],
                  "ratio": round(med["onednn"] / med["x@W"], 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
