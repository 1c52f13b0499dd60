"""Pure-torch implementations of every ``rwkv`` op: the spec the compiled kernels are tested against.

Each public function has the op's signature, validates its inputs with the same rules and
messages as the kernels (``_checks``), updates the recurrent state in place and returns the same
result. The ``*_math`` functions hold the bare math in the inputs' own dtype (no checks, no
mutation), so tests can evaluate the spec in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks

# RWKV-7's decay scale exp(-1/2), written as upstream's literal so decays match it bit for bit.
DECAY_SCALE = 0.606531
# The constants as 0-dim CPU tensors: a Python number in a tensor op is first copied into a tensor
# of the op's dtype (an extra step per op while decoding); a 0-dim tensor is used as it is.
# Same values: 1 is exact in every dtype, and the decay product is computed in fp32 or wider, where
# a 0-dim fp32 factor gives the bits the Python number gives.
_ONE = torch.tensor(1.0)
_NEG_DECAY_SCALE = torch.tensor(-DECAY_SCALE)


# ---------------------------------------------------------------------------------------------
# Math (any float dtype; state tensors are returned, not mutated)
# ---------------------------------------------------------------------------------------------

def wkv4_math(w, u, k, v, aa, bb, pp):
    """w, u, aa, bb, pp: [C]; k, v: [T, C]. Returns (y [T, C], aa, bb, pp)."""
    y = torch.empty_like(k)
    for t in range(k.shape[0]):
        kt, vt = k[t], v[t]
        ww = u + kt
        p = torch.maximum(pp, ww)
        e1, e2 = torch.exp(pp - p), torch.exp(ww - p)
        y[t] = (e1 * aa + e2 * vt) / (e1 * bb + e2)
        ww = w + pp
        p = torch.maximum(ww, kt)
        e1, e2 = torch.exp(ww - p), torch.exp(kt - p)
        aa, bb, pp = e1 * aa + e2 * vt, e1 * bb + e2, p
    return y, aa, bb, pp


def wkv56_math(state, r, k, v, w, u):
    """state: [H, N, N] (key i, value j); r, k, v: [T, H*N]; w: [H, N] or [T, H*N]; u: [H, N].

    Returns (y [T, H*N], new state)."""
    H, N = state.shape[0], state.shape[1]
    T = r.shape[0]
    S = state.clone()
    y = r.new_empty((T, H, N))
    r, k, v = r.view(T, H, N), k.view(T, H, N), v.view(T, H, N)
    # [H, N] and [T, H*N] only coincide when H = T = 1, where both readings agree.
    per_token = tuple(w.shape) == (T, H * N)
    for t in range(T):
        wt = w[t].view(H, N) if per_token else w.view(H, N)
        kv = k[t].unsqueeze(2) * v[t].unsqueeze(1)  # [H, N(i), N(j)]
        y[t] = torch.einsum("hi,hij->hj", r[t], u.view(H, N).unsqueeze(2) * kv + S)
        S = wt.unsqueeze(2) * S + kv
    return y.reshape(T, H * N), S


def wkv7_math(state, r, w, k, v, a, b):
    """state: [H, N, N] (value i, key j); r, w, k, v, a, b: [T, H*N].

    Returns (y [T, H*N], new state)."""
    H, N = state.shape[0], state.shape[1]
    T = r.shape[0]
    S = state.clone()
    y = r.new_empty((T, H, N))
    r, w, k, v, a, b = (t.view(T, H, N) for t in (r, w, k, v, a, b))
    for t in range(T):
        sa = torch.einsum("hij,hj->hi", S, a[t])
        S = S * w[t].unsqueeze(1) + sa.unsqueeze(2) * b[t].unsqueeze(1) \
            + v[t].unsqueeze(2) * k[t].unsqueeze(1)
        y[t] = torch.einsum("hij,hj->hi", S, r[t])
    return y.reshape(T, H * N), S


def wkv6_block_math(wkv, state, r, k, v, w, g, params, eps):
    """One RWKV-6 layer's time mix around the recurrence, as upstream computes it: r, k, v, w
    (the decay's low-rank term) [T, H*N] in fp32 (or wider); g (the gate after silu) [T, H*N] in
    the activation dtype; params: time_decay [H*N], time_first [H, N] or [H*N], ln_x weight and
    bias in the activation dtype. ``wkv(state, r, k, v, decay, u)`` runs the recurrence and
    updates ``state``. Returns y [T, H*N] in g's dtype."""
    base, u, lx_w, lx_b = params
    H, N = state.shape[0], state.shape[1]
    decay = torch.exp(-torch.exp(base + w)).contiguous()
    y = wkv(state, r.contiguous(), k.contiguous(), v.contiguous(), decay, u.reshape(H, N))
    y = group_norm(y, H, lx_w, lx_b, eps).to(dtype=g.dtype)
    return y * g


def wkv6_inplace_math(state, r, k, v, w, u):
    """wkv56_math writing the new state into ``state`` (any dtype, no checks): the ``wkv`` of
    wkv6_block_math for float64 specs."""
    y, S = wkv56_math(state, r, k, v, w, u)
    state.copy_(S)
    return y


def wkv7_block_math(wkv, state, r, w, k, v, a, g, v_first, v_gate, params, eps):
    """One RWKV-7 layer's time mix around the recurrence, as upstream computes it: every step in
    the inputs' dtype (the model's activation dtype) except the recurrence, which gets fp32 (or
    wider) inputs. r, w, k, v, a, g, v_first, v_gate: [T, H*N] (v_first and v_gate both None in
    the first layer); params: the 8 rows of wkv7_block's p. ``wkv(state, r, w, k, v, a, b)`` runs
    the recurrence and updates ``state`` (the only tensor changed). Returns y [T, H*N]."""
    T, H, N = r.shape[0], state.shape[0], state.shape[1]
    w0, a0, v0, k_k, k_a, r_k, lx_w, lx_b = params
    a = torch.sigmoid(a0 + a)
    kk = F.normalize((k * k_k).view(T, H, N), dim=-1, p=2.0).view(T, H * N)
    k = k * (_ONE + (a - _ONE) * k_a)
    if v_first is not None:
        v = v + (v_first - v) * torch.sigmoid(v0 + v_gate)
    f = torch.promote_types(r.dtype, torch.float32)
    decay = torch.exp(_NEG_DECAY_SCALE * torch.sigmoid((w0 + w).to(f)))
    f32 = [t.to(f).contiguous() for t in (r, k, v, -kk, kk * a)]
    y = wkv(state, f32[0], decay.contiguous(), f32[1], f32[2], f32[3], f32[4]).to(r.dtype)
    y = group_norm(y, H, lx_w, lx_b, eps)
    bonus = (r * k * r_k).view(T, H, N).sum(dim=-1, keepdim=True) * v.view(T, H, N)
    return (y + bonus.view(T, H * N)) * g


def wkv7_inplace_math(state, r, w, k, v, a, b):
    """wkv7_math writing the new state into ``state`` (any dtype, no checks): the ``wkv`` of
    wkv7_block_math for float64 specs."""
    y, S = wkv7_math(state, r, w, k, v, a, b)
    state.copy_(S)
    return y


def group_norm(y, groups, w, b, eps):
    """F.group_norm of y [T, C]: the same op (torch.group_norm), without F's Python batch-size
    check."""
    return torch.group_norm(y, groups, w, b, eps)


def rows(x: torch.Tensor) -> int:
    """x's number of rows (x.shape[0]) as a Python int."""
    return int(x.shape[0])


def token_shift(xx, sx):
    """Row t of the result is the previous token's row: ``[sx; xx[0..T-2]]``. xx: [T, C], sx: [C]."""
    if rows(xx) == 1:
        return sx.unsqueeze(0)
    return torch.cat((sx.unsqueeze(0), xx[:-1]))


def ln_mix_math(x, sx, w, b, mix, rmix, eps):
    """The start of each half of every block: xx = layer_norm(x), the token shift, and the mixes
    of xx with the previous row. mix: [n, 1, C]; rmix: 1 - mix for the lerp form (RWKV-4/5:
    ``xx * mix + prev * rmix``), None for the delta form (RWKV-6/7: ``xx + (prev - xx) * mix``).
    Returns (xx [T, C], mixed [n, T, C])."""
    return ln_mix_rows_math(x, lambda xx: token_shift(xx, sx), w, b, mix, rmix, eps)


def ln_mix_rows_math(x, prev, w, b, mix, rmix, eps):
    """ln_mix_math where each row's previous row is given: ``prev`` is a [T, C] tensor (the
    batched case: row b is one token of sequence b, its previous token's layer norm in the shift
    state) or a function of xx giving it (the sequence case)."""
    xx = F.layer_norm(x, (x.shape[-1],), weight=w, bias=b, eps=eps)
    prev = prev(xx) if callable(prev) else prev
    if rmix is not None:
        return xx, xx * mix + prev * rmix
    return xx, xx + (prev - xx) * mix


def maa_mix_math(xx, sx, z, w2, maa):
    """RWKV-6's data-dependent token shift after its first low-rank product: xx [T, C] (the layer
    norm), sx [C], z [T, n*D] (the product, before tanh), w2 [n, D, C], maa [n, 1, C]. With
    d = prev - xx (the token shift), returns xx + d * (maa + tanh(z) @ w2) per i: [n, T, C]."""
    return maa_mix_rows_math(xx, token_shift(xx, sx), z, w2, maa)


def maa_mix_rows_math(xx, prev, z, w2, maa):
    """maa_mix_math with each row's previous row given: prev [T, C] (see ln_mix_rows_math)."""
    T, n = xx.shape[0], w2.shape[0]
    d = prev - xx
    m = torch.bmm(torch.tanh(z).view(T, n, w2.shape[1]).transpose(0, 1), w2)
    return xx + d * (maa + m)


def relu_squared(h):
    """relu(h)**2 as r*r: the same bits as ``** 2`` (torch computes x**2 as x*x), without the
    Python number's per-call conversion (a share of one-token decode time)."""
    r = torch.relu(h)
    return r * r


#: The activation functions by code (_checks.ACTIVATIONS), as the model's torch path applies them.
ACTIVATION_FNS = {1: torch.sigmoid, 2: relu_squared, 3: torch.tanh, 4: F.silu}


def activate(y, act):
    """y with activation code ``act`` applied (0: y itself)."""
    return ACTIVATION_FNS[act](y) if act else y


def _relu_squared_(h):
    torch.relu_(h)
    return h.mul_(h)


#: ACTIVATION_FNS in place: the same kernels on the same values, so the same bits.
ACTIVATION_FNS_INPLACE = {1: torch.sigmoid_, 2: _relu_squared_, 3: torch.tanh_,
                          4: lambda y: F.silu(y, inplace=True)}


def activate_(y, act):
    """activate(y, act) in y's memory, for a y that nothing else holds (a product's fresh result):
    a sequence's [T, 4C] relu squared then takes one pass over memory it already owns, where the
    out-of-place ops would make two new tensors, several times slower."""
    return ACTIVATION_FNS_INPLACE[act](y) if act else y


def mm8_math(x, w, mx, rx, my, ry):
    """x: [..., N]; w: [N, M] uint8; mx, rx: [M]; my, ry: [N, 1]. In x's dtype, dequantizing w."""
    return x @ ((w.to(x.dtype) + 0.5) * ry * rx + my + mx)


# ---------------------------------------------------------------------------------------------
# Ops (validated, fp32 compute, state updated in place)
# ---------------------------------------------------------------------------------------------

def wkv4_forward(w, u, k, v, aa, bb, pp):
    """RWKV-4 recurrence. w, u: [C] fp32; k, v: [T, C] fp32; aa, bb, pp: [C] fp32 contiguous,
    updated in place. Returns y [T, C] fp32."""
    _checks.validate_wkv4(w, u, k, v, aa, bb, pp)
    y, aa2, bb2, pp2 = wkv4_math(w, u, k, v, aa, bb, pp)
    aa.copy_(aa2)
    bb.copy_(bb2)
    pp.copy_(pp2)
    return y


def wkv4_block(w, u, k, v, r, aa, bb, pp):
    """One RWKV-4 time mix between its projections and the output projection: the recurrence
    from aa, bb, pp (not written) and the gate r [T, C] (fp32 or bf16); k, v fp32 or in r's dtype
    (widened). Returns [r * wkv in r's dtype, new aa, bb, pp]."""
    _checks.validate_wkv4_block(w, u, k, v, r, aa, bb, pp)
    aa, bb, pp = aa.clone(), bb.clone(), pp.clone()
    y = wkv4_forward(w, u, k.float(), v.float(), aa, bb, pp)
    return [r * y.to(r.dtype), aa, bb, pp]


def wkv5_forward(state, r, k, v, w, u):
    """RWKV-5.x recurrence. state [H, N, N] fp32 (key i, value j), in place; r, k, v: [T, H*N]
    fp32; w, u: [H, N] fp32. Returns y [T, H*N] fp32."""
    _checks.validate_wkv5(state, r, k, v, w, u)
    y, S = wkv56_math(state, r, k, v, w, u)
    state.copy_(S)
    return y


def wkv6_forward(state, r, k, v, w, u):
    """RWKV-6 recurrence: as wkv5_forward with w [T, H*N] fp32 (a decay per token)."""
    _checks.validate_wkv6(state, r, k, v, w, u)
    y, S = wkv56_math(state, r, k, v, w, u)
    state.copy_(S)
    return y


def wkv7_forward(state, r, w, k, v, a, b):
    """RWKV-7 recurrence. state [H, N, N] fp32 (value i, key j), in place; r, w, k, v, a, b:
    [T, H*N] fp32. Returns y [T, H*N] fp32."""
    _checks.validate_wkv7(state, r, w, k, v, a, b)
    y, S = wkv7_math(state, r, w, k, v, a, b)
    state.copy_(S)
    return y


def _start_from(state, state_in):
    """A block op's state_in: the old state is copied into state (nothing to do when absent or
    state itself)."""
    if state_in is not None and state_in.data_ptr() != state.data_ptr():
        state.copy_(state_in)


def wkv6_block(state, r, k, v, w, g, p, eps, state_in=None):
    """RWKV-6 time mix around the recurrence (wkv6_block_math with wkv6_forward). state [H, N, N]
    fp32 in place, starting from state_in's values when given; g [T, H*N] fp32 or bf16; r, k, v, w
    [T, H*N] fp32 or g's dtype; p [4, H*N] fp32 (time_decay, time_first, ln_x weight, ln_x bias).
    Computes in fp32; returns y [T, H*N] in g's dtype."""
    _checks.validate_wkv6_block(state, r, k, v, w, g, p, state_in)
    _start_from(state, state_in)
    rows = [t.float() for t in (r, k, v, w, g)]
    return wkv6_block_math(wkv6_forward, state, *rows, p.unbind(0), eps).to(g.dtype)


def wkv7_block(state, r, w, k, v, a, g, v_first, v_gate, p, eps, state_in=None):
    """RWKV-7 time mix around the recurrence (wkv7_block_math with wkv7_forward). state [H, N, N]
    fp32 in place, starting from state_in's values when given; r, w, k, v, a, g and v_first,
    v_gate (both or neither) [T, H*N], the activation dtype; p [8, H*N] fp32 (w0, a0, v0, k_k,
    k_a, r_k, ln_x weight, ln_x bias). Computes in fp32; returns y [T, H*N] in r's dtype."""
    _checks.validate_wkv7_block(state, r, w, k, v, a, g, v_first, v_gate, p, state_in)
    _start_from(state, state_in)
    acts = [None if t is None else t.float() for t in (r, w, k, v, a, g, v_first, v_gate)]
    return wkv7_block_math(wkv7_forward, state, *acts, p.unbind(0), eps).to(r.dtype)


def pooled_empty_like(t):
    """An uninitialized contiguous tensor of t's shape, dtype and device (the compiled CPU op takes
    its memory from the ops' block pool; the values are unspecified either way)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def ln_mix(x, sx, w, b, mix, lerp, eps):
    """Layer norm, token shift and mixes (ln_mix_math). x [T, C] and sx [C] fp32 or both bf16;
    w, b [C], mix [n, C] fp32; lerp picks the form. Computes in fp32; returns (xx [T, C],
    mixed [n, T, C]) in x's dtype."""
    _checks.validate_ln_mix(x, sx, w, b, mix)
    m = mix.unsqueeze(1)
    xx, mixed = ln_mix_math(x.float(), sx.float(), w, b, m, 1 - m if lerp else None, eps)
    return xx.to(x.dtype), mixed.to(x.dtype)


def ln_mix_split(x, sx, w, b, mix, lerp, eps):
    """ln_mix's values as separate tensors: [xx, the new shift state (xx's last row, or sx's
    values when T is 0), mixed_0, ..., mixed_{n-1}]."""
    _checks.validate_ln_mix(x, sx, w, b, mix, "ln_mix_split")
    xx, mixed = ln_mix(x, sx, w, b, mix, lerp, eps)
    shift = xx[-1].clone() if rows(xx) else sx.clone()
    return [xx, shift] + [m.clone() for m in mixed.unbind(0)]


def ln_mix_rows(x, sx, w, b, mix, lerp, eps):
    """ln_mix of B one-token rows, row b's previous row being sx[b] (ln_mix_rows_math in fp32).
    Returns [xx, mixed_0, ..., mixed_{n-1}], each [B, C] in x's dtype."""
    _checks.validate_ln_mix_rows(x, sx, w, b, mix)
    m = mix.unsqueeze(1)
    xx, mixed = ln_mix_rows_math(x.float(), sx.float(), w, b, m, 1 - m if lerp else None, eps)
    return [xx.to(x.dtype)] + [t.to(x.dtype) for t in mixed.unbind(0)]


def maa_mix_rows(xx, sx, z, w2, maa):
    """maa_mix of B one-token rows, row b's previous row being sx[b] (maa_mix_rows_math in
    fp32). Returns the n mixes, each [B, C] in xx's dtype."""
    _checks.validate_maa_mix_rows(xx, sx, z, w2, maa)
    m = maa_mix_rows_math(xx.float(), sx.float(), z.float(), w2.float(), maa.unsqueeze(1))
    return [t.to(xx.dtype) for t in m.unbind(0)]


def maa_mix(xx, sx, z, w2, maa):
    """RWKV-6's data-dependent token shift (maa_mix_math). xx [T, C], sx [C], z [T, n*D] fp32 or
    all bf16; w2 [n, D, C] fp32 or bf16; maa [n, C] fp32. Computes in fp32; returns [n, T, C] in
    xx's dtype."""
    _checks.validate_maa_mix(xx, sx, z, w2, maa)
    return maa_mix_math(xx.float(), sx.float(), z.float(), w2.float(), maa.unsqueeze(1)).to(xx.dtype)


def maa_mix_split(xx, sx, z, w2, maa):
    """maa_mix's values as n separate tensors [T, C]."""
    _checks.validate_maa_mix(xx, sx, z, w2, maa, "maa_mix_split")
    return [m.clone() for m in maa_mix(xx, sx, z, w2, maa).unbind(0)]


def maa_lora_one(xx, sx, xw, w1, w2, maa):
    """maa_mix_split of one token (xx [1, C]) whose z is linear_one(xw, w1): the first low-rank
    product and the token shift after it in one op."""
    _checks.validate_maa_lora_one(xx, sx, xw, w1, w2, maa)
    return maa_mix_split(xx, sx, linear_one(xw, w1), w2, maa)


def _mm8(op, x, w, mx, rx, my, ry, seq):
    _checks.validate_mm8(op, x, w, mx, rx, my, ry, seq)
    f = torch.float32
    return mm8_math(x.to(f), w, mx.to(f), rx.to(f), my.to(f), ry.to(f)).to(x.dtype)


def mm8_one(x, w, mx, rx, my, ry):
    """Int8 matrix-vector product. x [N] or [1, N] fp32|bf16|fp16; w [N, M] uint8; mx, rx [M];
    my, ry [N, 1] in x's dtype. fp32 compute. Returns y [M] or [1, M] (as x) in x's dtype."""
    return _mm8("mm8_one", x, w, mx, rx, my, ry, False)


def mm8_seq(x, w, mx, rx, my, ry):
    """Int8 matrix product. x [T, N]; otherwise as mm8_one. Returns y [T, M] in x's dtype."""
    return _mm8("mm8_seq", x, w, mx, rx, my, ry, True)


#: The largest |xq| of mm8_one_i16's int16 activation: 127 * 256 + 127, so that every xq splits
#: into two signed bytes (256*h + l), which the AVX-512 VNNI kernel multiplies with two vpdpbusd
#: per 64 weights (the full int16 range needs three). csrc/cpu/kernels/mm8.h: kXqMax.
XQ_MAX = 32639.0


def mm8_one_i16(x, w, mx, rx, my, ry, act=0):
    """mm8_one (side tensors in x's dtype or fp32) with xs = x*ry rounded to int16 (scale
    max|xs|/XQ_MAX, round half to even) and exact integer dot products; mm8_one's fp32 math when
    xs is all zero or not finite; then the activation ``act`` (in fp32). Returns [M] or [1, M] (as x) in x's dtype. The compiled kernel
    quantizes identically, so only the fp32 sums (and the activation's last bits) differ."""
    _checks.validate_mm8("mm8_one_i16", x, w, mx, rx, my, ry, False, fp32_side=True)
    _checks.check_act("mm8_one_i16", act)
    f = torch.float32
    x32, ry32 = x.to(f), ry.to(f)
    xs = x32 * ry32[:, 0]
    amax = xs.abs().max() if xs.numel() else xs.new_zeros(())
    inv = torch.tensor(XQ_MAX, dtype=f) / amax
    usable = bool(torch.isfinite(xs.sum()) and amax > 0 and torch.isfinite(amax) and torch.isfinite(inv))
    if not usable:  # mm8_one's math (in fp32, so the side tensors may be fp32 here too)
        y = mm8_math(x32, w, mx.to(f), rx.to(f), my.to(f), ry32)
        return activate(y, act).to(x.dtype)
    xq = torch.round(xs * inv)  # |xq| <= XQ_MAX
    scale = amax / torch.tensor(XQ_MAX, dtype=f)
    # float64 holds every partial sum exactly (|sum| < N * 32768 * 255 < 2^53).
    dot = (xq.double() @ w.double()).to(torch.int64).to(f) * scale
    y = rx.to(f) * (dot + 0.5 * xs.sum()) + (x32 * my.to(f)[:, 0]).sum() + mx.to(f) * x32.sum()
    return activate(y, act).to(x.dtype)


def mm8_rows_i16(x, w, mx, rx, my, ry, act=0):
    """mm8_one_i16 of each row of x [T, N] on its own (its own int16 scale). Returns [T, M] in x's
    dtype."""
    _checks.validate_mm8("mm8_rows_i16", x, w, mx, rx, my, ry, True, fp32_side=True)
    _checks.check_act("mm8_rows_i16", act)
    rows = [mm8_one_i16(x[t:t + 1], w, mx, rx, my, ry, act) for t in range(int(x.shape[0]))]
    return torch.cat(rows) if rows else x.new_empty((0, w.shape[1]))


def gemm_fp16(a, b, fp32_out):
    """a [T, K] fp16 @ b [K, M] fp16 with fp32 accumulation; [T, M] fp32 if fp32_out else fp16."""
    _checks.validate_gemm_fp16(a, b)
    y = a.to(torch.float32) @ b.to(torch.float32)
    return y if fp32_out else y.to(torch.float16)


def linear_one(x, w, act=0):
    """x [N] or [1, N] @ w [N, M] (column-major), both bf16 or both fp32, with fp32 accumulation,
    then the activation ``act`` (in fp32); returns [M] or [1, M] (as x) in x's dtype."""
    _checks.validate_linear_one(x, w)
    _checks.check_act("linear_one", act)
    return activate(x.to(torch.float32) @ w.to(torch.float32), act).to(x.dtype)


def linear_rows(x, w):
    """x [T, N] @ w (column-major [N, M], or [S, N/S, M] row slabs) in fp32, slabs summed in fp32
    in slab order; both bf16 or both fp32. Returns [T, M] fp32."""
    T, N, M, S = _checks.validate_linear_rows(x, w)
    x32 = x.to(torch.float32)
    if w.dim() == 2:
        return x32 @ w.to(torch.float32)
    K = N // S
    y = x32.new_zeros((T, M))
    for s in range(S):
        y += x32[:, s * K:(s + 1) * K] @ w[s].to(torch.float32)
    return y


def linear_one_group(x, w, side, act):
    """Several one-token products: for each i, linear_one(x[i], w[i], act[i]) when w[i] is bf16 or
    fp32, mm8_one_i16(x[i], w[i], mx, rx, my, ry, act[i]) when it is uint8, its mx, rx, my, ry
    being the next four tensors of ``side``. Returns the list of results."""
    _checks.validate_linear_one_group(x, w, side, act)
    return [linear_one(xi, wi, a) if side_i is None else mm8_one_i16(xi, wi, *side_i, a)
            for (_, xi, wi, side_i), a in zip(_checks.linear_one_group_members(x, w, side), act)]


def linear_one_slabs(x, w, side, act=0):
    """One product whose weight w [S, N/S, M] is stored as row slabs: slab s's product (mm8_one_i16
    of x's rows of the slab with its rows of my, ry for a uint8 w, whose side is mx, rx, my, ry;
    linear_one for a bf16 or fp32 w, side empty) in fp32, summed in slab order, then the
    activation ``act``. Returns [M] or [1, M] (as x) in x's dtype."""
    N, M, S = _checks.validate_linear_one_slabs(x, w, side)
    _checks.check_act("linear_one_slabs", act)
    f, K = torch.float32, N // S
    x32 = x.to(f)
    side32 = [t.to(f) for t in side]
    y = None
    for s in range(S):
        rows_s = slice(s * K, (s + 1) * K)
        if side32:
            mx, rx, my, ry = side32
            part = mm8_one_i16(x32[..., rows_s], w[s], mx, rx, my[rows_s], ry[rows_s])
        else:
            part = linear_one(x32[..., rows_s], w[s].to(f))
        y = part if y is None else y + part
    return activate(y, act).to(x.dtype)


def linear_one_residual(x, w, side, act, residual, gate=None):
    """The one-token product linear_one_slabs (w [S, N/S, M]), mm8_one_i16 (uint8 w, side = mx,
    rx, my, ry) or linear_one (bf16/fp32 w) computes, then ``residual + y`` or, with a gate,
    ``residual + gate * y`` (torch's ops, in x's dtype)."""
    _checks.validate_linear_one_residual(x, w, side, act, residual, gate)
    if w.dim() == 3:
        y = linear_one_slabs(x, w, side, act)
    elif w.dtype == torch.uint8:
        y = mm8_one_i16(x, w, *side, act)
    else:
        y = linear_one(x, w, act)
    return residual + (y if gate is None else gate * y)


def linear_one_chain(x, w, side, act, src):
    """Products i < len(x): linear_one_group's of x[i]; then product len(x) + j of the result of
    product src[j]. w, side (4 per uint8 w, in order) and act cover all of them. Returns every
    result, in that order."""
    _checks.validate_linear_one_chain(x, w, side, act, src)  # (so the groups below cannot fail)
    n, s = len(x), 4 * sum(t.dtype == torch.uint8 for t in w[:len(x)])
    first = linear_one_group(x, w[:n], side[:s], act[:n])
    return first + (linear_one_group([first[j] for j in src], w[n:], side[s:], act[n:]) if src else [])


def linear_one_ffn(x, w, side, act, residual, gate):
    """A channel mix: linear_one_group's products of x, then linear_one_residual of the last
    one's result with the value weight w[len(x)] (its side tensors last in side), the residual
    and, for gate >= 0, the result of product gate as the gate."""
    _checks.validate_linear_one_ffn(x, w, side, act, residual, gate)  # (so the calls below cannot fail)
    n, s = len(x), 4 * sum(t.dtype == torch.uint8 for t in w[:len(x)])
    ys = linear_one_group(x, w[:n], side[:s], act)
    return linear_one_residual(ys[-1], w[n], side[s:], 0, residual, None if gate < 0 else ys[gate])
