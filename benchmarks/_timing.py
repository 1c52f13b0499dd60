"""The decode/prefill measurement of bench_model.py, shared by both sides: ours (in bench_model's
process) and upstream's (in _upstream_bench.py's child process, which must not import our package
and loads this file by path). One definition, so both packages are timed exactly the same way.
Imports nothing but torch and time."""

import time

import torch


def time_model(m, vocab: int, prefill: int, decode: int) -> dict:
    """``m``: an RWKV model (either package). Prefill: one forward of ``prefill`` seeded random
    tokens after a 16-token warm-up. Decode: median of ``decode`` single-token forwards after 3
    warm-up tokens. Returns {"decode_ms", "prefill_tps"}."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (prefill,), generator=g).tolist()
    m.forward(prompt[:16], None)  # warm-up
    t0 = time.perf_counter()
    _, state = m.forward(prompt, None)
    prefill_s = time.perf_counter() - t0
    for t in prompt[:3]:
        _, state = m.forward([t], state)
    times = []
    for t in prompt[:decode]:
        t0 = time.perf_counter()
        _, state = m.forward([t], state)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"decode_ms": 1000 * times[len(times) // 2], "prefill_tps": prefill / prefill_s}
