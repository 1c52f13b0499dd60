"""Run the upstream ``rwkv`` 0.8.32 package (installed in ``.upstream/`` by ``make upstream``).

Upstream and this project share the import name ``rwkv``, so upstream only ever runs in a child
process (tests/_upstream_runner.py) started with ``python -I``, with ``.upstream`` first on
``sys.path`` and this repository removed from it. Batch work: each call starts one process, and the
upstream import plus model load cost a few seconds.

    from tests.upstream import run_upstream, upstream_available
    res = run_upstream(path, "cpu fp32", [
        {"tokens": [1, 2, 3], "state": "none", "full_output": False},
        {"tokens": [4], "state": "prev"},
    ])
    res[1]["logits"], res[1]["state"]   # copies taken right after each call

The child sets ``RWKV_JIT_ON=1`` (upstream's default), ``RWKV_CUDA_ON=0`` and ``RWKV_V7_ON=1`` for
v7 checkpoints (detected from the keys unless ``v7=`` is given); ``env`` overrides these, and a value
of None unsets a variable. Failures raise :class:`UpstreamError` carrying upstream's exception and
stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_DIR = Path(os.environ.get("RWKV_UPSTREAM_DIR", REPO_ROOT / ".upstream"))
RUNNER = Path(__file__).resolve().parent / "_upstream_runner.py"
UPSTREAM_VERSION = "0.8.32"

__all__ = [
    "UpstreamError",
    "upstream_available",
    "upstream_skip_reason",
    "is_v7_checkpoint",
    "run_upstream",
    "run_upstream_job",
    "run_upstream_many",
    "upstream_strategies",
    "upstream_strategy",
    "upstream_normalized",
    "upstream_convert",
]


class UpstreamError(RuntimeError):
    """The upstream child process failed. ``exc_type``/``exc_message`` name upstream's exception."""

    def __init__(self, message, *, exc_type=None, exc_message=None, stderr="", stdout=""):
        super().__init__(message)
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.stderr = stderr
        self.stdout = stdout


def upstream_skip_reason():
    """None when upstream is installed, else a sentence for ``pytest.skip``."""
    if not (UPSTREAM_DIR / "rwkv" / "model.py").is_file():
        return f"upstream rwkv {UPSTREAM_VERSION} is not installed in {UPSTREAM_DIR} (run `make upstream`)"
    if not (UPSTREAM_DIR / f"rwkv-{UPSTREAM_VERSION}.dist-info").is_dir():
        return f"{UPSTREAM_DIR} holds an rwkv other than {UPSTREAM_VERSION} (run `make clean upstream`)"
    return None


def upstream_available() -> bool:
    """True when ``.upstream/`` holds rwkv 0.8.32."""
    return upstream_skip_reason() is None


def _resolve_model(model_path) -> Path:
    p = Path(model_path)
    if not p.is_file() and Path(str(p) + ".pth").is_file():
        p = Path(str(p) + ".pth")
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint not found: {model_path}")
    return p.resolve()


def is_v7_checkpoint(model_path) -> bool:
    """True when the checkpoint has RWKV-7 keys (``blocks.0.att.r_k``)."""
    sd = torch.load(_resolve_model(model_path), map_location="cpu", mmap=True, weights_only=True)
    return "blocks.0.att.r_k" in sd


def _child_env(env, *, jit: str, v7: bool) -> dict:
    out = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH"):
        out.pop(k, None)
    out.update({"RWKV_JIT_ON": jit, "RWKV_CUDA_ON": "0"})
    if v7:
        out["RWKV_V7_ON"] = "1"
    else:
        out.pop("RWKV_V7_ON", None)
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = str(v)
    return out


def _check_calls(calls) -> list:
    calls = list(calls)
    for n, call in enumerate(calls):
        unknown = set(call) - {"tokens", "state", "full_output"}
        if unknown or "tokens" not in call:
            raise ValueError(f"call {n}: expected keys tokens, state, full_output; got {sorted(call)}")
    return calls


def run_upstream_job(job: dict, *, env=None, v7=None, jit: str = "1", timeout: float = 600) -> dict:
    """Low-level: run one job in a child process and return its result dict (see the runner).

    ``job["model"]`` (or the first ``job["runs"][i]["model"]``) decides v7 mode when ``v7`` is None.
    """
    reason = upstream_skip_reason()
    if reason:
        raise UpstreamError(reason)
    job = dict(job)
    if "runs" in job:
        job["runs"] = [{**r, "model": str(_resolve_model(r["model"]))} for r in job["runs"]]
        probe = job["runs"][0]["model"]
    else:
        job["model"] = probe = str(_resolve_model(job["model"]))
    # Precedence: the v7 argument, then env["RWKV_V7_ON"], then detection from the keys.
    child_env = _child_env(env, jit=jit, v7=is_v7_checkpoint(probe) if v7 is None else v7)
    if v7 is not None:
        child_env.pop("RWKV_V7_ON", None)
        if v7:
            child_env["RWKV_V7_ON"] = "1"
    job.update(upstream_dir=str(UPSTREAM_DIR.resolve()), repo_root=str(REPO_ROOT))
    with tempfile.TemporaryDirectory(prefix="rwkv-upstream-") as tmp:
        job_file, out_file = Path(tmp) / "job.pt", Path(tmp) / "out.pt"
        torch.save(job, job_file)
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(RUNNER), str(job_file), str(out_file)],
                cwd=tmp,
                env=child_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise UpstreamError(f"upstream run timed out after {timeout}s; stderr:\n{e.stderr}") from None
        result = torch.load(out_file, weights_only=True) if out_file.is_file() else None
    if proc.returncode != 0 or result is None or "error" in result:
        err = (result or {}).get("error") or {}
        raise UpstreamError(
            f"upstream rwkv failed (exit {proc.returncode})"
            + (f": {err.get('type')}: {err.get('message')}" if err else "")
            + f"\n--- stderr ---\n{proc.stderr[-8000:]}\n--- stdout (tail) ---\n{proc.stdout[-2000:]}",
            exc_type=err.get("type"),
            exc_message=err.get("message"),
            stderr=proc.stderr,
            stdout=proc.stdout,
        )
    result["stdout"], result["stderr"] = proc.stdout, proc.stderr
    return result


