"""The ``rwkv`` torch ops: typed wrappers, implementation choice and backend report.

Importing this module defines the op schemas (torch.library) and nothing else: ``rwkv._C`` is
loaded on first use and never compiled at run time. Each wrapper resolves the op for its input's
device (``resolve(name, device_type, mode)``, cached) and calls it. See docs/kernels.md.
"""

from __future__ import annotations

import torch

from . import _schemas, reference
from ._backend import MODES, backend_report, cpu_read_order, cpu_isa, resolve
from ._schemas import OPS

__all__ = ["MODES", "OPS", "backend_report", "cpu_read_order", "cpu_isa", "gemm_fp16", "linear_one", "linear_one_group", "linear_one_chain", "linear_one_slabs", "linear_one_residual", "linear_one_ffn", "ln_mix", "ln_mix_split", "maa_mix", "maa_mix_split", "maa_lora_one", "mm8", "mm8_one",
           "mm8_one_i16", "mm8_seq", "pooled_empty_like", "reference", "resolve", "wkv4", "wkv4_block", "wkv5", "wkv6", "wkv6_block", "wkv7", "wkv7_block"]

Tensor = torch.Tensor


def wkv4(w: Tensor, u: Tensor, k: Tensor, v: Tensor, aa: Tensor, bb: Tensor, pp: Tensor,
         *, mode: str = "auto") -> Tensor:
    """RWKV-4: k, v [T, C] fp32; w, u [C]; aa, bb, pp [C] updated in place. Returns y [T, C]."""
    return resolve("wkv4_forward", k.device.type, mode)(w, u, k, v, aa, bb, pp)


def wkv4_block(w: Tensor, u: Tensor, k: Tensor, v: Tensor, r: Tensor, aa: Tensor, bb: Tensor,
               pp: Tensor, *, mode: str = "auto") -> list:
    """One RWKV-4 time mix around wkv4 (docs/kernels.md): the recurrence from aa, bb, pp (never
    written) and the gate r [T, C] (fp32 or bf16); k, v [T, C] fp32 or in r's dtype. Returns
    [r * wkv in r's dtype, new aa, bb, pp]."""
    return resolve("wkv4_block", k.device.type, mode)(w, u, k, v, r, aa, bb, pp)


def wkv5(state: Tensor, r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor,
         *, mode: str = "auto") -> Tensor:
    """RWKV-5.x: state [H, N, N] fp32 (key, value) in place; r, k, v [T, H*N]; w, u [H, N]."""
    return resolve("wkv5_forward", r.device.type, mode)(state, r, k, v, w, u)


def wkv6(state: Tensor, r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor,
         *, mode: str = "auto") -> Tensor:
    """RWKV-6: as wkv5 with w [T, H*N] (a decay per token)."""
    return resolve("wkv6_forward", r.device.type, mode)(state, r, k, v, w, u)


def wkv7(state: Tensor, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
         *, mode: str = "auto") -> Tensor:
    """RWKV-7: state [H, N, N] fp32 (value, key) in place; r, w, k, v, a, b [T, H*N] fp32."""
    return resolve("wkv7_forward", r.device.type, mode)(state, r, w, k, v, a, b)


def ln_mix(x: Tensor, sx: Tensor, w: Tensor, b: Tensor, mix: Tensor, lerp: bool, eps: float = 1e-5,
           *, mode: str = "auto") -> tuple:
    """Layer norm, token shift and mixes (fp32; docs/kernels.md): x [T, C]; sx, w, b [C]; mix
    [n, C]. Returns (xx = layer_norm(x) [T, C], mixed [n, T, C])."""
    return resolve("ln_mix", x.device.type, mode)(x, sx, w, b, mix, lerp, eps)


def ln_mix_split(x: Tensor, sx: Tensor, w: Tensor, b: Tensor, mix: Tensor, lerp: bool,
                 eps: float = 1e-5, *, mode: str = "auto") -> list:
    """ln_mix's values as separate tensors: [xx [T, C], the new shift state [C] (xx's last row),
    mixed_0 [T, C], ..., mixed_{n-1} [T, C]]. CPU."""
    return resolve("ln_mix_split", x.device.type, mode)(x, sx, w, b, mix, lerp, eps)


def ln_mix_rows(x: Tensor, sx: Tensor, w: Tensor, b: Tensor, mix: Tensor, lerp: bool, eps: float = 1e-5,
                *, mode: str = "auto") -> list:
    """ln_mix of B one-token rows (x, sx [B, C]; row b's previous row is sx[b]): [xx, mixed_0,
    ..., mixed_{n-1}], each [B, C] in x's dtype."""
    return resolve("ln_mix_rows", x.device.type, mode)(x, sx, w, b, mix, lerp, eps)


