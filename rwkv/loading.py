"""Read a checkpoint safely and describe it: version, sizes, and whether it was pre-converted.

Data flow: ``resolve_path`` -> ``read_checkpoint`` (``weights_only=True``, mmap where possible, or
safetensors) -> ``inspect_checkpoint`` (version detection from the keys, dimensions, key/shape
validation). Nothing here depends on the strategy; ``rwkv.convert`` turns the raw tensors into the
per-layer weights a strategy asks for.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass

import torch

from . import deep_embed

# Keys a pre-converted file (upstream's ``convert_and_save_and_exit``) carries besides tensors.
CONVERTED_META_KEYS = ("_strategy", "_rescale_layer", "_version")

SUPPORTED_VERSIONS = (4, 5, 5.1, 5.2, 6, 7)


class CheckpointError(ValueError):
    """The file is not a usable RWKV checkpoint (corrupt, wrong keys or shapes, unsafe pickle)."""


@dataclass(frozen=True)
class ModelInfo:
    """What a checkpoint is. ``version`` is 4, 5, 5.1, 5.2, 6 or 7 (upstream's numbering)."""

    version: float
    n_layer: int
    n_embd: int
    n_att: int
    n_ffn: int
    vocab_size: int
    n_head: int | None  # None for v4
    head_size: int | None
    converted: bool  # pre-converted by convert_and_save_and_exit (weights already transformed)
    has_time_state: bool
    real_time_first: bool  # the bonus is stored as time_faaaa (or already renamed in a converted file)
    deep_embed: bool = False  # a DeepEmbed v7 checkpoint (rwkv/deep_embed.py)

    @property
    def version_label(self) -> str:
        return f"v{float(self.version):.1f}"


def resolve_path(model: str | os.PathLike) -> str:
    """Upstream's rule: strip whitespace, append ``.pth`` unless the name already ends with it.

    ``.safetensors`` files are taken as they are. A v7 name given with ``.pth`` is accepted too
    (upstream's v7 class would look for ``x.pth.pth``).
    """
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"RWKV: model must be a path (str or os.PathLike), got {type(model).__name__}")
    path = os.fspath(model).strip()
    if not path:
        raise ValueError("RWKV: model path is empty")
    if not path.endswith((".pth", ".safetensors")):
        if os.path.exists(path + ".pth") or not os.path.exists(path + ".safetensors"):
            path = path + ".pth"
        else:
            path = path + ".safetensors"
    if not os.path.exists(path):
        raise FileNotFoundError(f"RWKV: checkpoint not found: {path!r} (the model path may be given "
                                "with or without '.pth')")
    if os.path.isdir(path):
        raise IsADirectoryError(f"RWKV: checkpoint path {path!r} is a directory, expected a .pth file")
    return path


def read_checkpoint(path: str) -> dict:
    """Load a flat ``name -> Tensor`` dict without executing any pickled code."""
    if path.endswith(".safetensors"):
        return _read_safetensors(path)
    try:
        use_mmap = zipfile.is_zipfile(path)  # mmap needs the zip format (torch >= 1.6 files)
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=use_mmap)
    except pickle.UnpicklingError as e:
        detail = _unpickler_detail(e)
        if "GLOBAL" not in detail:
            raise CheckpointError(f"RWKV: {path!r} is not a readable PyTorch checkpoint ({detail})") from None
        raise CheckpointError(
            f"RWKV: refused to load {path!r}: it contains pickled objects other than tensors and "
            f"plain values, which could run code when unpickled ({detail}). Only plain "
            "checkpoints (a dict of tensors) are loaded.") from None
    except Exception as e:  # noqa: BLE001 - torch's unpickler raises anything (IndexError, KeyError...) on garbage
        if isinstance(e, (FileNotFoundError, PermissionError)):
            raise
        raise CheckpointError(f"RWKV: {path!r} is not a readable PyTorch checkpoint "
                              f"({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(sd, dict):
        raise CheckpointError(f"RWKV: {path!r} holds a {type(sd).__name__}, expected a dict of tensors "
                              "(name -> Tensor) as saved by RWKV training")
    for k, v in sd.items():
        if not isinstance(k, str):
            raise CheckpointError(f"RWKV: {path!r} has a non-string key {k!r}")
        if k in CONVERTED_META_KEYS:
            continue
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"RWKV: {path!r}: entry {k!r} is a {type(v).__name__}, expected a Tensor")
    return sd


def _read_safetensors(path: str) -> dict:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ImportError("RWKV: loading .safetensors needs the 'safetensors' package "
                          "(pip install safetensors)") from None
    try:
        return dict(load_file(path, device="cpu"))
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"RWKV: {path!r} is not a readable safetensors file ({_first_line(e)})") from None


