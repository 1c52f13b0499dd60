"""Decode and prefill speed of whole models, ours against the upstream package, in ONE run.

    python benchmarks/bench_model.py [--sizes 0.1b,1.5b] [--versions 4,6,7]
        [--strategies "cpu fp32,cpu bf16,cpu fp32i8,cpu bf16i8"] [--decode 50] [--prefill 512]
        [--threads 2] [--no-upstream] [--upstream-timeout SECONDS] [--v7-lora fixture|released]

For each seeded random-weight checkpoint (shapes like RWKV 0.1B and 1.5B) and strategy it measures
decode ms/token (median of --decode single-token forwards after warm-up) and prefill tokens/s (one
--prefill-token forward), ours in this process and upstream 0.8.32 (``.upstream/``) in a subprocess
on the same file, plus the machine's memory read bandwidth in the same run (the best of several readers, measured
before and after the models; see memory_bandwidth). Our strategies of one checkpoint are loaded
together and their decode tokens timed interleaved in --rounds rounds (benchmarks/_timing.py), so
that the ratios between them (int8 against fp32) do not depend on the machine's bandwidth drifting
between one strategy's turn and the next; upstream's strategies run one per subprocess. Each row
prints both figures, the ratio, the weight bytes read per decoded token and the effective GB/s as a
share of the measured bandwidth, against the bandwidth measured right after that checkpoint's
interleaved decode ("adjacent") and against the median of quick readings taken in every round just
before that strategy's turn ("moment": the bandwidth at the moments it decoded), and the CPU's
speed at those moments against its best reading of the run (CpuSpeed). Upstream's v7 class has no
int8 ("n/a"). --upstream-timeout stops an upstream child that runs longer; its child times the
decode tokens before the prefill forward, so one stopped in the prefill still gives its decode
figure, and its prefill speed shows as a bound ("< 0.8": the forward had run longer than that
allows). RWKV-7 checkpoints take the test fixtures' narrow low-rank widths unless --v7-lora
released gives them a released model's (1.5b: w and a 96, v 64, g 256: ~7.4 MB more low-rank
weights a layer in fp32, which int8 strategies do not quantize).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._timing import time_models  # noqa: E402
from benchmarks.common import emit, header  # noqa: E402
from tests.fixtures.make_tiny_models import make_checkpoint, released_v7_lora, save_checkpoint  # noqa: E402

SIZES = {"0.1b": dict(n_layer=12, n_embd=768), "0.4b": dict(n_layer=24, n_embd=1024),
         "1.5b": dict(n_layer=24, n_embd=2048)}
VOCAB = 65536
UPSTREAM_RUNNER = Path(__file__).resolve().parent / "_upstream_bench.py"


def _best_rate(read, nbytes: int, passes: int) -> float:
    """Best of ``passes`` calls of ``read()`` (which reads nbytes) in GB/s, after one warm-up call."""
    read()
    best = 0.0
    for _ in range(passes):
        t0 = time.perf_counter()
        read()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def _read_rate(a: torch.Tensor, passes: int = 5) -> float:
    """Best of ``passes`` ``a.sum()`` in GB/s (after one warm-up)."""
    return _best_rate(a.sum, a.numel() * a.element_size(), passes)


def _kernel_read_rate(kind: str) -> float | None:
    """Best of 5 passes of our own one-token kernel over 1 GiB of column-major 2048x8192 weights in
    huge pages (int8 ``mm8_one_i16`` or fp32 ``linear_one``), in GB/s of weight bytes; None when
    the kernel is not compiled. Some CPUs stream these single sequential column reads faster
    than ``torch.sum``'s, so they belong in the reference."""
    from rwkv import hugepages, ops
    from rwkv.ops import _backend

    _backend._load()
    N, M = 2048, 8192
    if kind == "int8":
        if not _backend.has_kernel("mm8_one_i16", "CPU"):
            return None
        mats = {f"w{i}": torch.full((M, N), 7, dtype=torch.uint8).t() for i in range(64)}
        side = (torch.rand(M), torch.rand(M), torch.rand(N, 1), torch.rand(N, 1))
        x = torch.randn(N)
        run = lambda w: ops.mm8_one_i16(x, w, *side)  # noqa: E731
    else:
        if not _backend.has_kernel("linear_one", "CPU"):
            return None
        mats = {f"w{i}": torch.ones(M, N).t() for i in range(16)}
        x = torch.randn(N)
        run = lambda w: ops.linear_one(x, w)  # noqa: E731
    hugepages.pack(mats, list(mats))
    nbytes = sum(w.numel() * w.element_size() for w in mats.values())

    def read_all():
        for w in mats.values():
            run(w)

    return _best_rate(read_all, nbytes, 5)