def maa_mix_rows(xx: Tensor, sx: Tensor, z: Tensor, w2: Tensor, maa: Tensor, *, mode: str = "auto") -> list:
    """maa_mix of B one-token rows (xx, sx [B, C], z [B, n*D]): the n mixes, each [B, C]."""
    return resolve("maa_mix_rows", xx.device.type, mode)(xx, sx, z, w2, maa)


def maa_mix(xx: Tensor, sx: Tensor, z: Tensor, w2: Tensor, maa: Tensor, *, mode: str = "auto") -> Tensor:
    """RWKV-6's data-dependent token shift (fp32; docs/kernels.md): xx [T, C]; sx [C]; z [T, n*D]
    (before tanh); w2 [n, D, C]; maa [n, C]. Returns [n, T, C]."""
    return resolve("maa_mix", xx.device.type, mode)(xx, sx, z, w2, maa)


def maa_mix_split(xx: Tensor, sx: Tensor, z: Tensor, w2: Tensor, maa: Tensor, *,
                  mode: str = "auto") -> list:
    """maa_mix's values as n separate tensors [T, C]. CPU."""
    return resolve("maa_mix_split", xx.device.type, mode)(xx, sx, z, w2, maa)


def maa_lora_one(xx: Tensor, sx: Tensor, xw: Tensor, w1: Tensor, w2: Tensor, maa: Tensor, *,
                 mode: str = "auto") -> list:
    """maa_mix_split of one token (xx [1, C]) whose z is linear_one(xw, w1), w1 [C, n*D]
    column-major. CPU."""
    return resolve("maa_lora_one", xx.device.type, mode)(xx, sx, xw, w1, w2, maa)


def wkv6_block(state: Tensor, r: Tensor, k: Tensor, v: Tensor, w: Tensor, g: Tensor, p: Tensor,
               eps: float, state_in: Tensor | None = None, *, mode: str = "auto") -> Tensor:
    """One RWKV-6 time mix around wkv6 (fp32; docs/kernels.md): state in place (starting from
    state_in's values when given); r, k, v, w, g [T, H*N]; p [4, H*N]. Returns the input of the
    output projection."""
    return resolve("wkv6_block", r.device.type, mode)(state, r, k, v, w, g, p, eps, state_in)


def wkv7_block(state: Tensor, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, g: Tensor,
               v_first: Tensor | None, v_gate: Tensor | None, p: Tensor, eps: float,
               state_in: Tensor | None = None, *, mode: str = "auto") -> Tensor:
    """One RWKV-7 time mix around wkv7 (fp32; docs/kernels.md): state in place (starting from
    state_in's values when given); r, w, k, v, a, g, v_first, v_gate [T, H*N]; p [8, H*N].
    Returns the input of the output projection."""
    return resolve("wkv7_block", r.device.type, mode)(state, r, w, k, v, a, g, v_first, v_gate, p,
                                                      eps, state_in)


def mm8_one(x: Tensor, w: Tensor, mx: Tensor, rx: Tensor, my: Tensor, ry: Tensor,
            *, mode: str = "auto") -> Tensor:
    """x [N] (or [1, N]) @ int8 w [N, M] (mx, rx [M]; my, ry [N, 1]); returns [M] (or [1, M]) in
    x's dtype."""
    return resolve("mm8_one", x.device.type, mode)(x, w, mx, rx, my, ry)


def mm8_one_i16(x: Tensor, w: Tensor, mx: Tensor, rx: Tensor, my: Tensor, ry: Tensor, act: int = 0,
                *, mode: str = "auto") -> Tensor:
    """mm8_one with x*ry rounded to int16 (one scale per call) and exact integer dot products:
    the CPU decode path for int8 weights (docs/kernels.md). act: an activation code of
    ``_checks.ACTIVATIONS`` applied to the output (0: none). Returns [M] (or [1, M] for x [1, N])
    in x's dtype."""
    return resolve("mm8_one_i16", x.device.type, mode)(x, w, mx, rx, my, ry, act)


def mm8_seq(x: Tensor, w: Tensor, mx: Tensor, rx: Tensor, my: Tensor, ry: Tensor,
            *, mode: str = "auto") -> Tensor:
    """x [T, N] @ int8 w [N, M]; returns [T, M] in x's dtype."""
    return resolve("mm8_seq", x.device.type, mode)(x, w, mx, rx, my, ry)


def mm8(x: Tensor, w: Tensor, mx: Tensor, rx: Tensor, my: Tensor, ry: Tensor,
        *, mode: str = "auto") -> Tensor:
    """mm8_one for a 1-D x, mm8_seq otherwise (upstream's ``mm8``)."""
    fn = mm8_one if x.dim() == 1 else mm8_seq
    return fn(x, w, mx, rx, my, ry, mode=mode)


