"""Read a checkpoint safely and describe it: version, sizes, and whether it was pre-converted.

Data flow: ``resolve_path`` -> ``read_checkpoint`` (``weights_only=True``, mmap where possible, or
safetensors) -> ``inspect_checkpoint`` (version detection from the keys, dimensions, key/shape
validation). Nothing here depends on the strategy; ``rwkv.convert`` turns the raw tensors into the
per-layer weights a strategy asks for.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import zipfile
from dataclasses import dataclass

import torch

from . import deep_embed
from .checkpoint_schema import CheckpointError, check_keys_and_shapes
from .files import read_bytes_to_memory, regular_file_size

# Keys a pre-converted file (upstream's ``convert_and_save_and_exit``) carries besides tensors.
CONVERTED_META_KEYS = ("_strategy", "_rescale_layer", "_version")

SUPPORTED_VERSIONS = (4, 5, 5.1, 5.2, 6, 7)


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


def read_checkpoint(path: str, *, mmap: bool = False) -> dict:
    """Load a flat ``name -> Tensor`` dict without executing any pickled code.

    The file is read into memory and closed: nothing refers to it afterwards. ``mmap=True`` maps
    zip-format ``.pth`` files instead (tensors are views of the file's pages; see ``open_checkpoint``)."""
    return open_checkpoint(path, mmap=mmap)[0]


def open_checkpoint(path: str, *, mmap: bool = True) -> tuple[dict, bool]:
    """``(tensors, mapped)``: as ``read_checkpoint``; ``mapped`` says whether the tensors are views of a
    mapping of the file, which the caller must copy out of (``copy_out_of_mapping``) before the file
    may be rewritten: a file truncated under a mapping makes the next read of it fault (SIGBUS)."""
    size = regular_file_size(path)
    if size is None:
        raise CheckpointError(f"RWKV: {path!r} is not a regular file (a device, FIFO or socket, or a link "
                              "to one); a checkpoint must be a file")
    if size == 0:
        raise CheckpointError(f"RWKV: {path!r} is empty (0 bytes)")
    if path.endswith(".safetensors"):
        return _read_safetensors(path, size), False
    try:
        use_mmap = mmap and zipfile.is_zipfile(path)  # mmap needs the zip format (torch >= 1.6 files)
        source = path if use_mmap else read_bytes_to_memory(path)
        sd = torch.load(source, map_location="cpu", weights_only=True, mmap=use_mmap)
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
    return sd, use_mmap


def copy_out_of_mapping(w: dict, sd: dict) -> int:
    """Replace every CPU tensor of ``w`` whose memory lies in the file mapping that ``sd``'s tensors
    (from ``open_checkpoint(..., mmap=True)``) view by a private copy with the same strides, so that
    nothing refers to the file once ``sd`` is dropped. Returns the number of bytes copied."""
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in sd.values()
             if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().nbytes()]
    if not spans:
        return 0
    lo, hi = min(p for p, _ in spans), max(p + n for p, n in spans)
    copied = 0
    for key, t in w.items():
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and lo <= t.untyped_storage().data_ptr() < hi:
            w[key] = t.clone()  # dense tensors keep their strides (torch.preserve_format)
            copied += t.numel() * t.element_size()
    return copied


def _read_safetensors(path: str, size: int) -> dict:
    """The whole file is read into memory first (``safetensors.torch.load`` copies out of it), so no
    tensor refers to the file afterwards."""
    try:
        from safetensors.torch import load
    except ImportError:
        raise ImportError("RWKV: loading .safetensors needs the 'safetensors' package "
                          "(pip install safetensors)") from None
    data = read_bytes_to_memory(path).getvalue()
    _check_safetensors_header(path, data, size)
    try:
        return dict(load(data))
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"RWKV: {path!r} is not a readable safetensors file ({_first_line(e)})") from None


def _check_safetensors_header(path: str, data: bytes, size: int) -> None:
    """The 8-byte header length and the JSON header's data offsets must account for the file's size."""
    if len(data) != size:
        raise CheckpointError(f"RWKV: {path!r} changed while it was read ({size} bytes, then {len(data)})")
    if size < 8:
        raise CheckpointError(f"RWKV: {path!r} is {size} bytes long, shorter than a safetensors header")
    n = int.from_bytes(data[:8], "little")
    if n > size - 8:
        raise CheckpointError(f"RWKV: {path!r}: its safetensors header claims {n} bytes, but the file has "
                              f"only {size - 8} after the length field (truncated or not safetensors)")
    try:
        header = json.loads(data[8:8 + n])
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"RWKV: {path!r}: its safetensors header is not valid JSON with data_offsets "
                              f"({type(e).__name__}: {_first_line(e)})") from None
    if end != size - 8 - n:
        raise CheckpointError(f"RWKV: {path!r}: its safetensors header describes {end} bytes of tensor data, "
                              f"but the file holds {size - 8 - n} (truncated or padded)")


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


