"""GPU decode and prefill speed of whole models, ours against upstream 0.8.32 with RWKV_CUDA_ON=1.

    python benchmarks/bench_gpu.py [--sizes 0.4b,1.5b,7b] [--versions 7] [--decode 64]
        [--strategies "cuda fp16,cuda fp16i8"] [--prefill 512] [--upstream DIR | --no-upstream]
        [--json FILE] [--markdown FILE] [--budget-s 300] [--workdir DIR]

For each seeded random-weight checkpoint shaped like RWKV 0.4B / 1.5B / 7B and each strategy it
measures decode ms/token (median over --decode single-token forwards, synchronised) and prefill
tokens/s (one --prefill-token forward), ours in this process (with and without CUDA graphs when
``RWKV(..., cuda_graph=True)`` exists) and upstream in a subprocess (``--upstream`` is the folder
holding upstream's ``rwkv`` package; RWKV_CUDA_ON=1 compiles its kernels on first use). It also
reports the weight bytes a decoded token reads, the effective GB/s and its share of the card's
nominal bandwidth (4.8 TB/s for an H200) and of a measured device copy. To keep checkpoint
creation fast, layers 2..L-1 share layer 1's tensors in the file (torch.save stores them once);
every loader converts each key into its own GPU tensor, so the memory traffic is a real model's.
Exits 0 with a message when no GPU is present. ``--budget-s`` stops starting new rows in time.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_model(m, vocab: int, decode: int, prefill: int) -> dict:
    """Prefill tokens/s of one forward over `prefill` tokens; median decode ms/token."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (max(prefill, decode + 8),), generator=g).tolist()
    m.forward(prompt[:16], None)  # warm-up: kernels, allocator, lazy init
    _sync()
    t0 = time.perf_counter()
    _, state = m.forward(prompt[:prefill], None)
    _sync()
    prefill_s = time.perf_counter() - t0
    for t in prompt[:5]:  # warm-up of the single-token path (graph capture, if any)
        _, state = m.forward([t], state)
    _sync()
    times = []
    for t in prompt[:decode]:
        t0 = time.perf_counter()
        _, state = m.forward([t], state)
        _sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"decode_ms": 1000 * times[len(times) // 2], "prefill_tps": prefill / prefill_s}


def _child(job: dict) -> None:
    """Runs in `python -I` with upstream's folder first on sys.path: never sees our package."""
    sys.path.insert(0, job["upstream"])
    from rwkv.model import RWKV  # upstream's

    path = job["path"][:-4] if job["v7"] else job["path"]  # upstream's v7 class appends .pth
    m = RWKV(path, job["strategy"]) if job["v7"] else RWKV(path, job["strategy"], verbose=False)
    print(json.dumps(time_model(m, job["vocab"], job["decode"], job["prefill"])))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _child(json.loads(sys.argv[2]))
    sys.exit(0)

import argparse  # noqa: E402
import inspect  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZES = {"0.4b": dict(n_layer=24, n_embd=1024), "1.5b": dict(n_layer=24, n_embd=2048),
         "7b": dict(n_layer=32, n_embd=4096)}
VOCAB = 65536
# Rough seconds one size needs (checkpoint, loads, both strategies, upstream); a size is only
# started when this much of --budget-s is left, so a late 7B row is skipped, not cut off.
COST_S = {"0.4b": 25, "1.5b": 50, "7b": 100}
NOMINAL_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


def emit(record: dict, sink) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if sink:
        sink.write(line + "\n")
        sink.flush()


def nominal_bandwidth() -> float:
    name = torch.cuda.get_device_name()
    return next((v for k, v in NOMINAL_GBPS.items() if k in name), 4800.0)


def copy_bandwidth() -> float:
    """Device copy bandwidth in GB/s (bytes read + written), 1 GiB buffers, best of 10."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    best = 0.0
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        best = max(best, 2 * a.numel() / (e0.elapsed_time(e1) / 1000) / 1e9)
    del a, b
    torch.cuda.empty_cache()
    return best


def make_bench_checkpoint(path: Path, version: str, size: str) -> None:
    """A random checkpoint in upstream's training layout: two drawn layers, the rest sharing
    layer 1's tensors (layer 0 differs: ln0, and v7's missing value-residual LoRA)."""
    from tests.fixtures.make_tiny_models import make_checkpoint

    cfg = SIZES[size]
    sd = make_checkpoint(version, n_layer=2, n_embd=cfg["n_embd"], vocab=VOCAB, head_size=64,
                         seed=0, dtype=torch.bfloat16)
    out, tail = {}, {}
    for k, v in sd.items():
        (out if k.startswith(("emb.", "blocks.")) else tail)[k] = v
    layer1 = [(k[len("blocks.1."):], v) for k, v in sd.items() if k.startswith("blocks.1.")]
    for i in range(2, cfg["n_layer"]):
        out.update((f"blocks.{i}.{k}", v) for k, v in layer1)
    out.update(tail)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)


def weight_bytes_per_token(model) -> int:
    """Bytes a single-token forward reads: every distinct weight once, the embedding one row."""
    total, seen = 0, set()
    for k, t in model.w.items():
        if not isinstance(t, torch.Tensor) or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.shape[-1] * t.element_size() if k == "emb.weight" else t.numel() * t.element_size()
    return total


def bench_ours(path: str, strategy: str, a, cuda_graph: bool | None) -> dict:
    from rwkv.model import RWKV

    kw = {} if cuda_graph is None else {"cuda_graph": cuda_graph}
    m = RWKV(path, strategy, verbose=False, **kw)
    r = time_model(m, VOCAB, a.decode, a.prefill)
    r["bytes"] = weight_bytes_per_token(m)
    del m
    torch.cuda.empty_cache()
    return r


def bench_upstream(path: str, strategy: str, a, v7: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(RWKV_JIT_ON="1", RWKV_CUDA_ON="1", RWKV_V7_ON="1" if v7 else "0")
    job = {"path": path, "strategy": strategy, "decode": a.decode, "prefill": a.prefill,
           "v7": v7, "upstream": str(Path(a.upstream).resolve()), "vocab": VOCAB}
    try:
        r = subprocess.run([sys.executable, "-I", str(Path(__file__).resolve()), "--child",
                            json.dumps(job)], capture_output=True, text=True, env=env,
                           cwd=tempfile.gettempdir(), timeout=a.upstream_timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"upstream timed out after {a.upstream_timeout_s} s"}
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        return {"error": lines[-1][:200] if lines else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def row_for(size, version, strategy, variant, ours, up, nominal, measured) -> dict:
    gbps = ours["bytes"] / (ours["decode_ms"] / 1000) / 1e9
    has_up = "decode_ms" in up
    return {"kind": "model", "size": size, "version": version, "strategy": strategy,
            "variant": variant, "ours_decode_ms": round(ours["decode_ms"], 3),
            "ours_decode_tps": round(1000 / ours["decode_ms"], 1),
            "upstream_decode_ms": round(up["decode_ms"], 3) if has_up else up.get("error"),
            "decode_speedup": round(up["decode_ms"] / ours["decode_ms"], 2) if has_up else None,
            "ours_prefill_tps": round(ours["prefill_tps"], 1),
            "upstream_prefill_tps": round(up["prefill_tps"], 1) if has_up else None,
            "prefill_speedup": round(ours["prefill_tps"] / up["prefill_tps"], 2) if has_up else None,
            "weight_MB_per_token": round(ours["bytes"] / 1e6, 1), "ours_GBps": round(gbps, 1),
            "pct_nominal_bw": round(100 * gbps / nominal, 1),
            "pct_measured_copy_bw": round(100 * gbps / measured, 1)}


def markdown(rows: list, nominal: float, measured: float) -> str:
    out = ["| size | v | strategy | variant | ours tok/s | ours ms/tok | upstream ms/tok | x | "
           "ours prefill tok/s | upstream prefill | x | MB/tok | GB/s | % of nominal BW |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['size']} | {r['version']} | {r['strategy']} | {r['variant']} | "
                   f"{r['ours_decode_tps']} | {r['ours_decode_ms']} | {r['upstream_decode_ms']} | "
                   f"{r['decode_speedup']} | {r['ours_prefill_tps']} | {r['upstream_prefill_tps']} | "
                   f"{r['prefill_speedup']} | {r['weight_MB_per_token']} | {r['ours_GBps']} | "
                   f"{r['pct_nominal_bw']} |")
    out.append(f"\nnominal bandwidth {nominal:.0f} GB/s; measured device copy {measured:.0f} GB/s "
               f"({torch.cuda.get_device_name()})")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0.4b,1.5b,7b")
    p.add_argument("--versions", default="7")
    p.add_argument("--strategies", default="cuda fp16,cuda fp16i8")
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--upstream", default="/tmp/upstream",
                   help="folder holding upstream's rwkv package (default /tmp/upstream)")
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument("--upstream-timeout-s", type=int, default=240)
    p.add_argument("--json", default=None, help="also append the JSON lines to this file")
    p.add_argument("--markdown", default=None, help="write the result table to this file")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no new row after this")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        msg = (f"bench_gpu: no CUDA GPU here (torch {torch.__version__}, CUDA "
               f"{torch.version.cuda}); nothing to measure")
        print(msg)
        if a.markdown:
            Path(a.markdown).write_text(msg + "\n")
        return 0
    start = time.monotonic()
    sink = open(a.json, "a") if a.json else None
    from benchmarks.common import header

    info = header("bench_gpu", decode_tokens=a.decode, prefill_tokens=a.prefill)
    if sink:
        sink.write(json.dumps(info) + "\n")
    nominal, measured = nominal_bandwidth(), copy_bandwidth()
    emit({"kind": "bandwidth", "nominal_GBps": nominal, "copy_GBps": round(measured, 1)}, sink)
    from rwkv.model import RWKV

    graph_variants = [None]
    if "cuda_graph" in inspect.signature(RWKV.__init__).parameters:
        graph_variants = [False, True]
    up_ok = not a.no_upstream and (Path(a.upstream) / "rwkv" / "model.py").exists()
    if not a.no_upstream and not up_ok:
        emit({"kind": "note", "upstream": f"not found at {a.upstream}/rwkv/model.py; skipped"}, sink)
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="rwkv-bench-gpu-"))
    rows = []
    for size in a.sizes.split(","):
        for version in a.versions.split(","):
            if time.monotonic() - start + COST_S.get(size, 60) > a.budget_s:
                emit({"kind": "skipped", "size": size, "version": version, "why": "budget"}, sink)
                continue
            path = workdir / f"bench-{size}-v{version}.pth"
            if not path.exists():
                make_bench_checkpoint(path, version, size)
            for strategy in (s.strip() for s in a.strategies.split(",")):
                up = {"error": "skipped"}
                if up_ok and version == "7" and "i8" in strategy:
                    up = {"error": "n/a (upstream v7 has no int8)"}
                elif up_ok and time.monotonic() - start < a.budget_s:
                    up = bench_upstream(str(path), strategy, a, version == "7")
                for cg in graph_variants:
                    if time.monotonic() - start > a.budget_s:
                        emit({"kind": "skipped", "size": size, "strategy": strategy,
                              "why": "budget"}, sink)
                        continue
                    variant = {None: "eager", False: "eager", True: "cuda_graph"}[cg]
                    try:
                        ours = bench_ours(str(path), strategy, a, cg)
                    except Exception as e:  # one failing row must not hide the others
                        emit({"kind": "error", "size": size, "strategy": strategy,
                              "variant": variant, "error": f"{type(e).__name__}: {e}"[:300]}, sink)
                        continue
                    rows.append(row_for(size, version, strategy, variant, ours, up, nominal,
                                        measured))
                    emit(rows[-1], sink)
                    if a.markdown:  # rewritten after every row: a later timeout keeps the table
                        Path(a.markdown).write_text(markdown(rows, nominal, measured) + "\n")
            path.unlink(missing_ok=True)
    table = markdown(rows, nominal, measured)
    print("\n" + table)
    if a.markdown:
        Path(a.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