def _unpickler_detail(e: BaseException) -> str:
    """The informative line of torch's weights-only unpickler error (it wraps it in advice)."""
    for line in str(e).splitlines():
        if "GLOBAL" in line or "Unsupported" in line or "Unpickler error" in line and line.strip()[-1] != ":":
            return line.strip()[:300]
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _layer_of(key: str) -> int | None:
    if not key.startswith("blocks."):
        return None
    part = key.split(".")[1]
    if not part.isdigit():
        raise CheckpointError(f"RWKV: malformed key {key!r}: expected 'blocks.<layer>.<name>'")
    return int(part)


def detect_version(sd: dict) -> float:
    """Version from the key set. Unlike upstream this does not depend on key order, so 1-layer v5
    models and converted files are recognised too; for ordinary checkpoints the result is the same."""
    keys = [k for k in sd if k not in CONVERTED_META_KEYS]
    if any(k.endswith("att.r_k") for k in keys):
        return 7
    if any("time_maa" in k for k in keys):
        return 6
    if any("ln_x" in k for k in keys):
        decay = sd.get("blocks.0.att.time_decay")
        if decay is not None and decay.dim() >= 2 and decay.shape[1] > 1:
            return 5.2
        if any("gate.weight" in k for k in keys):
            return 5.1
        return 5
    return 4


def _require(sd: dict, key: str, shape: tuple | None, path: str) -> torch.Tensor:
    if key not in sd:
        raise CheckpointError(f"RWKV: {path!r} is missing the key {key!r}; is this an RWKV checkpoint "
                              "of the detected version?")
    t = sd[key]
    if shape is not None:
        got = tuple(t.shape)
        want_numel = 1
        for s in shape:
            want_numel *= s
        # Raw files store time_* vectors as (1, 1, C); converted ones squeeze them. Compare modulo
        # size-1 dimensions, and the transposed layout of converted matrices is handled by callers.
        if tuple(s for s in got if s != 1) != tuple(s for s in shape if s != 1) or t.numel() != want_numel:
            raise CheckpointError(f"RWKV: {path!r}: {key} has shape {list(got)}, expected {list(shape)}")
    if not (t.is_floating_point() or t.dtype == torch.uint8):
        raise CheckpointError(f"RWKV: {path!r}: {key} has dtype {t.dtype}, expected a floating-point tensor")
    return t


def inspect_checkpoint(sd: dict, path: str = "<checkpoint>") -> ModelInfo:
    """Detect version and dimensions, and validate that every key the forward pass needs exists
    with a consistent shape. Raises CheckpointError naming the key."""
    converted = "_strategy" in sd
    if "emb.weight" not in sd:
        raise CheckpointError(f"RWKV: {path!r} has no 'emb.weight': not an RWKV checkpoint "
                              f"(first keys: {list(sd)[:5]})")
    version = detect_version(sd)
    layers = [_layer_of(k) for k in sd if k not in CONVERTED_META_KEYS]
    n_layer = max((x for x in layers if x is not None), default=-1) + 1
    if n_layer == 0:
        raise CheckpointError(f"RWKV: {path!r} has no 'blocks.N.*' keys: not an RWKV checkpoint")
    emb = sd["emb.weight"]
    if emb.dim() != 2:
        raise CheckpointError(f"RWKV: {path!r}: emb.weight must be 2-D (vocab, n_embd), got {list(emb.shape)}")
    vocab, C = emb.shape
    key_w = sd.get("blocks.0.att.key.weight")
    ffn_w = sd.get("blocks.0.ffn.key.weight")
    if key_w is None or ffn_w is None:
        raise CheckpointError(f"RWKV: {path!r} is missing blocks.0.att.key.weight or "
                              "blocks.0.ffn.key.weight")
    # Raw files store (out, in); converted ones (in, out).
    n_att = key_w.shape[1] if converted else key_w.shape[0]
    n_ffn = ffn_w.shape[1] if converted else ffn_w.shape[0]
    n_head = head_size = None
    if version == 7:
        r_k = _require(sd, "blocks.0.att.r_k", None, path)
        n_head, head_size = (r_k.shape if r_k.dim() == 2 else (None, None))
        if n_head is None or n_head * head_size != C:
            raise CheckpointError(f"RWKV: {path!r}: blocks.0.att.r_k has shape {list(r_k.shape)}, expected "
                                  f"(n_head, head_size) with n_head*head_size = n_embd = {C}")
    elif version >= 5:
        bonus_key = "time_faaaa" if "blocks.0.att.time_faaaa" in sd else "time_first"
        src = sd.get(f"blocks.0.att.{bonus_key}") if version >= 6 else sd.get("blocks.0.att.time_decay")
        if src is None:
            raise CheckpointError(f"RWKV: {path!r} is missing blocks.0.att.{bonus_key if version >= 6 else 'time_decay'}")
        n_head = src.shape[0]
        if n_head <= 0 or n_att % n_head:
            raise CheckpointError(f"RWKV: {path!r}: n_head {n_head} does not divide n_att {n_att}")
        head_size = n_att // n_head
    info = ModelInfo(version=version, n_layer=n_layer, n_embd=C, n_att=n_att, n_ffn=n_ffn, vocab_size=vocab,
                     n_head=n_head, head_size=head_size, converted=converted,
                     has_time_state=any(k.endswith(".time_state") for k in sd),
                     real_time_first=any(".time_faaaa" in k for k in sd) or (converted and version >= 5.2),
                     deep_embed=deep_embed.is_deep_embed(sd))
    if info.deep_embed and version != 7:
        raise CheckpointError(f"RWKV: {path!r} has DeepEmbed keys (ffn.s_emb.weight) but is a "
                              f"v{version} checkpoint; DeepEmbed exists only for RWKV-7")
    _validate_shapes(sd, info, path)
    return info


