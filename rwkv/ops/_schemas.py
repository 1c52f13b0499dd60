"""Schemas and fake (meta) kernels of every op in the ``rwkv`` torch namespace.

The schemas live here, in Python, so the namespace, the fakes and the reference path exist even
when ``rwkv._C`` was not built; C++ and CUDA code only add ``TORCH_LIBRARY_IMPL(rwkv, <key>)``.
Arguments marked ``(a!)`` are updated in place. See docs/kernels.md for the math.
"""

from __future__ import annotations

import torch

from . import _checks

_LIB = "rwkv"


def _define(name: str, schema: str) -> None:
    torch.library.define(f"{_LIB}::{name}", schema)


# w, u: [C] fp32 (w = -exp(time_decay)); k, v: [T, C] fp32; aa, bb, pp: [C] fp32 contiguous,
# updated in place. Returns y: [T, C] fp32.
_define("wkv4_forward",
        "(Tensor w, Tensor u, Tensor k, Tensor v, Tensor(a!) aa, Tensor(b!) bb, Tensor(c!) pp)"
        " -> Tensor")


@torch.library.register_fake(f"{_LIB}::wkv4_forward")
def _wkv4_fake(w, u, k, v, aa, bb, pp):
    T, C = _checks.validate_wkv4(w, u, k, v, aa, bb, pp)
    return k.new_empty((T, C))


# One RWKV-4 layer's time mix between its projections and the output projection
# (docs/kernels.md): wkv4_forward's recurrence from the old state aa, bb, pp (read, never written)
# and the receptance gate r (after the sigmoid): [T, C] fp32 or bf16 (the activation dtype); k
# and v [T, C] fp32 or, both, in r's dtype (widened exactly). Returns [y, aa', bb', pp']:
# y = r * wkv [T, C] in r's dtype (wkv rounded to r's dtype first, as the torch ops round it) and
# the new state as new [C] fp32 tensors.
_define("wkv4_block",
        "(Tensor w, Tensor u, Tensor k, Tensor v, Tensor r, Tensor aa, Tensor bb, Tensor pp) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::wkv4_block")
def _wkv4_block_fake(w, u, k, v, r, aa, bb, pp):
    T, C = _checks.validate_wkv4_block(w, u, k, v, r, aa, bb, pp)
    return [r.new_empty((T, C)), *(aa.new_empty((C,)) for _ in range(3))]


# state: [H, N, N] fp32 contiguous [head, key i, value j], in place; r, k, v: [T, H*N] fp32;
# w: [H, N] fp32 decay factor; u: [H, N] fp32 bonus. Returns y: [T, H*N] fp32.
_define("wkv5_forward",
        "(Tensor(a!) state, Tensor r, Tensor k, Tensor v, Tensor w, Tensor u) -> Tensor")


@torch.library.register_fake(f"{_LIB}::wkv5_forward")
def _wkv5_fake(state, r, k, v, w, u):
    T, H, N = _checks.validate_wkv5(state, r, k, v, w, u)
    return r.new_empty((T, H * N))


# As wkv5_forward, but w: [T, H*N] fp32, a decay factor per token.
_define("wkv6_forward",
        "(Tensor(a!) state, Tensor r, Tensor k, Tensor v, Tensor w, Tensor u) -> Tensor")


@torch.library.register_fake(f"{_LIB}::wkv6_forward")
def _wkv6_fake(state, r, k, v, w, u):
    T, H, N = _checks.validate_wkv6(state, r, k, v, w, u)
    return r.new_empty((T, H * N))


# state: [H, N, N] fp32 contiguous [head, value i, key j], in place; r, w, k, v, a, b:
# [T, H*N] fp32 (w: decay factor in (0, 1)). Returns y: [T, H*N] fp32.
_define("wkv7_forward",
        "(Tensor(a!) state, Tensor r, Tensor w, Tensor k, Tensor v, Tensor a, Tensor b) -> Tensor")