def mm8_rows_i16(x: Tensor, w: Tensor, mx: Tensor, rx: Tensor, my: Tensor, ry: Tensor, act: int = 0, *,
                 mode: str = "auto") -> Tensor:
    """mm8_one_i16 of each row of x [T, N] (each row its own int16 scale; each column of w read
    once for all rows); returns [T, M] in x's dtype. CPU."""
    return resolve("mm8_rows_i16", x.device.type, mode)(x, w, mx, rx, my, ry, act)


def gemm_fp16(a: Tensor, b: Tensor, fp32_out: bool, *, mode: str = "auto") -> Tensor:
    """a [T, K] fp16 @ b [K, M] fp16, fp32 accumulation; fp32 result if fp32_out else fp16."""
    return resolve("gemm_fp16", a.device.type, mode)(a, b, fp32_out)


def linear_one(x: Tensor, w: Tensor, act: int = 0, *, mode: str = "auto") -> Tensor:
    """x [N] (or [1, N]) @ w [N, M], both bf16 or both fp32 (column-major: w.t() contiguous), fp32
    accumulation, then the activation code ``act`` (``_checks.ACTIVATIONS``; 0: none)."""
    return resolve("linear_one", x.device.type, mode)(x, w, act)


def linear_rows(x: Tensor, w: Tensor, *, mode: str = "auto") -> Tensor:
    """x [T, N] @ w [N, M] (column-major, or [S, N/S, M] row slabs), both bf16 or both fp32, with
    fp32 accumulation; returns [T, M] fp32. Reads each weight once for all T rows."""
    return resolve("linear_rows", x.device.type, mode)(x, w)


def linear_one_group(x: list, w: list, side: list, act: list, *, mode: str = "auto") -> list:
    """Several one-token products in one call: y[i] = linear_one(x[i], w[i], act[i]) for a bf16 or
    fp32 w[i], mm8_one_i16(x[i], w[i], mx, rx, my, ry, act[i]) for a uint8 one, whose side
    tensors are the next four of ``side``. Returns the list of y."""
    if not x:  # no tensor to dispatch on: the reference says what is wrong
        return reference.linear_one_group(x, w, side, act)
    return resolve("linear_one_group", x[0].device.type, mode)(x, w, side, act)


def linear_one_chain(x: list, w: list, side: list, act: list, src: list, *, mode: str = "auto") -> list:
    """Two groups of one-token products in one call: linear_one_group's products of x, then for
    each j the product of the result of product src[j] with w[len(x) + j] (a low-rank product's
    second factor). w, side and act cover all the products. Returns every result, in order."""
    if not x:  # no tensor to dispatch on: the reference says what is wrong
        return reference.linear_one_chain(x, w, side, act, src)
    return resolve("linear_one_chain", x[0].device.type, mode)(x, w, side, act, src)


def linear_one_slabs(x: Tensor, w: Tensor, side: list, act: int = 0, *, mode: str = "auto") -> Tensor:
    """x [N] (or [1, N]) @ a weight stored as row slabs w [S, N/S, M] (rwkv/slabs.py): the slabs'
    products (mm8_one_i16 with side = [mx, rx, my, ry] for uint8 w, else linear_one, side empty)
    summed in fp32, then the activation code ``act``; in x's dtype. CPU."""
    return resolve("linear_one_slabs", x.device.type, mode)(x, w, side, act)


def linear_one_residual(x: Tensor, w: Tensor, side: list, act: int, residual: Tensor,
                        gate: Tensor | None = None, *, mode: str = "auto") -> Tensor:
    """``residual + y`` (``residual + gate * y`` with a gate) for the one-token product y that
    linear_one (bf16/fp32 w), mm8_one_i16 (uint8 w, side = [mx, rx, my, ry]) or linear_one_slabs
    (w [S, N/S, M]) computes, in one call: each elementwise operation rounded to x's dtype as
    torch's are. CPU."""
    return resolve("linear_one_residual", x.device.type, mode)(x, w, side, act, residual, gate)


def linear_one_ffn(x: list, w: list, side: list, act: list, residual: Tensor, gate: int = -1, *,
                   mode: str = "auto") -> Tensor:
    """A channel mix's one-token products in one call: linear_one_group's products of x, then the
    value product w[len(x)] (matrix or row slabs; its side tensors last in ``side``) of the last
    one's result, then ``residual + y`` or, for gate >= 0, ``residual + ys[gate] * y``. CPU."""
    if not x:  # no tensor to dispatch on: the reference says what is wrong
        return reference.linear_one_ffn(x, w, side, act, residual, gate)
    return resolve("linear_one_ffn", x[0].device.type, mode)(x, w, side, act, residual, gate)


def pooled_empty_like(t: Tensor, *, mode: str = "auto") -> Tensor:
    """An uninitialized contiguous tensor of t's shape and dtype; on CPU its memory comes from the
    block pool of the ops' outputs (the model makes the block ops' new states with it)."""
    return resolve("pooled_empty_like", t.device.type, mode)(t)
