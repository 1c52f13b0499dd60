"""The keys and shapes each checkpoint version has, and the check of a file against them.

One table per version (``_layer_v4``, ``_layer_v5``, ``_layer_v6``, ``_layer_v7``) gives every key of a
block in the raw training layout (reference-behaviour 4.2): matrices (out, in), LoRA factors (in, out),
vectors as (C,) (files may add size-1 dimensions, e.g. (1, 1, C)). Low-rank widths are free: they are
read from the file (``w2``-style factors) and the other factor must agree. Adding a key to a model
family means adding one line to its table.

Converted files (``convert_and_save_and_exit``) hold the same tensors transformed at load time
(rwkv/convert.py): matrices transposed to (in, out), vectors squeezed, decays reshaped, ``ln0`` folded
into ``emb``, layer 0's unused v7 value-residual keys dropped, and int8 matrices stored as uint8 with
``_mx``/``_rx`` of shape (out,) and ``_my``/``_ry`` of shape (in, 1). ``check_keys_and_shapes``
checks both layouts and raises ``CheckpointError`` naming the key, its shape and the expected one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import deep_embed

# Matrices stored (out, in) in raw files and (in, out) in converted ones; int8 in converted files.
MATRIX = "matrix"
# Everything else is compared modulo size-1 dimensions (vectors, decays, LoRA factors, r_k).
OTHER = "other"
# Only the element count: decays and bonuses, which a converted file holds reshaped per head.
FLAT = "flat"

INT8_SIDES = ("_mx", "_rx", "_my", "_ry")


class CheckpointError(ValueError):
    """The file is not a usable RWKV checkpoint (corrupt, wrong keys or shapes, unsafe pickle)."""


@dataclass(frozen=True)
class Spec:
    """One expected tensor: its raw shape, whether it is a projection matrix, whether it may be absent."""

    shape: tuple
    kind: str = OTHER
    optional: bool = False
    alias: str | None = None  # another name the same tensor is stored under (e.g. time_faaaa)
    raw_only: bool = False  # used up by the conversion: absent from converted files


def _dim(sd: dict, key: str, axis: int, name: str, times: int = 1):
    """A free width read from the file (``times`` times it); where it cannot be read (the tensor is
    missing or has too few dimensions), the symbol ``name``, which no tensor matches, for messages."""
    t = sd.get(key)
    if isinstance(t, torch.Tensor) and t.dim() > axis:
        return times * int(t.shape[axis])
    return name if times == 1 else f"{times}*{name}"


def _layer_v4(info, i: int, sd: dict, p: str) -> dict:
    C, A, F = info.n_embd, info.n_att, info.n_ffn
    return {
        "att.time_decay": Spec((A,)), "att.time_first": Spec((A,)),
        "att.time_mix_k": Spec((C,)), "att.time_mix_v": Spec((C,)), "att.time_mix_r": Spec((C,)),
        "att.key.weight": Spec((A, C), MATRIX), "att.value.weight": Spec((A, C), MATRIX),
        "att.receptance.weight": Spec((A, C), MATRIX), "att.output.weight": Spec((C, A), MATRIX),
        **_ffn_classic(info, "time_mix"),
    }


def _ffn_classic(info, mix: str) -> dict:
    C, F = info.n_embd, info.n_ffn
    return {
        f"ffn.{mix}_k": Spec((C,)), f"ffn.{mix}_r": Spec((C,)),
        "ffn.key.weight": Spec((F, C), MATRIX), "ffn.receptance.weight": Spec((C, C), MATRIX),
        "ffn.value.weight": Spec((C, F), MATRIX),
    }


def _layer_v5(info, i: int, sd: dict, p: str) -> dict:
    C, A, H, N = info.n_embd, info.n_att, info.n_head, info.head_size
    s = _layer_v4(info, i, sd, p)
    per_head = (H, N) if info.version == 5.2 else (H,)
    s["att.time_decay"] = Spec(per_head)
    s["att.time_first"] = Spec(per_head, alias="att.time_faaaa")
    s.update({"att.ln_x.weight": Spec((A,)), "att.ln_x.bias": Spec((A,)),
              "att.time_state": Spec((H, N, N), optional=True)})
    if info.version >= 5.1:
        s.update({"att.time_mix_g": Spec((C,)), "att.gate.weight": Spec((A, C), MATRIX)})
    return s


def _layer_v6(info, i: int, sd: dict, p: str) -> dict:
    C, A, H, N = info.n_embd, info.n_att, info.n_head, info.head_size
    d_mix, d_dec = _dim(sd, p + "att.time_maa_w2", 1, "D_mix"), _dim(sd, p + "att.time_decay_w2", 0, "D_decay")
    s = {f"att.time_maa_{n}": Spec((C,)) for n in ("x", "w", "k", "v", "r", "g")}
    s.update({
        # The factor a width is read from comes first, so a bad one is reported as itself.
        "att.time_maa_w2": Spec((5, d_mix, C)),
        "att.time_maa_w1": Spec((C, _dim(sd, p + "att.time_maa_w2", 1, "D_mix", times=5))),
        "att.time_decay": Spec((A,)), "att.time_decay_w2": Spec((d_dec, A)),
        "att.time_decay_w1": Spec((C, d_dec)), "att.time_first": Spec((H, N), alias="att.time_faaaa"),
        "att.key.weight": Spec((A, C), MATRIX), "att.value.weight": Spec((A, C), MATRIX),
        "att.receptance.weight": Spec((A, C), MATRIX), "att.gate.weight": Spec((A, C), MATRIX),
        "att.output.weight": Spec((C, A), MATRIX), "att.ln_x.weight": Spec((A,)),
        "att.ln_x.bias": Spec((A,)), "att.time_state": Spec((H, N, N), optional=True),
        **_ffn_classic(info, "time_maa"),
    })
    return s


def _layer_v7(info, i: int, sd: dict, p: str) -> dict:
    C, F, H, N = info.n_embd, info.n_ffn, info.n_head, info.head_size
    s = {f"att.{n}": Spec((C,)) for n in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "k_k", "k_a")}
    for name in ("w", "a", "v", "g"):
        width = _dim(sd, f"{p}att.{name}2", 0, f"D_{name}")
        s[f"att.{name}2"] = Spec((width, C))  # first: the width is read from it
        s[f"att.{name}1"] = Spec((C, width))
    s["att.v0"] = Spec((C,))
    if i == 0:  # layer 0 has no value residual: its v0/v1/v2 may be present (unused) or absent
        for name in ("v0", "v1", "v2"):
            s[f"att.{name}"] = Spec(s[f"att.{name}"].shape, optional=True, raw_only=True)
    s.update({
        "att.r_k": Spec((H, N)),
        "att.receptance.weight": Spec((C, C), MATRIX), "att.key.weight": Spec((C, C), MATRIX),
        "att.value.weight": Spec((C, C), MATRIX), "att.output.weight": Spec((C, C), MATRIX),
        "att.ln_x.weight": Spec((C,)), "att.ln_x.bias": Spec((C,)),
        "att.time_state": Spec((H, N, N), optional=True),
        "ffn.x_k": Spec((C,)), "ffn.key.weight": Spec((F, C), MATRIX), "ffn.value.weight": Spec((C, F), MATRIX),
    })
    if info.deep_embed:  # the projection is merged into the table by the conversion
        for suffix, shape in deep_embed.expected_shapes(C, F, info.vocab_size, converted=False).items():
            s[suffix] = Spec(shape, raw_only=suffix == deep_embed.EMB_PROJECTION)
    return s


def layer_specs(info, i: int, sd: dict) -> dict:
    """``{suffix: Spec}`` for block ``i`` (keys are ``f"blocks.{i}.{suffix}"``)."""
    table = {4: _layer_v4, 6: _layer_v6, 7: _layer_v7}.get(info.version, _layer_v5)
    s = {"ln1.weight": Spec((info.n_embd,)), "ln1.bias": Spec((info.n_embd,)),
         "ln2.weight": Spec((info.n_embd,)), "ln2.bias": Spec((info.n_embd,))}
    if i == 0:  # folded into emb.weight by the conversion
        s["ln0.weight"] = Spec((info.n_embd,), raw_only=True)
        s["ln0.bias"] = Spec((info.n_embd,), raw_only=True)
    s.update(table(info, i, sd, f"blocks.{i}."))
    return s


def model_specs(info, sd: dict) -> dict:
    """``{key: Spec}`` for the whole raw checkpoint."""
    V, C = info.vocab_size, info.n_embd
    specs = {"emb.weight": Spec((V, C)), "ln_out.weight": Spec((C,)), "ln_out.bias": Spec((C,)),
             "head.weight": Spec((V, C), MATRIX)}
    for i in range(info.n_layer):
        specs.update({f"blocks.{i}.{k}": v for k, v in layer_specs(info, i, sd).items()})
    return specs


def _no_ones(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s if isinstance(s, int) else -1
    return n


def _shape_error(path, key, t, want, note=""):
    return CheckpointError(f"RWKV: {path!r}: {key} has shape {list(t.shape)}, expected {list(want)}{note}")


def _check_raw(path: str, key: str, t: torch.Tensor, spec: Spec) -> None:
    if not t.is_floating_point():
        raise CheckpointError(f"RWKV: {path!r}: {key} has dtype {t.dtype}, expected a floating-point tensor")
    if spec.kind == MATRIX:
        if tuple(t.shape) != spec.shape:
            raise _shape_error(path, key, t, spec.shape, " (out_features, in_features)")
    elif spec.kind == FLAT:
        if t.numel() != _numel(spec.shape):
            raise _shape_error(path, key, t, spec.shape, " (any layout of that many elements)")
    elif any(isinstance(d, str) for d in spec.shape) or _no_ones(t.shape) != _no_ones(spec.shape):
        raise _shape_error(path, key, t, spec.shape)


def _check_converted(path: str, key: str, t: torch.Tensor, spec: Spec, sd: dict, sides: set) -> None:
    if spec.kind != MATRIX:
        _check_raw(path, key, t, spec)
        return
    want = spec.shape[::-1]  # (in, out)
    if t.dim() != 2 or tuple(t.shape) != want:
        raise _shape_error(path, key, t, want, " (in_features, out_features) in a converted file")
    if t.dtype != torch.uint8:
        _check_raw(path, key, t, Spec(want, MATRIX))
        return
    n_in, n_out = want
    for suffix, shape in zip(INT8_SIDES, ((n_out,), (n_out,), (n_in, 1), (n_in, 1))):
        side = key + suffix
        s = sd.get(side)
        if not isinstance(s, torch.Tensor):
            raise CheckpointError(f"RWKV: {path!r}: the int8 matrix {key} has no {side!r} (converted int8 "
                                  f"matrices carry {', '.join(INT8_SIDES)})")
        if not s.is_floating_point() or tuple(s.shape) != shape:
            raise CheckpointError(f"RWKV: {path!r}: {side} has shape {list(s.shape)} and dtype {s.dtype}, "
                                  f"expected a floating-point tensor of shape {list(shape)}")
        sides.add(side)


def _converted_form(key: str, spec: Spec) -> tuple[str, Spec] | None:
    """The key and spec a raw tensor has in a converted file (None: the conversion drops it)."""
    if spec.raw_only:
        return None
    if key.endswith((".time_decay", ".time_first")):
        return key, Spec(spec.shape, FLAT, spec.optional, spec.alias)  # reshaped per head
    return key, spec


def check_keys_and_shapes(sd: dict, info, path: str, ignore=()) -> None:
    """Every key the version needs is present with its shape and dtype, and no other key is there.

    ``ignore``: non-tensor metadata keys. Raises ``CheckpointError`` naming the first problem."""
    specs = model_specs(info, sd)
    if info.converted:
        specs = dict(f for k, s in specs.items() if (f := _converted_form(k, s)) is not None)
    seen, sides = set(ignore), set()
    names = {}
    for key, spec in specs.items():  # every missing key first, then shapes
        name = key
        if key not in sd and spec.alias is not None:
            name = key[: key.index("att.")] + spec.alias
        if name in sd:
            names[key] = name
        elif not spec.optional:
            raise CheckpointError(f"RWKV: {path!r} is missing the key {key!r} (expected shape "
                                  f"{list(spec.shape)}); is this an RWKV-{info.version} checkpoint?")
    for key, name in names.items():
        spec, t = specs[key], sd[name]
        seen.add(name)
        if info.converted:
            _check_converted(path, name, t, spec, sd, sides)
        else:
            _check_raw(path, name, t, spec)
    extra = [k for k in sd if k not in seen and k not in sides]
    if extra:
        shown = ", ".join(repr(k) for k in extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise CheckpointError(f"RWKV: {path!r} has keys an RWKV-{info.version} checkpoint of {info.n_layer} "
                              f"layers does not have: {shown}")