@torch.library.register_fake(f"{_LIB}::wkv7_forward")
def _wkv7_fake(state, r, w, k, v, a, b):
    T, H, N = _checks.validate_wkv7(state, r, w, k, v, a, b)
    return r.new_empty((T, H * N))


# One RWKV-6 layer's time mix around wkv6_forward (docs/kernels.md): state as wkv6_forward, in
# place; g (the gate after silu): [T, H*N] fp32 or bf16 (the activation dtype); r, k, v and w (the
# decay's low-rank term): [T, H*N] fp32 or g's dtype (widened exactly); p: [4, H*N] fp32, the rows
# time_decay, time_first, ln_x weight, ln_x bias. Computes in fp32. Returns the time mix's output before the
# output projection, y: [T, H*N] in g's dtype. state_in (optional): as wkv7_block's.
_define("wkv6_block",
        "(Tensor(a!) state, Tensor r, Tensor k, Tensor v, Tensor w, Tensor g, Tensor p, float eps, "
        "Tensor? state_in=None) -> Tensor")


@torch.library.register_fake(f"{_LIB}::wkv6_block")
def _wkv6_block_fake(state, r, k, v, w, g, p, eps, state_in=None):
    T, H, N = _checks.validate_wkv6_block(state, r, k, v, w, g, p, state_in)
    return g.new_empty((T, H * N))


# One RWKV-7 layer's time mix around wkv7_forward (docs/kernels.md): state as wkv7_forward, in
# place; r, k, v, g and the low-rank outputs w (decay), a (in-context rate), v_gate: [T, H*N]
# fp32 or all bf16 (the activation dtype); v_first and v_gate both given (layers after the
# first) or both None; p: [8, H*N] fp32, the rows w0, a0, v0, k_k, k_a, r_k, ln_x weight, ln_x
# bias. Computes in fp32. Returns the time mix's output before the output projection, y:
# [T, H*N] in r's dtype. state_in (optional): the old state, read instead of state's contents
# (state is then only written: the model passes a fresh tensor and the caller's state, sparing a
# copy); like state, and state itself or not overlapping it.
_define("wkv7_block",
        "(Tensor(a!) state, Tensor r, Tensor w, Tensor k, Tensor v, Tensor a, Tensor g, "
        "Tensor? v_first, Tensor? v_gate, Tensor p, float eps, Tensor? state_in=None) -> Tensor")


@torch.library.register_fake(f"{_LIB}::wkv7_block")
def _wkv7_block_fake(state, r, w, k, v, a, g, v_first, v_gate, p, eps, state_in=None):
    T, H, N = _checks.validate_wkv7_block(state, r, w, k, v, a, g, v_first, v_gate, p, state_in)
    return r.new_empty((T, H * N))


# The output buffer of a wkv6_block/wkv7_block call that starts from state_in (the new matrix
# state): an uninitialized contiguous tensor of t's shape and dtype. On CPU its memory comes from
# the block pool of the ops' outputs (docs/kernels.md), so a token's 24-64 states of 0.5-1 MB
# reuse the blocks the previous token's states freed instead of going through malloc.
_define("pooled_empty_like", "(Tensor t) -> Tensor")


