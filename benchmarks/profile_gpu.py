"""Where a CUDA decode token's time goes, ours and upstream's, on one random checkpoint.

    python benchmarks/profile_gpu.py [--size 0.4b] [--version 7] [--strategies "cuda fp16,cuda fp16i8"]
        [--upstream DIR | --no-upstream] [--python-profile] [--rows 12]

For each strategy, ours eager and with CUDA graphs (``cuda_graph=True``): ms per token with a
synchronise after every token and without (the latter shows how far the host runs ahead of the
GPU), then a torch-profiler pass over 3 tokens: kernels launched per token, kernel time per token,
and the top ops by GPU time and by host time. ``--python-profile`` adds a cProfile of ours eager
(where the host time goes in Python). Upstream (``cuda fp16``, ``RWKV_CUDA_ON=1``, in a
subprocess that never sees our package) gets the same timings and profile. Exits 0 with a message
without a GPU. Used for the "GPU: H200" section of RESULTS.md; gpu_check.sh does not run it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def decode_ms(m, n: int = 20, sync_each: bool = True) -> tuple:
    """(ms per one-token call over n calls after warm-up, the state after them)."""
    toks = list(range(100, 100 + n + 8))
    _, st = m.forward(toks[:4], None)
    for t in toks[:4]:
        _, st = m.forward([t], st)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for t in toks[8:8 + n]:
        _, st = m.forward([t], st)
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / n, st


def python_profile(m, st, n: int = 5) -> None:
    pr = cProfile.Profile()
    pr.enable()
    for t in range(200, 200 + n):
        _, st = m.forward([t], st)
    torch.cuda.synchronize()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(20)
    print("\n".join(out.getvalue().splitlines()[:45]))


def kernel_profile(m, st, label: str, rows: int, n: int = 3) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for t in range(300, 300 + n):
            _, st = m.forward([t], st)
        torch.cuda.synchronize()
    ka = p.key_averages()
    kernels = [e for e in ka if e.device_type == torch.autograd.DeviceType.CUDA]
    count = sum(e.count for e in kernels) / n
    busy = sum(e.self_device_time_total for e in kernels) / n / 1000
    print(f"[{label}] kernels per token {count:.0f}, kernel time per token {busy:.3f} ms")
    print(ka.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def upstream_child(path: str, upstream: str, rows: int) -> None:
    """Runs in `python -I` with upstream's folder first on sys.path."""
    sys.path.insert(0, upstream)
    from rwkv.model import RWKV  # upstream's

    m = RWKV(path[:-4], "cuda fp16")  # its v7 class appends .pth
    ms, st = decode_ms(m)
    ms_free, st = decode_ms(m, sync_each=False)
    print(f"UPSTREAM cuda fp16: {ms:.3f} ms/token synchronised, {ms_free:.3f} without")
    kernel_profile(m, st, "upstream cuda fp16", rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="0.4b")
    p.add_argument("--version", default="7")
    p.add_argument("--strategies", default="cuda fp16,cuda fp16i8")
    p.add_argument("--upstream", default="/tmp/upstream",
                   help="folder holding upstream's rwkv package (default /tmp/upstream)")
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument("--python-profile", action="store_true")
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # internal: path, upstream dir
    a = p.parse_args(argv)
    if a.child:
        upstream_child(a.child[0], a.child[1], a.rows)
        return 0
    if not torch.cuda.is_available():
        print(f"profile_gpu: no CUDA GPU here (torch {torch.__version__}); nothing to profile")
        return 0
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_gpu import make_bench_checkpoint
    from rwkv.model import RWKV

    path = Path(tempfile.mkdtemp(prefix="rwkv-profile-")) / f"profile-{a.size}-v{a.version}.pth"
    make_bench_checkpoint(path, a.version, a.size)
    for strategy in (s.strip() for s in a.strategies.split(",")):
        for graph in (False, True):
            label = f"ours {strategy} {'graph' if graph else 'eager'}"
            m = RWKV(str(path), strategy, verbose=False, cuda_graph=graph)
            ms, st = decode_ms(m)
            ms_free, st = decode_ms(m, sync_each=False)
            print(f"{label}: {ms:.3f} ms/token synchronised, {ms_free:.3f} without", flush=True)
            if a.python_profile and not graph and strategy == "cuda fp16":
                python_profile(m, st)
            kernel_profile(m, st, label, a.rows)
            del m
            torch.cuda.empty_cache()
    if not a.no_upstream and a.version == "7" and (Path(a.upstream) / "rwkv" / "model.py").exists():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(RWKV_JIT_ON="1", RWKV_CUDA_ON="1", RWKV_V7_ON="1")
        r = subprocess.run([sys.executable, "-I", str(Path(__file__).resolve()), "--rows", str(a.rows),
                            "--child", str(path), str(Path(a.upstream).resolve())],
                           capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(),
                           timeout=600)
        print(r.stdout[-20000:] or r.stderr[-3000:])
    path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
