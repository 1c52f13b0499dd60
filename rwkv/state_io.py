"""Save a model state (the list returned by ``RWKV.forward``) to a file and load it back, refusing a
state that belongs to a different model.

    from rwkv.state_io import save_state, load_state
    save_state("chat.state", model, state)
    state = load_state("chat.state", model)       # ValueError if the file is from another model

File format: one ``torch.save`` dict (read back with ``torch.load(weights_only=True)``, so loading a
file never runs code) holding ``format``/``format_version``, the model ``fingerprint``, the list of
state tensors (on CPU) and an optional ``meta`` dict of str -> str/int/float/bool.

The fingerprint is the version, layer count, width and vocabulary size plus a few rows of the
(preprocessed) embedding matrix, compared with a tolerance so that the same checkpoint loaded with
another strategy (fp16, bf16, int8 layers, another device) is still recognised while a different
checkpoint of the same shape is refused.
"""

import os

import torch

from .files import read_bytes_to_memory, regular_file_size, save_atomic

__all__ = ["save_state", "load_state", "model_fingerprint", "StateFileError"]

FORMAT = "rwkv-state"
FORMAT_VERSION = 1
_SAMPLE_ROWS = 8


class StateFileError(ValueError):
    """The file is not a state file, is damaged, or belongs to another model."""


def _embedding(model):
    for attr in ("w", "z"):
        weights = getattr(model, attr, None)
        if isinstance(weights, dict) and isinstance(weights.get("emb.weight"), torch.Tensor):
            return weights["emb.weight"]
    raise TypeError("state_io: the model has no 'emb.weight' in model.w or model.z; is it an RWKV model?")


def model_fingerprint(model) -> dict:
    """A small dict identifying the model's weights (see the module docstring)."""
    emb = _embedding(model)
    vocab, n_embd = emb.shape[0], emb.shape[-1]
    rows = torch.linspace(0, vocab - 1, steps=min(_SAMPLE_ROWS, vocab)).round().long()
    args = getattr(model, "args", None)
    version = getattr(model, "version", 7 if hasattr(model, "z") else None)
    return {
        "version": str(version),
        "n_layer": int(getattr(args, "n_layer", getattr(model, "n_layer", -1))),
        "n_embd": int(n_embd),
        "vocab_size": int(vocab),
        "emb_rows": rows,
        "emb_sample": emb[rows.to(emb.device)].detach().float().cpu().contiguous(),
    }


def _flatten_state(state):
    if not isinstance(state, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in state):
        raise TypeError("save_state: state must be a list of tensors, as returned by model.forward")
    return [t.detach().cpu().contiguous().clone() for t in state]


def save_state(path, model, state, *, meta=None) -> str:
    """Write ``state`` with ``model``'s fingerprint to ``path`` (atomically). Returns the path."""
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "fingerprint": model_fingerprint(model),
        "state": _flatten_state(state),
        "meta": dict(meta or {}),
    }
    for k, v in payload["meta"].items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)):
            raise TypeError("save_state: meta must map str to str/int/float/bool")
    return save_atomic(payload, path)


def _read(path):
    path = os.fspath(path)
    if regular_file_size(path) is None:
        raise StateFileError(f"load_state: {path!r} is not a regular file")
    try:
        # Read into memory and closed: nothing maps the file, so it may be rewritten at any time.
        payload = torch.load(read_bytes_to_memory(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle errors, zip errors, refused globals...
        raise StateFileError(f"load_state: {path!r} is not a readable state file: {e}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise StateFileError(f"load_state: {path!r} is not an rwkv state file (written by save_state)")
    if payload.get("format_version") != FORMAT_VERSION:
        raise StateFileError(f"load_state: {path!r} has format version {payload.get('format_version')!r}; "
                             f"this rwkv reads version {FORMAT_VERSION}")
    state, fp = payload.get("state"), payload.get("fingerprint")
    if not isinstance(state, list) or not all(isinstance(t, torch.Tensor) for t in state) \
            or not isinstance(fp, dict):
        raise StateFileError(f"load_state: {path!r} is damaged (state or fingerprint missing)")
    return payload


def _check_fingerprint(saved, model, path):
    mine = model_fingerprint(model)
    for key in ("version", "n_layer", "n_embd", "vocab_size"):
        if saved.get(key) != mine[key]:
            raise StateFileError(f"load_state: {path!r} was saved from a different model: {key} is "
                                 f"{saved.get(key)!r} there but {mine[key]!r} here")
    sample = saved.get("emb_sample")
    if not isinstance(sample, torch.Tensor) or sample.shape != mine["emb_sample"].shape or \
            not torch.equal(saved.get("emb_rows"), mine["emb_rows"]):
        raise StateFileError(f"load_state: {path!r} has a damaged fingerprint")
    scale = float(mine["emb_sample"].abs().max()) or 1.0
    if not torch.allclose(sample, mine["emb_sample"], rtol=1e-2, atol=1e-2 * scale):
        raise StateFileError(f"load_state: {path!r} was saved from a different model with the same shape "
                             "(its embedding weights differ)")


def load_state(path, model, *, device=None, with_meta=False):
    """Read a state saved by ``save_state`` for ``model``. Tensors are placed like the model's own
    zero state (``model.generate_zero_state()``, checked for count, shapes and dtypes) or, for models
    without it, on ``device`` (default CPU). ``with_meta=True`` returns ``(state, meta)``."""
    payload = _read(path)
    _check_fingerprint(payload["fingerprint"], model, path)
    state = payload["state"]
    zero = model.generate_zero_state() if hasattr(model, "generate_zero_state") else None
    if zero is not None:
        if len(zero) != len(state):
            raise StateFileError(f"load_state: {path!r} holds {len(state)} tensors, the model's state has "
                                 f"{len(zero)}")
        for i, (t, z) in enumerate(zip(state, zero)):
            if t.shape != z.shape:
                raise StateFileError(f"load_state: tensor {i} of {path!r} has shape {list(t.shape)}, the "
                                     f"model expects {list(z.shape)}")
        state = [t.to(device=z.device if device is None else device, dtype=z.dtype)
                 for t, z in zip(state, zero)]
    elif device is not None:
        state = [t.to(device) for t in state]
    return (state, payload.get("meta", {})) if with_meta else state