@torch.library.register_fake(f"{_LIB}::pooled_empty_like")
def _pooled_empty_like_fake(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


# The start of each half of every block (docs/kernels.md): x [T, C] and sx (the shift state)
# [C], fp32 or both bf16 (the activation dtype); w, b (the layer norm's) [C] and mix [n, C] fp32;
# lerp: the RWKV-4/5 form, else RWKV-6/7's. Computes in fp32. Returns, in x's dtype,
# (xx = layer_norm(x) [T, C], the n mixes of xx with its previous row [n, T, C]).
_define("ln_mix",
        "(Tensor x, Tensor sx, Tensor w, Tensor b, Tensor mix, bool lerp, float eps) -> (Tensor, Tensor)")


@torch.library.register_fake(f"{_LIB}::ln_mix")
def _ln_mix_fake(x, sx, w, b, mix, lerp, eps):
    T, C, n = _checks.validate_ln_mix(x, sx, w, b, mix)
    return x.new_empty((T, C)), x.new_empty((n, T, C))


# ln_mix's values as separate tensors (CPU; the one-token path: no selects or unbind after it):
# [xx [T, C], the new shift state [C] (xx's last row; sx's values when T is 0), mixed_0 [T, C],
# ..., mixed_{n-1} [T, C]], in x's dtype.
_define("ln_mix_split",
        "(Tensor x, Tensor sx, Tensor w, Tensor b, Tensor mix, bool lerp, float eps) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::ln_mix_split")
def _ln_mix_split_fake(x, sx, w, b, mix, lerp, eps):
    T, C, n = _checks.validate_ln_mix(x, sx, w, b, mix, "ln_mix_split")
    return [x.new_empty((T, C)), x.new_empty((C,))] + [x.new_empty((T, C)) for _ in range(n)]


# RWKV-6's data-dependent token shift after its first low-rank product (docs/kernels.md): xx
# [T, C] (the layer norm), sx [C] (the shift state), z [T, n*D] (the product, before tanh): fp32
# or all bf16 (the activation dtype); w2 [n, D, C] fp32 or bf16; maa [n, C] fp32. Computes in
# fp32. Returns xx + (prev - xx) * (maa + tanh(z) @ w2): [n, T, C] in xx's dtype.
# ln_mix_split of B one-token rows: x and sx [B, C] (row b's previous row is sx[b]), fp32 or both
# bf16; w, b [C] and mix [n, C] fp32. Returns [xx (the rows' new shift states), mixed_0, ...,
# mixed_{n-1}], each [B, C] in x's dtype; row b equals ln_mix_split(x[b:b+1], sx[b], ...)'s.
_define("ln_mix_rows",
        "(Tensor x, Tensor sx, Tensor w, Tensor b, Tensor mix, bool lerp, float eps) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::ln_mix_rows")
def _ln_mix_rows_fake(x, sx, w, b, mix, lerp, eps):
    B, C, n = _checks.validate_ln_mix_rows(x, sx, w, b, mix)
    return [x.new_empty((B, C)) for _ in range(n + 1)]


# maa_mix_split of B one-token rows: xx and sx [B, C] (row b's previous row is sx[b]); z
# [B, n*D]; w2 and maa as maa_mix's. Returns the n mixes, each [B, C] in xx's dtype.
_define("maa_mix_rows", "(Tensor xx, Tensor sx, Tensor z, Tensor w2, Tensor maa) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::maa_mix_rows")
def _maa_mix_rows_fake(xx, sx, z, w2, maa):
    B, C, n, _ = _checks.validate_maa_mix_rows(xx, sx, z, w2, maa)
    return [xx.new_empty((B, C)) for _ in range(n)]


_define("maa_mix", "(Tensor xx, Tensor sx, Tensor z, Tensor w2, Tensor maa) -> Tensor")


@torch.library.register_fake(f"{_LIB}::maa_mix")
def _maa_mix_fake(xx, sx, z, w2, maa):
    T, C, n, D = _checks.validate_maa_mix(xx, sx, z, w2, maa)
    return xx.new_empty((n, T, C))


# maa_mix's values as n separate tensors [T, C] (CPU; the one-token path: no unbind after it).
_define("maa_mix_split", "(Tensor xx, Tensor sx, Tensor z, Tensor w2, Tensor maa) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::maa_mix_split")
def _maa_mix_split_fake(xx, sx, z, w2, maa):
    T, C, n, D = _checks.validate_maa_mix(xx, sx, z, w2, maa, "maa_mix_split")
    return [xx.new_empty((T, C)) for _ in range(n)]


# maa_mix_split of one token whose z is linear_one(xw, w1) (CPU; RWKV-6's one-token path: the first
# low-rank product in the same call): xx [1, C] fp32 or bf16; sx [C], xw [1, C] and w1 [C, n*D]
# (column-major) in xx's dtype; w2 [n, D, C] fp32 or bf16; maa [n, C] fp32. Returns the n mixes
# [1, C] in xx's dtype, the bits of linear_one then maa_mix_split.
_define("maa_lora_one", "(Tensor xx, Tensor sx, Tensor xw, Tensor w1, Tensor w2, Tensor maa) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::maa_lora_one")
def _maa_lora_one_fake(xx, sx, xw, w1, w2, maa):
    T, C, n, D = _checks.validate_maa_lora_one(xx, sx, xw, w1, w2, maa)
    return [xx.new_empty((T, C)) for _ in range(n)]


# x: [N] or [1, N] fp32|bf16|fp16; w: [N, M] uint8, any strides (fast path: w.t() contiguous);
# mx, rx: [M] and my, ry: [N, 1] in x's dtype. Returns y: [M] or [1, M] (as x) in x's dtype.
_define("mm8_one", "(Tensor x, Tensor w, Tensor mx, Tensor rx, Tensor my, Tensor ry) -> Tensor")


@torch.library.register_fake(f"{_LIB}::mm8_one")
def _mm8_one_fake(x, w, mx, rx, my, ry):
    N, M = _checks.validate_mm8("mm8_one", x, w, mx, rx, my, ry, False)
    return x.new_empty(_checks.one_row_shape(x, M))


# x: [T, N] fp32|bf16|fp16; otherwise as mm8_one. Returns y: [T, M] in x's dtype.
_define("mm8_seq", "(Tensor x, Tensor w, Tensor mx, Tensor rx, Tensor my, Tensor ry) -> Tensor")


@torch.library.register_fake(f"{_LIB}::mm8_seq")
def _mm8_seq_fake(x, w, mx, rx, my, ry):
    N, M = _checks.validate_mm8("mm8_seq", x, w, mx, rx, my, ry, True)
    return x.new_empty((int(x.shape[0]), M))


# As mm8_one, but xs = x*ry is rounded to int16 with one scale per call (max|xs| / 32639) and the
# dot products with w are exact integers: y = rx*(scale*(xq @ w) + 0.5*sum(xs)) + sum(x*my)
# + mx*sum(x). Falls back to mm8_one's fp32 math when xs is all zero or not finite. act: an
# activation of y (ACTIVATIONS; 0 = none). mx, rx, my, ry may also be float32 (it computes in
# fp32; the model keeps fp32 copies so that bf16 layers convert none per call). CPU only.
_define("mm8_one_i16",
        "(Tensor x, Tensor w, Tensor mx, Tensor rx, Tensor my, Tensor ry, int act=0) -> Tensor")


@torch.library.register_fake(f"{_LIB}::mm8_one_i16")
def _mm8_one_i16_fake(x, w, mx, rx, my, ry, act=0):
    N, M = _checks.validate_mm8("mm8_one_i16", x, w, mx, rx, my, ry, False, fp32_side=True)
    _checks.check_act("mm8_one_i16", act)
    return x.new_empty(_checks.one_row_shape(x, M))


# mm8_one_i16 of each row of x [T, N] (fp32|bf16|fp16): every row rounded to int16 with its own
# scale, every column of w read once for all rows; otherwise as mm8_one_i16. Returns [T, M] in
# x's dtype, row t the bits mm8_one_i16 gives for x[t] alone. CPU only.
_define("mm8_rows_i16",
        "(Tensor x, Tensor w, Tensor mx, Tensor rx, Tensor my, Tensor ry, int act=0) -> Tensor")


@torch.library.register_fake(f"{_LIB}::mm8_rows_i16")
def _mm8_rows_i16_fake(x, w, mx, rx, my, ry, act=0):
    N, M = _checks.validate_mm8("mm8_rows_i16", x, w, mx, rx, my, ry, True, fp32_side=True)
    _checks.check_act("mm8_rows_i16", act)
    return x.new_empty((int(x.shape[0]), M))


# a: [T, K] fp16; b: [K, M] fp16; fp32 accumulation. Returns [T, M] fp32 if fp32_out else fp16.
_define("gemm_fp16", "(Tensor a, Tensor b, bool fp32_out) -> Tensor")


@torch.library.register_fake(f"{_LIB}::gemm_fp16")
def _gemm_fp16_fake(a, b, fp32_out):
    T, K, M = _checks.validate_gemm_fp16(a, b)
    return a.new_empty((T, M), dtype=torch.float32 if fp32_out else torch.float16)


# x: [N] or [1, N] and w: [N, M] both bf16 or both fp32 (fp32: CPU only), w column-major (w.t()
# contiguous); fp32 accumulation; act: an activation of y (ACTIVATIONS; 0 = none). Returns y: [M]
# or [1, M] (as x) in x's dtype.
_define("linear_one", "(Tensor x, Tensor w, int act=0) -> Tensor")


@torch.library.register_fake(f"{_LIB}::linear_one")
def _linear_one_fake(x, w, act=0):
    N, M = _checks.validate_linear_one(x, w)
    _checks.check_act("linear_one", act)
    return x.new_empty(_checks.one_row_shape(x, M))


# Several one-token products in one call (CPU): product i is linear_one(x[i], w[i], act[i]) for
# a bf16/fp32 w[i], mm8_one_i16(x[i], w[i], mx, rx, my, ry, act[i]) for a uint8 w[i], whose mx,
# rx, my, ry are the next four tensors of side (side: 4 per uint8 w, in order). Returns each y.
# x: [T, N] bf16|fp32; w: [N, M] column-major (w.t() contiguous) or [S, N/S, M] row slabs, each
# column-major, in x's dtype. Returns y = x @ w: [T, M] fp32 (fp32 accumulation; slabs summed in
# fp32 in slab order). The batched engine's products of its B rows (each weight read once).
_define("linear_rows", "(Tensor x, Tensor w) -> Tensor")


@torch.library.register_fake(f"{_LIB}::linear_rows")
def _linear_rows_fake(x, w):
    T, _, M, _ = _checks.validate_linear_rows(x, w)
    return x.new_empty((T, M), dtype=torch.float32)


_define("linear_one_group", "(Tensor[] x, Tensor[] w, Tensor[] side, int[] act) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::linear_one_group")
def _linear_one_group_fake(x, w, side, act):
    dims = _checks.validate_linear_one_group(x, w, side, act)
    return [xi.new_empty(_checks.one_row_shape(xi, M)) for xi, (N, M) in zip(x, dims)]


# Two linear_one_group calls in one (CPU): products i < len(x) of x[i], then product len(x) + j
# of the result of product src[j] (a low-rank product's second factor after its first); w, side
# and act as linear_one_group's, for all the products in order. Returns each y, in that order.
_define("linear_one_chain", "(Tensor[] x, Tensor[] w, Tensor[] side, int[] act, int[] src) -> Tensor[]")


@torch.library.register_fake(f"{_LIB}::linear_one_chain")
def _linear_one_chain_fake(x, w, side, act, src):
    first, second = _checks.validate_linear_one_chain(x, w, side, act, src)
    ys = [xi.new_empty(_checks.one_row_shape(xi, M)) for xi, (N, M) in zip(x, first)]
    return ys + [ys[j].new_empty(_checks.one_row_shape(ys[j], M)) for j, (N, M) in zip(src, second)]


# One one-token product whose weight is stored as row slabs (rwkv/slabs.py; CPU): w [S, N/S, M],
# slab s a column-major matrix of rows s*N/S.., uint8 (side = mx, rx [M], my, ry [N, 1] in x's
# dtype or fp32: mm8_one_i16's math per slab, one int16 scale per slab) or in x's dtype (bf16 or
# fp32, side empty: linear_one's per slab). The slabs' fp32 results are summed in slab order, then
# the activation act, then rounded once to x's dtype. Returns y: [M] or [1, M] (as x).
_define("linear_one_slabs", "(Tensor x, Tensor w, Tensor[] side, int act=0) -> Tensor")


@torch.library.register_fake(f"{_LIB}::linear_one_slabs")
def _linear_one_slabs_fake(x, w, side, act=0):
    N, M, S = _checks.validate_linear_one_slabs(x, w, side)
    _checks.check_act("linear_one_slabs", act)
    return x.new_empty(_checks.one_row_shape(x, M))


# One one-token product (CPU) as linear_one (bf16/fp32 w [N, M]), mm8_one_i16 (uint8 w [N, M],
# side = mx, rx, my, ry) or linear_one_slabs (w [S, N/S, M]) would compute it, y in x's dtype;
# then residual + y, or residual + gate * y with a gate, each operation rounded to x's dtype as
# torch's elementwise ops round it. residual and gate: y's shape and x's dtype. Returns the sum.
_define("linear_one_residual",
        "(Tensor x, Tensor w, Tensor[] side, int act, Tensor residual, Tensor? gate=None) -> Tensor")


@torch.library.register_fake(f"{_LIB}::linear_one_residual")
def _linear_one_residual_fake(x, w, side, act, residual, gate=None):
    M = _checks.validate_linear_one_residual(x, w, side, act, residual, gate)
    return x.new_empty(_checks.one_row_shape(x, M))


# A channel mix's products in one call (CPU): linear_one_group's products of x, then the value
# product w[len(x)] (as linear_one_residual takes it: a matrix or row slabs; its side tensors last
# in side) of the last one's result, then residual + y, or with gate >= 0 residual + (result of
# product gate) * y, each operation rounded to x's dtype as torch's are. Returns the sum.
_define("linear_one_ffn",
        "(Tensor[] x, Tensor[] w, Tensor[] side, int[] act, Tensor residual, int gate) -> Tensor")


@torch.library.register_fake(f"{_LIB}::linear_one_ffn")
def _linear_one_ffn_fake(x, w, side, act, residual, gate):
    xv, M = _checks.validate_linear_one_ffn(x, w, side, act, residual, gate)
    return xv.new_empty(_checks.one_row_shape(xv, M))


# CPU test hooks (implemented in csrc/cpu/cpu_features.cpp, key CompositeExplicitAutograd):
# the instruction set the CPU kernels use now, and forcing one ("" = automatic choice again);
# _set_cpu_isa returns the previously forced one ("" when the choice was automatic).
_define("_cpu_isa", "() -> str")
_define("_set_cpu_isa", "(str isa) -> str")
# How many ISAs' kernel tables were filled (scalar first): only those this CPU and OS run.
_define("_cpu_isa_tables", "() -> int")
# The same for the order in which mm8_one_i16 reads the int8 matrix (sequential or streams).
_define("_cpu_read_order", "() -> str")
_define("_set_cpu_read_order", "(str order) -> str")
# Test hook (csrc/cpu/cpu_features.cpp, CPU): x (contiguous fp32) rounded to bf16 by the active
# ISA's bf16_round kernel, the one-token ops' narrowing of their bf16 results.
_define("_bf16_round", "(Tensor x) -> Tensor")

# Bytes the CPU ops' block pool keeps (csrc/cpu/pooled.cpp): [in blocks up to 1 MiB, larger ones].
_define("_pooled_kept", "() -> int[]")

# Registers the Autograd kernel of the named ops (csrc/inference_only.cpp; rwkv/ops/_backend.py
# passes OPS once rwkv._C is loaded): these ops have no backward, so under grad mode an argument
# that requires grad is refused, and otherwise the call goes straight to the backend's kernel.
_define("_inference_only", "(str[] names) -> ()")

#: Every tensor op of the namespace, in the order of docs/kernels.md.
OPS = ("wkv4_forward", "wkv4_block", "wkv5_forward", "wkv6_forward", "wkv7_forward", "wkv6_block", "wkv7_block",
       "ln_mix", "ln_mix_split", "ln_mix_rows", "maa_mix", "maa_mix_rows", "maa_mix_split", "maa_lora_one", "mm8_one", "mm8_seq", "mm8_one_i16", "mm8_rows_i16", "gemm_fp16", "linear_one", "linear_rows",
       "linear_one_group", "linear_one_chain", "linear_one_slabs", "linear_one_residual", "linear_one_ffn", "pooled_empty_like")
