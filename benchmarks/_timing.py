"""The decode/prefill measurement of bench_model.py, shared by both sides: ours (in bench_model's
process) and upstream's (in _upstream_bench.py's child process, which must not import our package
and loads this file by path). One definition, so both packages are timed exactly the same way.
Imports nothing but torch and time."""

import time

import torch


def _prompt(vocab: int, prefill: int) -> list:
    """The seeded random prompt both sides take: ``prefill`` tokens, at least 16."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (max(prefill, 16),), generator=g).tolist()


def _decode_figures(times: list) -> dict:
    """Decode tokens' times (s) -> "decode_ms" (the median), and the spread: "decode_ms_min" and
    "decode_ms_p90" (a row slowed by bursts of other load has a long upper tail, one slowed
    throughout, e.g. by its memory's placement, a high minimum)."""
    times = sorted(times)
    return {"decode_ms": 1000 * times[len(times) // 2], "decode_ms_min": 1000 * times[0],
            "decode_ms_p90": 1000 * times[(9 * len(times)) // 10]}


def time_models(models: dict, vocab: int, prefill: int, decode: int, rounds: int = 1,
                probe=None, cpu_probe=None) -> dict:
    """``models``: name -> an RWKV model (either package). Per model, prefill: one forward of
    ``prefill`` seeded random tokens after a 16-token warm-up, then 3 warm-up tokens. Decode: the
    median of at least ``decode`` single-token forwards, taken in ``rounds`` rounds; in each round
    every model in turn decodes one untimed token, then its share of the timed ones. With several
    models and rounds the models are thus timed interleaved, under the same conditions of a machine
    whose memory bandwidth drifts from minute to minute. ``probe``: an optional callable returning
    the machine's read bandwidth now (GB/s), called before each model's share of each round (before
    its untimed token, which brings the caches back); "probe_GBps" is the median of a model's
    readings, the bandwidth at the moments it decoded; ``cpu_probe`` likewise for the CPU's speed
    ("cpu_probe": the median of its readings). Returns name -> {"decode_ms",
    "decode_ms_min", "decode_ms_p90", "prefill_tps"[, "probe_GBps"][, "cpu_probe"]}."""
    prompt = _prompt(vocab, prefill)
    per_round = -(-decode // rounds)
    states, out = {}, {}
    for name, m in models.items():
        m.forward(prompt[:16], None)  # warm-up
        t0 = time.perf_counter()
        _, state = m.forward(prompt[:prefill], None)
        out[name] = {"prefill_tps": prefill / (time.perf_counter() - t0), "times": [], "probes": [],
                     "cpu_probes": []}
        for t in prompt[:3]:
            _, state = m.forward([t], state)
        states[name] = state
    for r in range(rounds):
        for name, m in models.items():
            if probe is not None:
                out[name]["probes"].append(probe())
            if cpu_probe is not None:
                out[name]["cpu_probes"].append(cpu_probe())
            _, state = m.forward([prompt[r % len(prompt)]], states[name])  # untimed: the switch
            for i in range(per_round):
                t0 = time.perf_counter()
                _, state = m.forward([prompt[(r * per_round + i) % len(prompt)]], state)
                out[name]["times"].append(time.perf_counter() - t0)
            states[name] = state
    for res in out.values():
        res.update(_decode_figures(res.pop("times")))
        for key, name in (("probes", "probe_GBps"), ("cpu_probes", "cpu_probe")):
            readings = sorted(res.pop(key))
            if readings:
                res[name] = readings[len(readings) // 2]
    return out


def time_model(m, vocab: int, prefill: int, decode: int, progress=None) -> dict:
    """One model (upstream's, in _upstream_bench.py's child): the warm-up forwards and the timed
    ones of ``time_models`` in one round (the same tokens), but the decode tokens come BEFORE the
    prefill forward, starting from the 16-token warm-up's state. An RWKV's single-token cost does not
    depend on how many tokens came before (its state has a fixed size), so the figures are the
    same; the order only matters when the parent stops a child that runs past its time limit
    (bench_model.py --upstream-timeout): upstream's slowest rows are slow in the prefill, and
    the decode figure is then already in. ``progress(event, **fields)``, when given, is told
    "decode" (decode_ms, once the decode tokens are timed) and "prefill_start". Returns
    {"decode_ms", "decode_ms_min", "decode_ms_p90", "prefill_tps"}."""
    prompt = _prompt(vocab, prefill)
    report = progress or (lambda event, **fields: None)
    _, state = m.forward(prompt[:16], None)  # warm-up
    for t in prompt[:3]:
        _, state = m.forward([t], state)
    times = []
    for i in range(decode):
        t0 = time.perf_counter()
        _, state = m.forward([prompt[i % len(prompt)]], state)
        times.append(time.perf_counter() - t0)
    out = _decode_figures(times)
    report("decode", decode_ms=out["decode_ms"])
    report("prefill_start")
    t0 = time.perf_counter()
    m.forward(prompt[:prefill], None)
    out["prefill_tps"] = prefill / (time.perf_counter() - t0)
    return out
