"""Runs the upstream ``rwkv`` 0.8.32 package for tests/upstream.py. Not a test module; not imported.

Invoked as ``python -I tests/_upstream_runner.py JOB OUT`` in a fresh process. ``JOB`` is a
``torch.save``d dict written by tests/upstream.py; ``OUT`` receives a ``torch.save``d dict of plain
values and tensors (loadable with ``weights_only=True``). The RWKV_* environment variables are set
by the parent before this process starts, because upstream reads them when ``rwkv.model`` is
imported.

Our own package is also called ``rwkv``, so before importing anything this script removes the
repository (and ``''``/cwd) from ``sys.path`` and drops setuptools' editable-install finders from
``sys.meta_path``, puts the upstream folder first, and checks afterwards where ``rwkv`` came from.
"""

import os
import sys


def _inside(path, root):
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def _isolate(upstream_dir, repo_root):
    upstream_dir = os.path.realpath(upstream_dir)
    repo_root = os.path.realpath(repo_root)
    kept = []
    for p in sys.path:
        rp = os.path.realpath(p or os.getcwd())
        if p == "" or "__editable__" in p or (_inside(rp, repo_root) and not _inside(rp, upstream_dir)):
            continue
        kept.append(p)
    sys.path[:] = [upstream_dir] + kept
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    for name in list(sys.modules):
        if name == "rwkv" or name.startswith("rwkv."):
            del sys.modules[name]
    return upstream_dir


def _clone(x):
    return x.detach().clone() if x is not None else None


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _slots(model):
    return [
        (str(dd.device), _dtype_name(dd.atype), _dtype_name(dd.wtype), bool(dd.stream))
        for dd in model.strategy
    ]


def _load(RWKV, model_path, strategy, **kw):
    import inspect

    params = inspect.signature(RWKV.__init__).parameters
    if "verbose" in params:
        kw.setdefault("verbose", False)
    if RWKV.__name__ == "RWKV_x070" and model_path.endswith(".pth"):
        model_path = model_path[: -len(".pth")]  # the v7 class always appends '.pth'
    return RWKV(model_path, strategy, **kw)


def _info(model):
    args = model.args
    info = {"class": type(model).__name__}
    for k in ("n_layer", "n_embd", "n_att", "n_ffn", "n_head", "head_size", "strategy_string", "time_state"):
        if hasattr(args, k):
            info[k] = getattr(args, k)
    for k in ("n_head", "head_size", "n_layer", "n_embd"):
        if k not in info and isinstance(getattr(model, k, None), int):
            info[k] = getattr(model, k)
    if hasattr(model, "version"):
        info["version"] = str(model.version)
    if hasattr(model, "RESCALE_LAYER"):
        info["rescale_layer"] = model.RESCALE_LAYER
    if hasattr(model, "strategy"):
        info["slots"] = _slots(model)
    return info


def _run_calls(model, calls):
    results = []
    prev = None
    for n, call in enumerate(calls):
        spec = call.get("state", "none")
        if spec is None or spec == "none":
            state = None
        elif spec == "prev":
            if n == 0:
                raise ValueError("call 0 asks for state 'prev' but there is no previous call")
            state = prev
        elif isinstance(spec, int):
            state = [_clone(t) for t in results[spec]["state"]]
        elif isinstance(spec, (list, tuple)):
            state = [_clone(t) for t in spec]
        else:
            raise ValueError(f"call {n}: bad state spec {spec!r}")
        full = bool(call.get("full_output", False))
        out, new_state = model.forward(list(call["tokens"]), state, full_output=full)
        results.append(
            {
                "logits": _clone(out),
                "state": [_clone(t) for t in new_state],
                "same_state_object": new_state is state,
            }
        )
        prev = new_state
    return results


def main():
    job_path, out_path = sys.argv[1], sys.argv[2]
    # torch is not named rwkv, so importing it before isolation is harmless; we need it to read the job.
    import torch

    job = torch.load(job_path, weights_only=True)
    upstream_dir = _isolate(job["upstream_dir"], job["repo_root"])
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))

    result = {}
    try:
        import rwkv.model

        where = os.path.realpath(rwkv.model.__file__)
        if not _inside(where, upstream_dir):
            raise RuntimeError(f"isolation failed: rwkv.model was imported from {where}, not {upstream_dir}")
        RWKV = rwkv.model.RWKV
        # Upstream calls gc.collect() once per layer while loading; with torch imported each call
        # scans ~10^6 objects (~0.1 s). Freezing what exists now makes those calls cheap and
        # changes nothing else.
        import gc

        gc.freeze()
        mode = job["mode"]
        if mode == "run":
            result["runs"] = []
            for run in job["runs"]:
                model = _load(RWKV, run["model"], run["strategy"])
                result["runs"].append({"info": _info(model), "results": _run_calls(model, run["calls"])})
                del model
        elif mode == "strategies":
            rows = []
            for model_path, s in job["strategies"]:
                row = {"strategy": s, "normalized": None, "slots": None, "error": None}
                try:
                    model = _load(RWKV, model_path, s)
                    row["normalized"] = model.args.strategy_string
                    row["slots"] = _slots(model)
                    del model
                except Exception as e:  # recorded per strategy: tests compare upstream's failures too
                    row["error"] = f"{type(e).__name__}: {e}"
                rows.append(row)
            result["rows"] = rows
        elif mode == "convert":
            try:
                _load(RWKV, job["model"], job["strategy"], convert_and_save_and_exit=job["out"])
            except SystemExit as e:  # upstream calls exit(0) after saving
                if e.code not in (0, None):
                    raise
            result["converted"] = job["out"]
        else:
            raise ValueError(f"unknown mode {mode!r}")
    except BaseException as e:
        import traceback

        result["error"] = {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
        torch.save(result, out_path)
        traceback.print_exc()
        sys.exit(1)
    torch.save(result, out_path)


if __name__ == "__main__":
    main()
