"""Turn a checkpoint's raw tensors into the weights a strategy asks for, as upstream does at load.

The result is a dict with upstream's names (``model.w``): matrices transposed to (in, out) views,
decays transformed in fp32, int8 matrices quantized with their ``_mx/_rx/_my/_ry`` side tensors,
everything else cast to its layer's activation dtype (reference-behaviour 4.4). v7 follows the same
shape (upstream's v7 class keeps everything in one dtype; ours honours per-layer placements and int8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import deep_embed
from .loading import CONVERTED_META_KEYS, CheckpointError, ModelInfo
from .quant import quantize_int8
from .strategy import LayerPlacement

_MATRIX_NAMES = ("key.weight", "value.weight", "receptance.weight", "gate.weight", "output.weight",
                 "head.weight")
# Matrices that stream (*N+) layers keep in CPU memory and copy to the device per call (upstream:
# not gate, not head).
STREAM_NAMES = ("key.weight", "value.weight", "receptance.weight", "output.weight")
CONVERTED_FORMAT_VERSION = "0.7"


def slot_of(key: str, n_layer: int) -> int:
    """Upstream's slot rule: ``ln_out.*`` and ``head.*`` live in the head slot ``n_layer``."""
    if "ln_out." in key or "head." in key:
        return n_layer
    if key.startswith("blocks."):
        return int(key.split(".")[1])
    return 0


def _is_matrix(key: str) -> bool:
    return any(name in key for name in _MATRIX_NAMES)


def _fold_ln0(sd: dict, dtype: torch.dtype | None) -> torch.Tensor:
    """``emb = LN(emb; ln0)``: in the stored dtype for classic models (upstream), in the activation
    dtype of slot 0 for v7 (upstream's v7 class casts first)."""
    emb = sd["emb.weight"]
    if dtype is not None:
        emb = emb.to(dtype)
    w, b = sd["blocks.0.ln0.weight"].to(emb.dtype), sd["blocks.0.ln0.bias"].to(emb.dtype)
    try:
        return F.layer_norm(emb, (emb.shape[-1],), weight=w, bias=b)
    except RuntimeError:  # old torch without half/bf16 CPU layer norm: upstream retries in fp32
        return F.layer_norm(emb.float(), (emb.shape[-1],), weight=w.float(), bias=b.float())


def _store_matrix(w: dict, key: str, mat: torch.Tensor, dd: LayerPlacement, side_order: list) -> None:
    if dd.quant == "i8":
        q, order = quantize_int8(mat, dd.atype)
        w[key] = q.q
        for suffix in order:
            side_order.append(key + suffix)
        w[key + "_mx"], w[key + "_rx"], w[key + "_my"], w[key + "_ry"] = q.mx, q.rx, q.my, q.ry
    else:
        w[key] = mat.to(dtype=dd.atype)