def run_upstream_many(runs, *, env=None, v7=None, threads=None, timeout=600) -> list:
    """Several ``(model_path, strategy, calls)`` runs with as few child processes as possible.

    Runs are grouped by v7-ness (v7 checkpoints need ``RWKV_V7_ON=1`` at import, so they cannot
    share a process with v4/v5/v6 ones); each group is one child process. Returns, in input order,
    ``{"results": [...], "info": {...}}`` per run (see :func:`run_upstream`).
    """
    runs = [(str(m), s, _check_calls(c)) for m, s, c in runs]
    groups = {}
    for i, (model, _, _) in enumerate(runs):
        key = is_v7_checkpoint(model) if v7 is None else bool(v7)
        groups.setdefault(key, []).append(i)
    out = [None] * len(runs)
    for key, idx in groups.items():
        job = {
            "mode": "run",
            "runs": [{"model": runs[i][0], "strategy": runs[i][1], "calls": runs[i][2]} for i in idx],
            "threads": threads,
        }
        res = run_upstream_job(job, env=env, v7=key, timeout=timeout)
        for i, r in zip(idx, res["runs"]):
            out[i] = {"results": r["results"], "info": r["info"]}
    return out


def run_upstream(
    model_path, strategy, calls, *, env=None, v7=None, threads=None, timeout=600, return_info=False
):
    """Load ``model_path`` with upstream and run ``calls`` in order; one child process in all.

    Each call is a dict: ``tokens`` (list of ints), ``state`` ("none" for None, "prev" for the
    state object returned by the previous call (passed as is, like a user would), an int k for a
    fresh copy of call k's returned state, or a list of tensors), ``full_output`` (bool, default
    False).

    Returns one dict per call: ``logits`` (a copy of what forward returned), ``state`` (copies of
    the returned state tensors, taken right after the call) and ``same_state_object`` (whether
    forward returned the very list it was given). With ``return_info=True`` returns
    ``(results, info)`` where ``info`` has the upstream model's ``class``, ``version``,
    ``n_layer``, ``n_embd``, ``n_head``, ``strategy_string``, ``rescale_layer`` and ``slots`` (the
    attributes that exist for that class). ``threads`` sets ``torch.set_num_threads`` in the child.
    """
    job = {
        "mode": "run",
        "runs": [{"model": str(model_path), "strategy": strategy, "calls": _check_calls(calls)}],
        "threads": threads,
    }
    run = run_upstream_job(job, env=env, v7=v7, timeout=timeout)["runs"][0]
    return (run["results"], run["info"]) if return_info else run["results"]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def upstream_strategies(model_path, strategies, *, env=None, timeout=600) -> list:
    """Construct the classic upstream model once per strategy string, all in one child process.

    ``strategies`` items are strategy strings (loaded with ``model_path``) or ``(path, strategy)``
    pairs, so one process can cover several layer counts. Returns one dict per item: ``strategy``,
    ``normalized`` (upstream's ``model.args.strategy_string``), ``slots`` (list of
    ``(device, atype, wtype, stream)`` with torch dtypes, slot ``n_layer`` = head) and ``error``
    (``"ExceptionType: message"`` if upstream raised, else None). JIT is off by default here:
    allocation does not depend on it and loading is faster.
    """
    pairs = [x if isinstance(x, tuple) else (model_path, x) for x in strategies]
    items = [(str(_resolve_model(m)), s) for m, s in pairs]
    # One thread: upstream's int8 conversion runs many tiny ops that are much slower with several
    # threads on a busy machine; the allocation does not depend on it.
    job = {
        "mode": "strategies",
        "model": items[0][0] if items else str(model_path),
        "strategies": items,
        "threads": 1,
    }
    out = run_upstream_job(job, env=env, v7=False, jit="0", timeout=timeout)
    rows = out["rows"]
    for row in rows:
        if row["slots"] is not None:
            row["slots"] = [(dev, _dtype(a), _dtype(w), bool(s)) for dev, a, w, s in row["slots"]]
    return rows


def upstream_strategy(model_path, strategy, *, env=None) -> list:
    """Upstream's per-slot allocation ``[(device, atype, wtype, stream), ...]`` for one strategy."""
    row = upstream_strategies(model_path, [strategy], env=env)[0]
    if row["error"]:
        raise UpstreamError(f"upstream rejected strategy {strategy!r}: {row['error']}")
    return row["slots"]


def upstream_normalized(model_path, strategy, *, env=None) -> str:
    """Upstream's normalized strategy string (``model.args.strategy_string``)."""
    row = upstream_strategies(model_path, [strategy], env=env)[0]
    if row["error"]:
        raise UpstreamError(f"upstream rejected strategy {strategy!r}: {row['error']}")
    return row["normalized"]


def upstream_convert(model_path, strategy, out_path, *, env=None, timeout=600) -> Path:
    """Write upstream's pre-converted file (``convert_and_save_and_exit``) for ``strategy``."""
    out_path = Path(out_path).resolve()
    job = {"mode": "convert", "model": str(model_path), "strategy": strategy, "out": str(out_path)}
    run_upstream_job(job, env=env, v7=False, jit="0", timeout=timeout)
    return out_path if out_path.suffix == ".pth" else Path(str(out_path) + ".pth")