def _expected_shapes(info: ModelInfo, i: int) -> dict:
    """Key suffix -> expected raw shape (out, in for matrices) for block i."""
    C, A, F, V = info.n_embd, info.n_att, info.n_ffn, info.vocab_size
    H, N = info.n_head, info.head_size
    vec = (C,)
    s = {"ln1.weight": vec, "ln1.bias": vec, "ln2.weight": vec, "ln2.bias": vec}
    if info.version == 7:
        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "k_k", "k_a"):
            s[f"att.{name}"] = vec
        if i > 0:
            s["att.v0"] = vec
        s.update({"att.r_k": (H, N), "att.receptance.weight": (C, C), "att.key.weight": (C, C),
                  "att.value.weight": (C, C), "att.output.weight": (C, C), "att.ln_x.weight": vec,
                  "att.ln_x.bias": vec, "ffn.x_k": vec, "ffn.key.weight": (F, C), "ffn.value.weight": (C, F)})
        if info.deep_embed:
            s.update(deep_embed.expected_shapes(C, F, V, info.converted))
        return s
    s.update({"att.key.weight": (A, C), "att.value.weight": (A, C), "att.receptance.weight": (A, C),
              "att.output.weight": (C, A), "ffn.key.weight": (F, C), "ffn.receptance.weight": (C, C),
              "ffn.value.weight": (C, F)})
    if info.version >= 5:
        s.update({"att.ln_x.weight": (A,), "att.ln_x.bias": (A,)})
    if info.version >= 5.1:
        s["att.gate.weight"] = (A, C)
    if info.version == 6:
        for name in ("time_maa_x", "time_maa_w", "time_maa_k", "time_maa_v", "time_maa_r", "time_maa_g"):
            s[f"att.{name}"] = vec
        s.update({"ffn.time_maa_k": vec, "ffn.time_maa_r": vec})
    else:
        for name in ("time_mix_k", "time_mix_v", "time_mix_r") + (("time_mix_g",) if info.version >= 5.1 else ()):
            s[f"att.{name}"] = vec
        s.update({"ffn.time_mix_k": vec, "ffn.time_mix_r": vec})
    return s


def _validate_shapes(sd: dict, info: ModelInfo, path: str) -> None:
    _require(sd, "ln_out.weight", (info.n_embd,), path)
    _require(sd, "ln_out.bias", (info.n_embd,), path)
    head = _require(sd, "head.weight", None, path)
    if head.dim() != 2 or sorted(head.shape) != sorted((info.vocab_size, info.n_embd)):
        raise CheckpointError(f"RWKV: {path!r}: head.weight has shape {list(head.shape)}, expected "
                              f"[{info.vocab_size}, {info.n_embd}]")
    if not info.converted:
        _require(sd, "blocks.0.ln0.weight", (info.n_embd,), path)
        _require(sd, "blocks.0.ln0.bias", (info.n_embd,), path)
    for i in range(info.n_layer):
        for suffix, shape in _expected_shapes(info, i).items():
            t = _require(sd, f"blocks.{i}.{suffix}", None, path)
            if (t.dim() == 2 and info.converted and suffix.endswith(".weight") and "ln" not in suffix
                    and suffix != deep_embed.TABLE):
                shape = shape[::-1]  # converted files store matrices as (in, out); tables stay (V, 1024)
            if t.dtype == torch.uint8:
                continue  # int8 matrices of a converted file; their side tensors are checked at use
            _require(sd, f"blocks.{i}.{suffix}", shape, path)