def _require(sd: dict, key: str, path: str) -> torch.Tensor:
    if key not in sd:
        raise CheckpointError(f"RWKV: {path!r} is missing the key {key!r}; is this an RWKV checkpoint "
                              "of the detected version?")
    return sd[key]


def _matrix(sd: dict, key: str, path: str) -> torch.Tensor:
    t = _require(sd, key, path)
    if t.dim() != 2:
        raise CheckpointError(f"RWKV: {path!r}: {key} has shape {list(t.shape)}, expected a 2-D matrix")
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
    present = {x for x in layers if x is not None}
    if len(present) != n_layer:
        gap = min(set(range(len(present) + 1)) - present)
        raise CheckpointError(f"RWKV: {path!r} has keys of block {n_layer - 1} but none of block {gap}: the "
                              f"blocks must be numbered 0..{n_layer - 1}")
    emb = sd["emb.weight"]
    if emb.dim() != 2 or 0 in emb.shape:
        raise CheckpointError(f"RWKV: {path!r}: emb.weight must be 2-D (vocab, n_embd), got {list(emb.shape)}")
    vocab, C = emb.shape
    key_w = _matrix(sd, "blocks.0.att.key.weight", path)
    ffn_w = _matrix(sd, "blocks.0.ffn.key.weight", path)
    # Raw files store (out, in); converted ones (in, out).
    n_att = key_w.shape[1] if converted else key_w.shape[0]
    n_ffn = ffn_w.shape[1] if converted else ffn_w.shape[0]
    n_head = head_size = None
    if version == 7:
        r_k = _require(sd, "blocks.0.att.r_k", path)
        n_head, head_size = (r_k.shape if r_k.dim() == 2 else (None, None))
        if n_head is None or n_head * head_size != C:
            raise CheckpointError(f"RWKV: {path!r}: blocks.0.att.r_k has shape {list(r_k.shape)}, expected "
                                  f"(n_head, head_size) with n_head*head_size = n_embd = {C}")
    elif version >= 5:
        bonus_key = "time_faaaa" if "blocks.0.att.time_faaaa" in sd else "time_first"
        src = sd.get(f"blocks.0.att.{bonus_key}") if version >= 6 else sd.get("blocks.0.att.time_decay")
        if src is None:
            raise CheckpointError(f"RWKV: {path!r} is missing blocks.0.att.{bonus_key if version >= 6 else 'time_decay'}")
        n_head = src.shape[0] if src.dim() >= 1 else 0
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


def _validate_shapes(sd: dict, info: ModelInfo, path: str) -> None:
    head = sd.get("head.weight")
    if isinstance(head, torch.Tensor) and head.dim() == 2 and sorted(head.shape) != sorted((info.vocab_size,
                                                                                             info.n_embd)):
        raise CheckpointError(f"RWKV: {path!r}: head.weight has shape {list(head.shape)}, expected "
                              f"[{info.vocab_size}, {info.n_embd}]")
    check_keys_and_shapes(sd, info, path, ignore=CONVERTED_META_KEYS)


def check_finite(sd: dict, path: str) -> None:
    """Every floating-point tensor holds only finite values (a NaN or inf weight makes every logit
    NaN). ``torch.aminmax`` reads each tensor once without a temporary (NaN propagates into it, an
    infinity is its min or max): several GB/s, where ``isfinite(t).all()`` manages a few hundred
    MB/s. The position is looked for only when a tensor fails."""
    for key, t in sd.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            continue
        lo, hi = torch.aminmax(t)
        if math.isfinite(float(lo)) and math.isfinite(float(hi)):
            continue
        flat = t.reshape(-1)
        bad = int((~torch.isfinite(flat)).nonzero()[0, 0])
        raise CheckpointError(f"RWKV: {path!r}: {key} holds a non-finite value "
                              f"({float(flat[bad])} at flat index {bad}); the checkpoint is damaged")