def memory_bandwidth(threads: int) -> dict:
    """Read bandwidth in GB/s, by several readers of 1 GiB (far larger than any cache): summing an
    fp32 tensor in ordinary 4 KiB pages and in transparent huge pages (as our CPU weights are,
    rwkv/hugepages.py), and our own int8 and fp32 matrix-vector kernels streaming weights in huge
    pages. "GBps" is the largest: the machine's read bandwidth as best reached by anything."""
    from rwkv import hugepages

    torch.set_num_threads(threads)
    w = {"a": torch.ones(256 * 1024 * 1024, dtype=torch.float32)}
    small_pages = _read_rate(w["a"])
    huge = _read_rate(w["a"]) if hugepages.pack(w, ["a"]) else None
    del w
    rates = {"4k_pages_GBps": small_pages, "huge_pages_GBps": huge,
             "int8_kernel_GBps": _kernel_read_rate("int8"), "fp32_kernel_GBps": _kernel_read_rate("fp32")}
    return {"GBps": max(v or 0.0 for v in rates.values()), **rates}


class AdjacentBandwidth:
    """The read bandwidth right next to one row's timing: best of 3 ``torch.sum`` over 1 GiB of fp32
    in huge pages (kept allocated for the whole run). The machine is shared and its bandwidth
    can drift by half within one run, so each row is also held to what the machine gave at that
    moment."""

    def __init__(self):
        from rwkv import hugepages

        self.w = {"a": torch.ones(256 * 1024 * 1024, dtype=torch.float32)}
        hugepages.pack(self.w, ["a"])

    def measure(self) -> float:
        return _read_rate(self.w["a"], passes=3)

    def probe(self) -> float:
        """One quick reading (a warm-up pass and one timed pass), for time_models' rounds."""
        return _read_rate(self.w["a"], passes=1)


class CpuSpeed:
    """The CPU's speed right before each row's decoding turns: the best of 3 runs of a fixed pure
    Python loop (~2 ms), in loop iterations per microsecond. On a machine whose cores are shared,
    their speed for work that is not memory-bound can move by half within seconds while a plain
    read's bandwidth holds. Decoding is
    not purely memory-bound: int8 and bf16 rows spend a larger share of their time computing and
    between the ops, so each row is also held to the CPU's speed at its moments, against the best
    reading of the run."""

    def __init__(self):
        self.best = 0.0

    def probe(self) -> float:
        n, rate = 100_000, 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            s = 0
            for i in range(n):
                s += i
            rate = max(rate, n / ((time.perf_counter() - t0) * 1e6))
        self.best = max(self.best, rate)
        return rate


def bench_checkpoint(workdir: Path, size: str, version: str, v7_lora: str = "fixture") -> Path:
    """The seeded random-weight checkpoint of this shape and version in workdir, written there
    first when it is not there yet (bf16 weights, head size 64, vocabulary VOCAB, seed 0; RWKV-7
    with the fixtures' low-rank widths, or a released model's with v7_lora="released")."""
    lora = released_v7_lora(SIZES[size]["n_embd"]) if version == "7" and v7_lora == "released" else None
    path = Path(workdir) / f"bench-{size}-v{version}{'-released-lora' if lora else ''}.pth"
    if not path.exists():
        sd = make_checkpoint(version, vocab=VOCAB, head_size=64, seed=0, dtype=torch.bfloat16,
                             v7_lora=lora, **SIZES[size])
        save_checkpoint(path, sd)
        del sd
    return path