def convert_classic(sd: dict, info: ModelInfo, plan: list[LayerPlacement], rescale: int) -> dict:
    """Load-time transforms for v4/v5.x/v6 raw checkpoints (reference-behaviour 4.4, in order)."""
    L, version = info.n_layer, info.version
    H = info.n_head
    out: dict = {}
    side_keys: list = []
    emb = _fold_ln0(sd, None)
    for key, t in sd.items():
        if key.startswith("blocks.0.ln0.") or key in CONVERTED_META_KEYS:
            continue
        if key == "emb.weight":
            t = emb
        key = key.replace(".time_faaaa", ".time_first")
        layer = slot_of(key, L)
        dd = plan[layer]
        if rescale > 0 and ("att.output.weight" in key or "ffn.value.weight" in key):
            t = t / (2 ** int(layer // rescale))
        if ".time_" in key:
            t = t.squeeze()
        if _is_matrix(key):
            t = t.t()
        if ".time_decay" in key and "_w" not in key:
            d = t.float()
            if version == 4:
                t = -torch.exp(d)
            elif int(version) == 5:
                t = torch.exp(-torch.exp(d)).reshape(-1, 1, 1)
                if version == 5.2:
                    t = t.reshape(H, -1, 1)
            else:
                t = d.reshape(H, -1, 1)
        elif ".time_first" in key:
            f = t.float()
            if version == 4:
                t = f
            else:
                t = (f if info.real_time_first else torch.exp(f)).reshape(-1, 1, 1)
                if version >= 5.2:
                    t = t.reshape(H, -1, 1)
        elif ".ln_x" in key:
            t = t.float()
        elif t.dim() == 2 and "emb" not in key and "_w1" not in key and "_w2" not in key:
            _store_matrix(out, key, t, dd, side_keys)
            continue
        else:
            t = t.to(dtype=dd.atype)
        out[key] = t
    # Upstream inserts the int8 side tensors after all original keys, in creation order.
    sides = {k: out.pop(k) for k in side_keys}
    out.update(sides)
    return out


def _merge_device(device: str) -> torch.device | None:
    """Where a layer's DeepEmbed merge (a V x C x 1024 GEMM) runs: its CUDA device when this
    machine has it, else None (the CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count():
        return dev
    return None


def convert_v7(sd: dict, info: ModelInfo, plan: list[LayerPlacement]) -> dict:
    """Load-time transforms for v7 (reference-behaviour 4.8), per layer placement."""
    L = info.n_layer
    out: dict = {}
    side_keys: list = []
    out["emb.weight"] = _fold_ln0(sd, plan[0].atype).contiguous()
    for key, t in sd.items():
        if key == "emb.weight" or key.startswith("blocks.0.ln0.") or key in CONVERTED_META_KEYS:
            continue
        if key.endswith(deep_embed.EMB_PROJECTION):
            continue  # merged into the layer's table below, then unused
        if key.endswith(deep_embed.TABLE):
            i = slot_of(key, L)
            proj = sd[f"blocks.{i}.{deep_embed.EMB_PROJECTION}"]
            out[key] = deep_embed.merge_table(t, out["emb.weight"], proj, plan[i].atype,
                                              _merge_device(plan[i].device))
            continue
        if key.startswith("blocks.0.att.v") and key[len("blocks.0.att.v"):] in ("0", "1", "2"):
            continue  # layer 0 has no value residual; upstream empties these
        dd = plan[slot_of(key, L)]
        if key.endswith(".time_state"):
            out[key] = t.float().contiguous()  # an initial state: kept in fp32
            continue
        if key.endswith("att.r_k"):
            out[key] = t.to(dtype=dd.atype)  # (H, N): the head layout is read from here
            continue
        t = t.squeeze() if not _is_matrix(key) else t
        if _is_matrix(key):
            if dd.quant == "i8":
                _store_matrix(out, key, t.t(), dd, side_keys)  # column-major (in, out) for mm8
            else:
                out[key] = t.t().to(dtype=dd.atype)  # column-major (in, out) view, as classic
            continue
        out[key] = t.to(dtype=dd.atype)
    sides = {k: out.pop(k) for k in side_keys}
    out.update(sides)
    return out


def check_converted(sd: dict, strategy_string: str, rescale: int, path: str) -> dict:
    """Validate a pre-converted file against the requested strategy and return its weights."""
    want, got = sd.get("_strategy"), strategy_string
    if want != got:
        raise CheckpointError(
            f"RWKV: {path!r} was converted for strategy {want!r}; it can only be loaded with exactly "
            f"that strategy (got {got!r}). Load the original checkpoint, or convert it again for "
            "this strategy.")
    try:
        fmt = float(sd.get("_version", "0"))
    except (TypeError, ValueError):
        fmt = 0.0
    if fmt < 0.7:
        raise CheckpointError(f"RWKV: {path!r} is a converted file of format {sd.get('_version')!r}; "
                              "only format 0.7 and later can be loaded. Convert the original again.")
    if sd.get("_rescale_layer") != rescale:
        raise CheckpointError(
            f"RWKV: {path!r} was converted with RWKV_RESCALE_LAYER={sd.get('_rescale_layer')}, but this "
            f"load uses {rescale}. Set RWKV_RESCALE_LAYER={sd.get('_rescale_layer')} (or pass "
            "rescale_layer=...) to load it.")
    return {k: v for k, v in sd.items() if k not in CONVERTED_META_KEYS}


def converted_payload(w: dict, strategy_string: str, rescale: int) -> dict:
    """What ``convert_and_save_and_exit`` writes: the transformed weights plus upstream's metadata."""
    payload = {k: (v.contiguous() if k == "emb.weight" else v) for k, v in w.items()}
    payload["_strategy"] = strategy_string
    payload["_rescale_layer"] = rescale
    payload["_version"] = CONVERTED_FORMAT_VERSION
    return payload
