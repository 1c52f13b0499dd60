"""The child process of the fuzz suite (tests/test_fuzz.py): runs a batch of cases that could crash
the process and prints one JSON line per case.

    python -m tests._fuzz_child KIND CASES.pkl

Each case is a plain description (lists, bytes, strings), built into the real input here, because
some inputs (generators, meta tensors) do not pickle. A line is printed and flushed *before* each case
runs (``{"start": i}``), so when the process dies the parent knows which case killed it. After each
case: ``{"case": i, "outcome": "ok" | "<ExceptionClass>", "message": ..., "state_intact": bool}``.
"""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import torch


def _emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------ builders
_NP = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
       "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "float32": np.float32, "bool": np.bool_}
_TORCH = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
          "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
          "float32": torch.float32, "bool": torch.bool}


def build_tokens(desc):
    """A token input from ``(form, values, extra)``."""
    form, values, extra = desc
    if form == "int":
        return values[0] if values else 0
    if form == "list":
        return list(values)
    if form == "tuple":
        return tuple(values)
    if form == "nested":
        return [list(values)]
    if form == "floats":
        return [float(v) for v in values]
    if form == "strings":
        return [str(v) for v in values]
    if form == "ndarray":
        arr = np.array([v % (2**64) if extra.startswith("uint") else v for v in values], dtype=object)
        try:
            arr = arr.astype(_NP[extra])
        except OverflowError:
            arr = np.array(values, dtype=np.float64).astype(_NP[extra])
        return arr.reshape(1, -1) if len(values) % 2 == 0 and len(values) > 2 else arr
    if form == "tensor":
        dtype = _TORCH[extra]
        info = torch.iinfo(dtype) if not (dtype.is_floating_point or dtype == torch.bool) else None
        vals = [min(max(v, info.min), info.max) for v in values] if info else values
        if dtype == torch.uint64:
            return torch.from_numpy(np.array([v % (2**64) for v in values], dtype=np.uint64))
        return torch.tensor(vals, dtype=dtype)
    if form == "meta":
        return torch.tensor([min(max(v, -2**63), 2**63 - 1) for v in values], dtype=torch.long).to("meta")
    if form == "dict":
        return {v: v for v in values}
    if form == "set":
        return set(values)
    if form == "bytes":
        return bytes(v % 256 for v in values)
    if form == "generator":
        return (v for v in values)
    if form == "str":
        return "".join(chr(65 + v % 26) for v in values)
    if form == "none":
        return None
    raise ValueError(form)


def build_state(desc, good):
    """A state from ``good`` (a valid state list) changed as ``desc = (change, index, arg)`` says."""
    change, index, arg = desc
    state = [t.clone() for t in good]
    i = index % len(state)
    t = state[i]
    if change == "none":
        return state
    if change == "tuple":
        return tuple(state)
    if change == "drop":
        return state[:-1]
    if change == "extra":
        return state + [t.clone()]
    if change == "not_a_list":
        return {"state": state} if arg % 2 else torch.stack([s.reshape(-1)[:1] for s in state])
    if change == "entry_none":
        state[i] = None
    elif change == "numpy":
        state[i] = t.numpy()
    elif change == "dtype":
        state[i] = t.to([torch.float16, torch.bfloat16, torch.float64, torch.int32][arg % 4])
    elif change == "shape":
        state[i] = t.reshape(-1)[: max(0, t.numel() - 1 - arg % 3)]
    elif change == "meta":
        state[i] = t.to("meta")
    elif change == "transposed":
        state[i] = t.transpose(-1, -2).contiguous().transpose(-1, -2) if t.dim() >= 2 else t.flip(0).flip(0)
    elif change == "strided":
        state[i] = t.repeat_interleave(2, dim=-1)[..., ::2]
    elif change == "expanded":
        state[i] = t.reshape(-1)[:1].expand(t.shape) if t.numel() else t
    elif change == "nan":
        t.view(-1)[arg % max(1, t.numel())] = float("nan")
    elif change == "huge":
        t.fill_(1e30 if arg % 2 else -1e30)
    elif change == "grad":
        state[i] = t.requires_grad_(True)
    elif change == "sparse":
        state[i] = t.to_sparse()
    else:
        raise ValueError(change)
    return state


# --------------------------------------------------------------------------------------------- runs
def _outcome(fn):
    try:
        result = fn()
        return "ok", "", result
    except Exception as e:  # noqa: BLE001 - the parent judges which classes are allowed
        return type(e).__name__, str(e)[:300], None