def add_checkpoint_options(p: argparse.ArgumentParser, sizes: str, versions: str, strategies: str) -> None:
    """The options of a benchmark run on each of bench_checkpoint's models and strategies:
    --sizes, --versions, --strategies (comma-separated, these defaults), --threads, --workdir."""
    p.add_argument("--sizes", default=sizes)
    p.add_argument("--versions", default=versions)
    p.add_argument("--strategies", default=strategies)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None, help="where the checkpoints are written (default: a temp dir)")


def each_checkpoint(ns):
    """(size, version, strategy, checkpoint path) for every combination of add_checkpoint_options'
    options, each checkpoint written to --workdir (else a temp dir, removed at the end) first."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(ns.workdir or tmp)
        for size in ns.sizes.split(","):
            for version in ns.versions.split(","):
                path = bench_checkpoint(work, size, version)
                for strategy in [s.strip() for s in ns.strategies.split(",")]:
                    yield size, version, strategy, path


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a single-token forward reads: every matrix and vector once (the embedding:
    one row)."""
    total = 0
    for k, t in model.w.items():
        if k == "emb.weight":
            total += t.shape[1] * t.element_size()
        else:
            total += t.numel() * t.element_size()
    return total


def huge_page_pct(model) -> float | None:
    """The share of the memory mappings holding the model's CPU weights that is backed by
    transparent huge pages (AnonHugePages / Rss in /proc/self/smaps), in %; None where that file
    is unreadable. A row whose weights fell back to 4 KiB pages streams slower, so this tells that
    cause apart from others."""
    ptrs = sorted({t.data_ptr() for k, t in model.w.items()  # (not the embedding: one row is read)
                   if k != "emb.weight" and isinstance(t, torch.Tensor) and t.device.type == "cpu"
                   and t.numel() > 0})
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    rss = huge = 0
    hit = False
    for line in lines:
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:  # a new mapping: "start-end perms ..."
            lo, hi = (int(v, 16) for v in head.split("-"))
            i = bisect.bisect_left(ptrs, lo)
            hit = i < len(ptrs) and ptrs[i] < hi
            continue
        if hit and head == "Rss:":
            rss += int(line.split()[1])
        elif hit and head == "AnonHugePages:":
            huge += int(line.split()[1])
    return round(100 * huge / rss, 1) if rss else None


def bench_ours(path: str, strategies: list, decode: int, prefill: int, rounds: int, probe,
               cpu_probe) -> dict:
    """Every strategy of one checkpoint loaded at once and timed interleaved (time_models), so the
    ratios between our strategies do not depend on when each ran; ``probe`` reads the bandwidth and
    ``cpu_probe`` the CPU's speed in every round. strategy -> timings, the bandwidth while it decoded, and bytes."""
    from rwkv.model import RWKV

    from rwkv.model import release_freed_memory

    models = {s: RWKV(path, s, verbose=False) for s in strategies}
    res = time_models(models, VOCAB, prefill, decode, rounds, probe, cpu_probe)
    out = {s: {**res[s], "bytes": weight_bytes_per_token(m), "huge_page_pct": huge_page_pct(m)}
           for s, m in models.items()}
    # Free our models before upstream's subprocesses load theirs: the four 1.5B models held ~13 GB,
    # and upstream's int8 conversion next to them exhausted this 24 GiB machine.
    del models, res
    gc.collect()
    release_freed_memory()
    return out


def _stopped_child(stdout: str, stopped_at: float, limit: float, prefill: int) -> dict:
    """What a child stopped at its time limit had measured, from the progress lines it printed
    (_upstream_bench.py). Stopped in the prefill forward: its decode figure and an upper bound on
    its prefill speed (the forward had run for longer than stopped_at minus its start, so it is
    slower than prefill tokens over that). Stopped before: an error naming the step."""
    events = {}
    for line in stdout.splitlines():
        try:
            rec = json.loads(line) if line.startswith("{") else {}
        except ValueError:  # a line of upstream's own output that only looks like JSON
            continue
        if "event" in rec:
            events[rec["event"]] = rec
    if "prefill_start" not in events:
        return {"error": f"stopped at the {limit:.0f} s limit before its prefill (raise --upstream-timeout)"}
    ran = stopped_at - events["prefill_start"]["wall"]
    return {"decode_ms": events["decode"]["decode_ms"], "prefill_tps_below": prefill / ran}


