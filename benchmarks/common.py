"""Benchmark helpers: a timer with warm-up and median, a header line, one JSON line per result.

Every script prints a header first (torch/CUDA versions, device, CPU ISA, threads) and then one
JSON object per line, so results can be collected with `grep '^{'` and compared across runs.
Correctness belongs in tests/; scripts only sanity-check against the reference before timing.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from typing import Callable, Optional

import torch


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def emit(record: dict) -> None:
    print(json.dumps(record, sort_keys=False), flush=True)


def header(script: str, **extra) -> dict:
    from rwkv import ops

    info = {
        "kind": "header",
        "script": script,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu": _cpu_name(),
        "cpu_isa": ops.cpu_isa(),
        "threads": torch.get_num_threads(),
        "backend": ops.backend_report().splitlines()[0],
    }
    info.update(extra)
    emit(info)
    return info


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timeit(fn: Callable[[], object], device: str = "cpu", warmup: int = 3, repeat: int = 20,
           min_seconds: float = 0.2, max_seconds: float = 5.0) -> dict:
    """Median/min seconds per call of fn() after warm-up. Repeats at least `repeat` times and
    until `min_seconds` have passed (but stops after `max_seconds`). On CUDA a sample is 20 calls
    queued back to back and one synchronise (a single call would mostly time the launch and the
    synchronise, not the kernel)."""
    inner = 20 if str(device).startswith("cuda") else 1
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start) < min_seconds:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / inner)
        if time.perf_counter() - start > max_seconds and len(times) >= 3:
            break
    return {"median_s": statistics.median(times), "min_s": min(times), "n": len(times)}


def sanity_check(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-3,
                 atol: float = 1e-3) -> None:
    """Stops the benchmark if the implementation disagrees with the reference."""
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    if not err <= atol * scale + rtol * float(want.abs().max()):
        raise SystemExit(f"{name}: result differs from the reference (max abs error {err:.3g})")


def gbps(nbytes: Optional[int], seconds: float) -> Optional[float]:
    return None if not nbytes else round(nbytes / seconds / 1e9, 2)