def run_checkpoints(cases):
    """case: (path, strategy). Load, then one prompt forward and one token forward."""
    from rwkv.model import RWKV

    for i, (path, strategy) in enumerate(cases):
        _emit({"start": i})

        def go():
            model = RWKV(path, strategy, verbose=False)
            logits, state = model.forward([0, 1], None)
            model.forward([1], state)
            return None

        outcome, message, _ = _outcome(go)
        _emit({"case": i, "outcome": outcome, "message": message, "state_intact": True})


def _models(paths):
    from rwkv.model import RWKV

    return {v: RWKV(p, "cpu fp32", verbose=False) for v, p in paths.items()}


def _snapshot(state):
    return [t.clone() if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.layout == torch.strided
            else t for t in state] if isinstance(state, (list, tuple)) else state


def _intact(given, given_items, before):
    """The caller's container holds the same objects (a failed call must not replace them) with the
    same values."""
    if not isinstance(given, (list, tuple)):
        return True
    if len(given) != len(given_items) or any(a is not b for a, b in zip(given, given_items)):
        return False
    for a, b in zip(given_items, before):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device.type != "meta" \
                and a.layout == torch.strided and not torch.equal(a.detach(), b):
            if not (torch.isnan(a).any() and torch.equal(torch.nan_to_num(a.detach()), torch.nan_to_num(b))):
                return False
    return True


def run_forward(cases, paths):
    """case: ("tokens", version, desc, with_state) or ("state", version, state_desc)."""
    models = _models(paths)
    good = {v: m.forward([1, 2, 3], None)[1] for v, m in models.items()}
    for i, case in enumerate(cases):
        _emit({"start": i})
        kind, version = case[0], case[1]
        model = models[version]
        if kind == "tokens":
            tokens = build_tokens(case[2])
            state = [t.clone() for t in good[version]] if case[3] else None
            call = lambda: model.forward(tokens, state)  # noqa: E731
        else:
            tokens = [4, 5]
            state = build_state(case[2], good[version])
            call = lambda: model.forward(tokens, state)  # noqa: E731
        items = list(state) if isinstance(state, (list, tuple)) else None
        before = _snapshot(items) if items is not None else None
        outcome, message, result = _outcome(call)
        intact = True
        if outcome != "ok":
            intact = _intact(state, items, before) if items is not None else True
        else:
            logits, _ = result
            if not (isinstance(logits, torch.Tensor) and logits.shape[-1] == model.args.vocab_size):
                outcome, message = "BadResult", f"logits {type(logits)} {getattr(logits, 'shape', None)}"
        _emit({"case": i, "outcome": outcome, "message": message, "state_intact": intact})


def run_tokenizers(cases, hf_path):
    """case: (method, payload). Runs on the C++ and the Python World tokenizer and on PIPELINE with
    the Hugging Face tokenizer; the outcome is "ok" only when both World paths agree."""
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER, WORLD_VOCAB_FILE
    from rwkv.utils import PIPELINE

    native = TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=None)
    python = TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=False)
    hf = PIPELINE(None, hf_path)
    for i, (method, payload) in enumerate(cases):
        _emit({"start": i})
        if method in ("encodeBytes_view",):
            arg, method = memoryview(np.frombuffer(payload, dtype=np.uint8).copy()), "encodeBytes"
        elif method == "decodeBytes_view":
            arg, method = memoryview(np.array(payload, dtype=np.int32)), "decodeBytes"
        else:
            arg = payload
        a = _outcome(lambda: getattr(native, method)(arg))
        b = _outcome(lambda: getattr(python, method)(arg))
        outcome, message = a[0], a[1]
        if (a[0] == "ok") != (b[0] == "ok") or (a[0] == "ok" and a[2] != b[2]):
            outcome, message = "Disagree", f"native {a[0]} {a[2]!r:.100} python {b[0]} {b[2]!r:.100}"
        if outcome in ("ok",) and method in ("encode", "decode"):
            h = _outcome(lambda: getattr(hf, method)(arg))
            if h[0] != "ok":
                outcome, message = h[0], "hf: " + h[1]
        _emit({"case": i, "outcome": outcome, "message": message, "state_intact": True})


def main(argv) -> int:
    kind, cases_file = argv[1], argv[2]
    with open(cases_file, "rb") as f:
        payload = pickle.load(f)  # written by the parent test, not external input
    if kind == "checkpoints":
        run_checkpoints(payload["cases"])
    elif kind == "forward":
        run_forward(payload["cases"], payload["paths"])
    elif kind == "tokenizers":
        run_tokenizers(payload["cases"], payload["hf_path"])
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