def bench_upstream(path: str, strategy: str, decode: int, prefill: int, threads: int, v7: bool,
                   timeout: float | None = None) -> dict:
    """Upstream's figures for one strategy, from a child process; ``timeout`` (seconds) stops a
    child that runs longer (see _stopped_child for what such a row then reports)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(RWKV_JIT_ON="1", RWKV_CUDA_ON="0")
    if v7:
        env["RWKV_V7_ON"] = "1"
    job = json.dumps({"path": path, "strategy": strategy, "decode": decode, "prefill": prefill,
                      "threads": threads, "v7": v7, "upstream": str(REPO / ".upstream"), "vocab": VOCAB})
    child = subprocess.Popen([sys.executable, "-I", str(UPSTREAM_RUNNER), job], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stopped_at = time.time()
        child.kill()
        stdout, _ = child.communicate()
        return _stopped_child(stdout, stopped_at, timeout, prefill)
    if child.returncode != 0:
        return {"error": stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {child.returncode}"}
    return json.loads(stdout.strip().splitlines()[-1])


def _prefill_bound(ours: dict, up: dict) -> dict:
    """For an upstream row stopped in its prefill: the bound on its prefill speed and the bound on
    our speedup over it; nothing for any other row."""
    if "prefill_tps_below" not in up:
        return {}
    return {"upstream_prefill_tps_below": round(up["prefill_tps_below"], 2),
            "prefill_speedup_above": round(ours["prefill_tps"] / up["prefill_tps_below"], 1)}


def _cell(row: dict, key: str, bound: str, sign: str):
    """A table cell: the figure, or for a row stopped early its bound ("< 0.85", "> 52.4")."""
    return f"{sign} {row[bound]}" if bound in row else row[key]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0.1b,1.5b")
    p.add_argument("--versions", default="4,6,7")
    p.add_argument("--strategies", default="cpu fp32,cpu bf16,cpu fp32i8,cpu bf16i8")
    p.add_argument("--decode", type=int, default=50)
    p.add_argument("--rounds", type=int, default=10,
                   help="our strategies' decode tokens are timed interleaved in this many rounds (1: one after another)")
    p.add_argument("--upstream-decode", type=int, default=None, help="tokens for upstream (default: --decode)")
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument("--upstream-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop an upstream row's child after this long; one stopped in its prefill "
                        "reports its decode figure and an upper bound on its prefill speed (upstream's "
                        "RWKV-7 cpu bf16 on a CPU without AVX-512 BF16 takes over an hour otherwise)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--v7-lora", choices=("fixture", "released"), default="fixture",
                   help="RWKV-7's low-rank widths: the test fixtures' narrow ones (w 16, a 12, v 8, g 24, "
                        "as in every recorded run) or a released model's of that width (1.5b: 96, 96, 64, 256)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    header("bench_model", decode_tokens=a.decode, prefill_tokens=a.prefill,
           upstream_timeout_s=a.upstream_timeout)
    bws = memory_bandwidth(a.threads)
    emit({"kind": "memory_bandwidth", "when": "before", **{k: v and round(v, 2) for k, v in bws.items()},
          "threads": a.threads})
    adjacent = AdjacentBandwidth()
    cpu = CpuSpeed()
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="rwkv-bench-"))
    rows = []
    for size in a.sizes.split(","):
        for version in a.versions.split(","):
            released = version == "7" and a.v7_lora == "released"
            path = bench_checkpoint(workdir, size, version, a.v7_lora)
            strategies = [s.strip() for s in a.strategies.split(",")]
            ours_all = bench_ours(str(path), strategies, a.decode, a.prefill, a.rounds, adjacent.probe,
                                  cpu.probe)
            local_bw = adjacent.measure()  # right after the interleaved decode: one figure per checkpoint
            for strategy in strategies:
                ours = ours_all[strategy]
                up = {"error": "skipped"}
                if not a.no_upstream:
                    if version == "7" and "i8" in strategy:
                        up = {"error": "n/a (upstream v7 has no int8)"}
                    else:
                        up = bench_upstream(str(path), strategy, a.upstream_decode or a.decode, a.prefill,
                                            a.threads, version == "7", a.upstream_timeout)
                gbps = ours["bytes"] / (ours["decode_ms"] / 1000) / 1e9
                row = {"kind": "model", "size": size,
                       "version": version + (" (released LoRA)" if released else ""), "strategy": strategy,
                       "ours_decode_ms": round(ours["decode_ms"], 2),
                       "upstream_decode_ms": round(up["decode_ms"], 2) if "decode_ms" in up else up.get("error"),
                       "decode_speedup": round(up["decode_ms"] / ours["decode_ms"], 2) if "decode_ms" in up else None,
                       "ours_prefill_tps": round(ours["prefill_tps"], 1),
                       "upstream_prefill_tps": round(up["prefill_tps"], 1) if "prefill_tps" in up else None,
                       "prefill_speedup": round(ours["prefill_tps"] / up["prefill_tps"], 2) if "prefill_tps" in up else None,
                       **_prefill_bound(ours, up),
                       "weight_MB_per_token": round(ours["bytes"] / 1e6, 1), "ours_GBps": round(gbps, 2),
                       "adjacent_bandwidth_GBps": round(local_bw, 1),
                       "pct_of_adjacent_bandwidth": round(100 * gbps / local_bw, 1),
                       "decode_moment_bandwidth_GBps": round(ours["probe_GBps"], 1),
                       "pct_of_decode_moment_bandwidth": round(100 * gbps / ours["probe_GBps"], 1),
                       "decode_ms_min": round(ours["decode_ms_min"], 2),
                       "decode_ms_p90": round(ours["decode_ms_p90"], 2),
                       "weights_in_huge_pages_pct": ours["huge_page_pct"],
                       "decode_moment_cpu_rate": round(ours["cpu_probe"], 2)}
                emit({**row, "kind": "model (progress)"})  # the final "model" record adds % of bandwidth
                rows.append(row)
    # The machine's bandwidth drifts (shared hardware): measure again and hold every row to the best.
    bws_after = memory_bandwidth(a.threads)
    emit({"kind": "memory_bandwidth", "when": "after", **{k: v and round(v, 2) for k, v in bws_after.items()},
          "threads": a.threads})
    bw = max(bws["GBps"], bws_after["GBps"])
    for row in rows:
        row["pct_of_bandwidth"] = round(100 * row["ours_GBps"] / bw, 1)
        row["decode_moment_cpu_pct"] = round(100 * row["decode_moment_cpu_rate"] / cpu.best, 1)
        emit(row)
    print("\n| size | v | strategy | ours ms/tok | upstream ms/tok | x | ours prefill tok/s | upstream | x | MB/tok "
          "| GB/s | % BW | adjacent BW | % adj. | moment BW | % moment | CPU speed % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['version']} | {r['strategy']} | {r['ours_decode_ms']} | {r['upstream_decode_ms']} | "
              f"{r['decode_speedup']} | {r['ours_prefill_tps']} | {_cell(r, 'upstream_prefill_tps', 'upstream_prefill_tps_below', '<')} | "
              f"{_cell(r, 'prefill_speedup', 'prefill_speedup_above', '>')} | "
              f"{r['weight_MB_per_token']} | {r['ours_GBps']} | {r['pct_of_bandwidth']} | "
              f"{r['adjacent_bandwidth_GBps']} | {r['pct_of_adjacent_bandwidth']} | "
              f"{r['decode_moment_bandwidth_GBps']} | {r['pct_of_decode_moment_bandwidth']} | "
              f"{r['decode_moment_cpu_pct']} |")
    print(f"\nmemory read bandwidth: {bw:.1f} GB/s, the best of ({a.threads} threads, before / after "
          "the models): " + "; ".join(f"{k[:-5]} " + " / ".join("n/a" if b[k] is None else f"{b[k]:.1f}"
                                                                 for b in (bws, bws_after))
                                      for k in bws if k != "GBps"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
