"""Per-op benchmark: compiled kernel vs pure-torch reference (and torch baselines for mm8).

    python benchmarks/bench_ops.py [--ops wkv7_forward mm8_one ...] [--isa avx2] [--threads 2]
                                   [--device cpu] [--quick] [--shapes 4096x4096 4096x14336 ...]

Prints a header, then one JSON line per (op, case, impl): median ms, GB/s where meaningful (mm8:
bytes of the int8 weight + activations), and the speed-up of the compiled kernel over the
reference and, for mm8 and linear_one, over torch's own matmul. Each case is sanity-checked against the reference before it is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # common.py, and rwkv when not installed
from common import emit, gbps, header, sanity_check, timeit  # noqa: E402

from rwkv import ops  # noqa: E402
from rwkv.ops import _testing  # noqa: E402


def _rand(*shape, lo=-1.0, hi=1.0, dtype=torch.float32, device="cpu"):
    return (torch.rand(*shape, device=device) * (hi - lo) + lo).to(dtype)


def wkv_cases(op, quick):
    Ts = (1, 16) if quick else (1, 64)
    for T in Ts:
        if op == "wkv4_forward":
            C = 2048
            yield f"T={T} C={C}", lambda T=T, C=C: [
                -torch.exp(_rand(C)), _rand(C), _rand(T, C), _rand(T, C),
                _rand(C), _rand(C, lo=0.5, hi=1), _rand(C)], None, None
        else:
            H, N = 32, 64
            w_shape = (T, H * N) if op in ("wkv6_forward", "wkv7_forward") else (H, N)

            def make(T=T, H=H, N=N, w_shape=w_shape):
                S = _rand(H, N, N)
                r, k, v = (_rand(T, H * N) for _ in range(3))
                w = _rand(*w_shape, lo=0.6, hi=1)
                if op == "wkv7_forward":
                    kk = torch.nn.functional.normalize(_rand(T, H, N), dim=-1).reshape(T, H * N)
                    return [S, r, w, k, v, -kk, kk * 0.5]
                return [S, r, k, v, w, _rand(H, N)]
            yield f"T={T} H={H} N={N}", make, None, None


DEFAULT_SHAPES = [(2048, 2048), (2048, 8192), (8192, 2048)]  # (N, M) of the matrix products


def mm8_cases(op, quick, dtype, shapes):
    Ts = [0] if op in ("mm8_one", "mm8_one_i16") else ([16] if quick else [4, 16, 128])
    # mm8_one_i16 is the fast form of mm8_one: compare the two kernels.
    baseline = _mm8_one_compiled if op == "mm8_one_i16" else _mm8_torch
    for N, M in shapes:
        for T in Ts:
            def make(T=T, N=N, M=M):
                x = _rand(*((T, N) if T else (N,)), dtype=dtype)
                w = torch.randint(0, 256, (M, N), dtype=torch.uint8).t()
                return [x, w, _rand(M, dtype=dtype) * 0.1, _rand(M, lo=0, hi=0.01, dtype=dtype),
                        _rand(N, 1, dtype=dtype) * 0.1, _rand(N, 1, lo=0, hi=0.01, dtype=dtype)]
            nbytes = N * M + (max(T, 1) * (N + M)) * torch.finfo(dtype).bits // 8
            yield f"{'T=%d ' % T if T else ''}N={N} M={M} {str(dtype)[6:]}", make, nbytes, baseline


def _mm8_one_compiled(*args):
    fn = ops.resolve("mm8_one", "cpu", "compiled")
    return "mm8_one compiled", lambda: fn(*args)


def _mm8_torch(x, w, mx, rx, my, ry):
    # What the model would do without the kernel: torch's matmul on a dequantized matrix
    # (built once here, outside the timing, so this flatters torch), in w's column-major layout,
    # as the model keeps its dense weights.
    deq = torch.empty_like(w, dtype=x.dtype).copy_((w.to(x.dtype) + 0.5) * ry * rx + my + mx)
    return "torch x@dequantized", lambda: x @ deq


def linear_cases(quick, shapes):
    for N, M in shapes:
        def make(N=N, M=M):
            return [_rand(N, dtype=torch.bfloat16), _rand(M, N, dtype=torch.bfloat16).t()]
        yield f"N={N} M={M} bfloat16", make, 2 * (N * M + N + M), \
            lambda x, w: ("torch x@w", lambda: x @ w)


def bench_case(op, case, make, nbytes, baseline, device, args):
    inputs = [t.to(device) for t in make()]  # .to keeps the column-major weights' strides
    fns = {"compiled": ops.resolve(op, device, "compiled"),
           "reference": ops.resolve(op, device, "reference")}
    # Mutated state: each call gets the same state values back (copy outside the timed region
    # would distort T=1 timings, so the state simply keeps evolving; values stay bounded).
    want = fns["reference"](*[t.clone() for t in inputs])
    sanity_check(f"{op} {case}", fns["compiled"](*[t.clone() for t in inputs]), want,
                 rtol=2e-2 if want.dtype != torch.float32 else 1e-4)
    results = {}
    for impl, fn in fns.items():
        if impl == "reference" and args.skip_reference:
            continue
        t = timeit(lambda: fn(*inputs), device, repeat=args.repeat)
        results[impl] = t["median_s"]
        emit({"op": op, "case": case, "impl": impl, "median_ms": round(t["median_s"] * 1e3, 4),
              "gbps": gbps(nbytes, t["median_s"]), "n": t["n"]})
    if baseline is not None:
        label, fn = baseline(*inputs)
        t = timeit(fn, device, repeat=args.repeat)
        results[label] = t["median_s"]
        emit({"op": op, "case": case, "impl": label, "median_ms": round(t["median_s"] * 1e3, 4),
              "n": t["n"]})
    emit({"op": op, "case": case, "impl": "speedup", **{
        f"compiled_vs_{k.replace(' ', '_')}": round(v / results["compiled"], 2)
        for k, v in results.items() if k != "compiled"}})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="*", default=[o for o in ops.OPS if o != "gemm_fp16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--isa", choices=_testing.ISAS, help="force this CPU ISA")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"],
                   help="x dtypes for mm8 (float32, bfloat16, float16)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    p.add_argument("--shapes", nargs="*", help="(N, M) of the mm8 and linear_one matrices, as NxM "
                   "(default: 2048x2048 2048x8192 8192x2048; --quick: the first)")
    p.add_argument("--skip-reference", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes \
        else DEFAULT_SHAPES[:1] if args.quick else DEFAULT_SHAPES
    isa_ctx = _testing.force_cpu_isa(args.isa) if args.isa else contextlib.nullcontext()
    with isa_ctx, torch.inference_mode():
        header("bench_ops.py", device=args.device, quick=args.quick)
        for op in args.ops:
            if op.startswith("mm8"):
                cases = [c for d in args.dtypes for c in mm8_cases(op, args.quick, getattr(torch, d), shapes)]
            elif op == "linear_one":
                cases = list(linear_cases(args.quick, shapes))
            else:
                cases = list(wkv_cases(op, args.quick))
            for case, make, nbytes, baseline in cases:
                bench_case(op, case, make, nbytes, baseline, args.device, args)


if __name__ == "__main__":
    main()
