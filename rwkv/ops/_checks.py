"""Input rules of every op, shared by the fake (meta) kernels and the pure-torch references.

Messages follow the project format ``<op>: <argument> <rule>, got <actual>`` and are the same
text the C++ kernels produce (csrc/common/checks.h), so a test can match either backend.
``torch._check`` raises RuntimeError and keeps working with symbolic shapes under tracing.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


#: The activations linear_one and mm8_one_i16 can apply to their output, by code (0: none).
ACTIVATIONS = {"sigmoid": 1, "relu2": 2, "tanh": 3, "silu": 4}


def check_act(op: str, act: int) -> None:
    torch._check(0 <= act <= 4, lambda: f"{op}: act must be 0 (none), 1 (sigmoid), 2 (relu squared), "
                                         f"3 (tanh) or 4 (silu), got {act}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _shape(t: torch.Tensor) -> list:
    return [int(s) for s in t.shape]


def check_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype, why: str = "") -> None:
    torch._check(t.dtype == dtype,
                 lambda: f"{op}: {name} must be {dtype_name(dtype)}{why}, got {dtype_name(t.dtype)}")


def check_dim(op: str, name: str, t: torch.Tensor, pattern: str, ndim: int) -> None:
    torch._check(t.dim() == ndim, lambda: f"{op}: {name} must have shape {pattern}, got {_shape(t)}")


def check_shape(op: str, name: str, t: torch.Tensor, pattern: str, expected: Sequence[int]) -> None:
    expected = [int(e) for e in expected]
    torch._check(t.dim() == len(expected) and _shape(t) == expected,
                 lambda: f"{op}: {name} must have shape {pattern} = {expected}, got {_shape(t)}")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    torch._check(t.is_contiguous(),
                 lambda: f"{op}: {name} must be contiguous, got strides {list(t.stride())}")


def check_same_device(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    first = tensors[0]
    for name, t in zip(names[1:], tensors[1:]):
        torch._check(t.device == first.device,
                     lambda: f"{op}: {name} must be on the same device as {names[0]} "
                             f"({first.device}), got {t.device}")


def _check_rows(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor], T: int, C: int,
                pattern: str = "[T, H*N]", dtype: torch.dtype = torch.float32, why: str = "") -> None:
    for name, t in zip(names, tensors):
        check_dtype(op, name, t, dtype, why)
        check_shape(op, name, t, pattern, (T, C))


def _check_channel_vectors(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor], C: int,
                           dtype: torch.dtype = torch.float32, why: str = "") -> None:
    for name, t in zip(names, tensors):
        check_dtype(op, name, t, dtype, why)
        check_shape(op, name, t, "[C]", (C,))


def check_activation_dtype(op: str, name: str, x: torch.Tensor) -> None:
    """The fused ops' activations (the model's activation dtype): float32 or bfloat16, and float16
    too on CUDA (the CPU kernels have no fp16 path). They compute in fp32 and give their result in
    this dtype."""
    if x.device.type == "cuda":
        torch._check(x.dtype in (torch.float32, torch.bfloat16, torch.float16),
                     lambda: f"{op}: {name} must be float32, bfloat16 or float16, got {dtype_name(x.dtype)}")
    else:
        torch._check(x.dtype in (torch.float32, torch.bfloat16),
                     lambda: f"{op}: {name} must be float32 or bfloat16, got {dtype_name(x.dtype)}")


def _check_activation_and_shift(op: str, name: str, x: torch.Tensor, sx: torch.Tensor) -> tuple:
    """A token-shift op's activation ``name`` [T, C] (float32 or bfloat16) and its shift state sx
    [C] in the same dtype; returns (T, C)."""
    check_activation_dtype(op, name, x)
    check_dim(op, name, x, "[T, C]", 2)
    T, C = int(x.shape[0]), int(x.shape[1])
    _check_channel_vectors(op, ("sx",), (sx,), C, x.dtype, f" ({name}'s dtype)")
    return T, C


def _check_state_and_r(op: str, state: torch.Tensor, r: torch.Tensor, r_activation: bool = False) -> tuple:
    """The [H, N, N] fp32 contiguous state of wkv5/6/7 and the [T, H*N] r, float32 or, for an op
    whose r is an activation (r_activation), bfloat16 too; returns (T, H, N)."""
    check_dtype(op, "state", state, torch.float32)
    check_dim(op, "state", state, "[H, N, N]", 3)
    H, N = int(state.shape[0]), int(state.shape[1])
    check_shape(op, "state", state, "[H, N, N]", (H, N, N))
    check_contiguous(op, "state", state)
    if r_activation:
        check_activation_dtype(op, "r", r)
    else:
        check_dtype(op, "r", r, torch.float32)
    check_dim(op, "r", r, "[T, H*N]", 2)
    return int(r.shape[0]), H, N


def _check_block_params(op: str, p: torch.Tensor, rows: int, C: int) -> None:
    """A block op's parameter rows: p [rows, H*N] fp32 contiguous."""
    _check_rows(op, ("p",), (p,), rows, C, f"[{rows}, H*N]")
    check_contiguous(op, "p", p)


def validate_wkv4(w, u, k, v, aa, bb, pp, op: str = "wkv4_forward",
                  kv: torch.dtype = torch.float32) -> tuple:
    """Checks wkv4_forward's arguments (those it shares with ``op``; k and v of dtype kv);
    returns (T, C)."""
    check_same_device(op, ("k", "w", "u", "v", "aa", "bb", "pp"), (k, w, u, v, aa, bb, pp))
    check_dtype(op, "k", k, kv)
    check_dim(op, "k", k, "[T, C]", 2)
    T, C = int(k.shape[0]), int(k.shape[1])
    _check_rows(op, ("v",), (v,), T, C, "[T, C]", kv, " (as k)")
    _check_channel_vectors(op, ("w", "u", "aa", "bb", "pp"), (w, u, aa, bb, pp), C)
    for name, t in (("aa", aa), ("bb", bb), ("pp", pp)):
        check_contiguous(op, name, t)
    return T, C


def validate_wkv4_block(w, u, k, v, r, aa, bb, pp) -> tuple:
    """Checks wkv4_block's arguments; returns (T, C)."""
    op = "wkv4_block"
    check_same_device(op, ("k", "r"), (k, r))
    check_activation_dtype(op, "r", r)
    torch._check(k.dtype in (torch.float32, r.dtype),
                 lambda: f"{op}: k must be float32 or r's dtype ({dtype_name(r.dtype)}), got "
                         f"{dtype_name(k.dtype)}")
    T, C = validate_wkv4(w, u, k, v, aa, bb, pp, op, k.dtype)
    check_shape(op, "r", r, "[T, C]", (T, C))
    return T, C


def _validate_wkv56(op: str, state, r, k, v, w, u, w_per_token: bool) -> tuple:
    check_same_device(op, ("state", "r", "k", "v", "w", "u"), (state, r, k, v, w, u))
    T, H, N = _check_state_and_r(op, state, r)
    _check_rows(op, ("r", "k", "v"), (r, k, v), T, H * N)
    if w_per_token:
        _check_rows(op, ("w",), (w,), T, H * N)
    else:
        check_dtype(op, "w", w, torch.float32)
        check_shape(op, "w", w, "[H, N]", (H, N))
    check_dtype(op, "u", u, torch.float32)
    check_shape(op, "u", u, "[H, N]", (H, N))
    return T, H, N


def validate_wkv5(state, r, k, v, w, u) -> tuple:
    """Checks wkv5_forward's arguments; returns (T, H, N)."""
    return _validate_wkv56("wkv5_forward", state, r, k, v, w, u, w_per_token=False)


def validate_wkv6(state, r, k, v, w, u) -> tuple:
    """Checks wkv6_forward's arguments; returns (T, H, N)."""
    return _validate_wkv56("wkv6_forward", state, r, k, v, w, u, w_per_token=True)


def validate_wkv7(state, r, w, k, v, a, b) -> tuple:
    """Checks wkv7_forward's arguments; returns (T, H, N)."""
    op = "wkv7_forward"
    names = ("state", "r", "w", "k", "v", "a", "b")
    check_same_device(op, names, (state, r, w, k, v, a, b))
    T, H, N = _check_state_and_r(op, state, r)
    _check_rows(op, names[1:], (r, w, k, v, a, b), T, H * N)
    return T, H, N


def validate_wkv6_block(state, r, k, v, w, g, p, state_in=None) -> tuple:
    """Checks wkv6_block's arguments; returns (T, H, N)."""
    op = "wkv6_block"
    names = ("state", "r", "k", "v", "w", "g", "p")
    check_same_device(op, names, (state, r, k, v, w, g, p))
    check_activation_dtype(op, "g", g)
    T, H, N = _check_state_and_r(op, state, r, r_activation=True)
    # r, k, v, w: fp32, or in g's dtype (the products' results as the model rounds them).
    for name, t in zip(names[1:5], (r, k, v, w)):
        torch._check(t.dtype in (torch.float32, g.dtype),
                     lambda: f"{op}: {name} must be float32 or g's dtype ({dtype_name(g.dtype)}), "
                             f"got {dtype_name(t.dtype)}")
        _check_rows(op, (name,), (t,), T, H * N, dtype=t.dtype)
    _check_rows(op, ("g",), (g,), T, H * N, dtype=g.dtype)
    _check_block_params(op, p, 4, H * N)
    if state_in is not None:
        _check_state_in(op, state, state_in)
    return T, H, N


def _check_state_in(op: str, state: torch.Tensor, state_in: torch.Tensor) -> None:
    """A block op's state_in: like state (fp32, contiguous, same shape and device), and state
    itself or not overlapping it."""
    check_same_device(op, ("state", "state_in"), (state, state_in))
    check_dtype(op, "state_in", state_in, torch.float32)
    torch._check(state_in.shape == state.shape,
                 lambda: f"{op}: state_in must have state's shape {list(state.shape)}, got {list(state_in.shape)}")
    check_contiguous(op, "state_in", state_in)
    if state.device.type != "meta" and not isinstance(state, FakeTensor):  # real storage only
        a, b, n = state.data_ptr(), state_in.data_ptr(), state.numel() * 4
        torch._check(a == b or b + n <= a or a + n <= b,
                     lambda: f"{op}: state_in must be state itself or not overlap it")


def validate_wkv7_block(state, r, w, k, v, a, g, v_first, v_gate, p, state_in=None) -> tuple:
    """Checks wkv7_block's arguments; returns (T, H, N)."""
    op = "wkv7_block"
    names = ("state", "r", "w", "k", "v", "a", "g", "p")
    check_same_device(op, names, (state, r, w, k, v, a, g, p))
    T, H, N = _check_state_and_r(op, state, r, r_activation=True)
    _check_rows(op, ("r", "w", "k", "v", "a", "g"), (r, w, k, v, a, g), T, H * N, dtype=r.dtype, why=" (r's dtype)")
    torch._check((v_first is None) == (v_gate is None),
                 lambda: f"{op}: v_first and v_gate must be given together (layers after the first) "
                         f"or both be None, got {'v_first' if v_gate is None else 'v_gate'} only")
    if v_first is not None:
        check_same_device(op, ("state", "v_first", "v_gate"), (state, v_first, v_gate))
        _check_rows(op, ("v_first", "v_gate"), (v_first, v_gate), T, H * N, dtype=r.dtype, why=" (r's dtype)")
    _check_block_params(op, p, 8, H * N)
    if state_in is not None:
        _check_state_in(op, state, state_in)
    return T, H, N


def validate_ln_mix(x, sx, w, b, mix, op: str = "ln_mix") -> tuple:
    """Checks ln_mix's (or ln_mix_split's) arguments; returns (T, C, n)."""
    check_same_device(op, ("x", "sx", "w", "b", "mix"), (x, sx, w, b, mix))
    T, C = _check_activation_and_shift(op, "x", x, sx)
    return T, C, _check_norm_and_mix(op, w, b, mix, C)


def _check_norm_and_mix(op: str, w, b, mix, C: int) -> int:
    """The layer norm's w, b [C] and the mixes [n, C], all fp32; returns n."""
    _check_channel_vectors(op, ("w", "b"), (w, b), C)
    check_dtype(op, "mix", mix, torch.float32)
    check_dim(op, "mix", mix, "[n, C]", 2)
    n = int(mix.shape[0])
    check_shape(op, "mix", mix, "[n, C]", (n, C))
    return n


def _check_rows_shift(op: str, name: str, x, sx) -> tuple:
    """The batched mix ops' x and sx: both [B, C] in one activation dtype; returns (B, C)."""
    check_activation_dtype(op, name, x)
    check_dim(op, name, x, "[B, C]", 2)
    torch._check(sx.dtype == x.dtype, lambda: f"{op}: sx must be {dtype_name(x.dtype)} ({name}'s dtype), "
                                             f"got {dtype_name(sx.dtype)}")
    torch._check(tuple(sx.shape) == tuple(x.shape),
                 lambda: f"{op}: sx must have shape [B, C] = {_shape(x)} ({name}'s), got {_shape(sx)}")
    return int(x.shape[0]), int(x.shape[1])


def validate_ln_mix_rows(x, sx, w, b, mix, op: str = "ln_mix_rows") -> tuple:
    """Checks ln_mix_rows' arguments (x, sx [B, C]; w, b [C], mix [n, C] fp32); returns (B, C, n)."""
    check_same_device(op, ("x", "sx", "w", "b", "mix"), (x, sx, w, b, mix))
    B, C = _check_rows_shift(op, "x", x, sx)
    return B, C, _check_norm_and_mix(op, w, b, mix, C)


def validate_maa_mix_rows(xx, sx, z, w2, maa, op: str = "maa_mix_rows") -> tuple:
    """Checks maa_mix_rows' arguments (xx, sx [B, C]; z [B, n*D]; w2, maa as maa_mix's); returns
    (B, C, n, D)."""
    check_same_device(op, ("xx", "sx", "z", "w2", "maa"), (xx, sx, z, w2, maa))
    B, C = _check_rows_shift(op, "xx", xx, sx)
    return (B, C) + _check_maa_rest(op, xx, z, w2, maa, B, C, "[B, n*D]")


def _check_maa_rest(op: str, xx, z, w2, maa, T: int, C: int, z_pattern: str) -> tuple:
    """maa_mix's w2, z [T, n*D] in xx's dtype and maa [n, C] fp32; returns (n, D)."""
    n, D = _check_maa_w2(op, w2, C)
    _check_rows(op, ("z",), (z,), T, n * D, z_pattern, xx.dtype, " (xx's dtype)")
    _check_rows(op, ("maa",), (maa,), n, C, "[n, C]")
    return n, D


def _check_maa_w2(op: str, w2: torch.Tensor, C: int) -> tuple:
    """maa_mix's w2 [n, D, C], float32 or bfloat16 (the same two dtypes as the activations);
    returns (n, D)."""
    check_activation_dtype(op, "w2", w2)
    check_dim(op, "w2", w2, "[n, D, C]", 3)
    n, D = int(w2.shape[0]), int(w2.shape[1])
    check_shape(op, "w2", w2, "[n, D, C]", (n, D, C))
    return n, D


def check_column_major(op: str, name: str, w: torch.Tensor) -> None:
    """``name`` (a matrix w [N, M]) must be column-major."""
    torch._check(w.t().is_contiguous(),
                 lambda: f"{op}: {name} must be column-major ({name}.t() contiguous), got strides "
                         f"{list(w.stride())}")


def validate_maa_mix(xx, sx, z, w2, maa, op: str = "maa_mix") -> tuple:
    """Checks maa_mix's (or maa_mix_split's) arguments; returns (T, C, n, D)."""
    check_same_device(op, ("xx", "sx", "z", "w2", "maa"), (xx, sx, z, w2, maa))
    T, C = _check_activation_and_shift(op, "xx", xx, sx)
    return (T, C) + _check_maa_rest(op, xx, z, w2, maa, T, C, "[T, n*D]")


def validate_maa_lora_one(xx, sx, xw, w1, w2, maa, op: str = "maa_lora_one") -> tuple:
    """Checks maa_lora_one's arguments (one token: xx [1, C]; xw [1, C] and w1 [C, n*D],
    column-major, in xx's dtype; w2 and maa as maa_mix's); returns (1, C, n, D)."""
    check_same_device(op, ("xx", "sx", "xw", "w1", "w2", "maa"), (xx, sx, xw, w1, w2, maa))
    T, C = _check_activation_and_shift(op, "xx", xx, sx)
    torch._check(T == 1, lambda: f"{op}: xx must be one token, shape [1, C], got {_shape(xx)}")
    _check_rows(op, ("xw",), (xw,), 1, C, "[1, C]", xx.dtype, " (xx's dtype)")
    n, D = _check_maa_w2(op, w2, C)
    check_dtype(op, "w1", w1, xx.dtype, " (xx's dtype)")
    check_dim(op, "w1", w1, "[C, n*D]", 2)
    check_shape(op, "w1", w1, "[C, n*D]", (C, n * D))
    check_column_major(op, "w1", w1)
    _check_rows(op, ("maa",), (maa,), n, C, "[n, C]")
    return T, C, n, D


def check_one_row(op: str, name: str, t: torch.Tensor) -> None:
    """A one-token product's x: [N] or [1, N] (one row; the result keeps it: [M] or [1, M])."""
    torch._check(t.dim() == 1 or (t.dim() == 2 and t.shape[0] == 1),
                 lambda: f"{op}: {name} must have shape [N] or [1, N] (one token), got {_shape(t)}")


def one_row_shape(x: torch.Tensor, M: int) -> tuple:
    """The shape of a one-token product's result: (M,) for x [N], (1, M) for x [1, N]."""
    return (1, M) if x.dim() == 2 else (M,)


def validate_mm8(op: str, x, w, mx, rx, my, ry, seq: bool, fp32_side: bool = False) -> tuple:
    """Checks mm8_seq (seq: x [T, N]) or one-token (x [N] or [1, N]) arguments; returns (N, M).
    fp32_side: mx, rx, my, ry may also be float32 (mm8_one_i16, linear_one_group)."""
    check_same_device(op, ("x", "w", "mx", "rx", "my", "ry"), (x, w, mx, rx, my, ry))
    torch._check(x.dtype in FLOAT_DTYPES,
                 lambda: f"{op}: x must be float32, bfloat16 or float16, got {dtype_name(x.dtype)}")
    if seq:
        check_dim(op, "x", x, "[T, N]", 2)
    else:
        check_one_row(op, "x", x)
    N = int(x.shape[-1])
    check_dtype(op, "w", w, torch.uint8)
    check_dim(op, "w", w, "[N, M]", 2)
    M = int(w.shape[1])
    check_shape(op, "w", w, "[N, M]", (N, M))
    _check_side(op, x, (mx, rx, my, ry), N, M, fp32_side)
    return N, M


def _check_side(op: str, x, side, N: int, M: int, fp32_side: bool) -> None:
    """An int8 product's mx, rx [M] and my, ry [N, 1], in x's dtype (or float32 where fp32_side)."""
    for name, t, pattern, shape in zip(("mx", "rx", "my", "ry"), side, ("[M]", "[M]", "[N, 1]", "[N, 1]"),
                                       ((M,), (M,), (N, 1), (N, 1))):
        if fp32_side and x.dtype != torch.float32:
            torch._check(t.dtype in (x.dtype, torch.float32),
                         lambda: f"{op}: {name} must be {dtype_name(x.dtype)} (x's dtype) or float32, "
                                 f"got {dtype_name(t.dtype)}")
        else:
            check_dtype(op, name, t, x.dtype, " (x's dtype)")
        check_shape(op, name, t, pattern, shape)


def validate_gemm_fp16(a, b) -> tuple:
    """Checks gemm_fp16's arguments; returns (T, K, M)."""
    op = "gemm_fp16"
    check_same_device(op, ("a", "b"), (a, b))
    check_dtype(op, "a", a, torch.float16)
    check_dim(op, "a", a, "[T, K]", 2)
    T, K = int(a.shape[0]), int(a.shape[1])
    check_dtype(op, "b", b, torch.float16)
    check_dim(op, "b", b, "[K, M]", 2)
    M = int(b.shape[1])
    check_shape(op, "b", b, "[K, M]", (K, M))
    return T, K, M


def validate_linear_one(x, w, op: str = "linear_one") -> tuple:
    """Checks linear_one's arguments; returns (N, M). ``op`` names the op in messages."""
    check_same_device(op, ("x", "w"), (x, w))
    torch._check(x.dtype in (torch.bfloat16, torch.float32),
                 lambda: f"{op}: x must be bfloat16 or float32, got {dtype_name(x.dtype)}")
    check_one_row(op, "x", x)
    check_dtype(op, "w", w, x.dtype, " (x's dtype)")
    check_dim(op, "w", w, "[N, M]", 2)
    N, M = int(x.shape[-1]), int(w.shape[1])
    check_shape(op, "w", w, "[N, M]", (N, M))
    check_column_major(op, "w", w)
    return N, M


def validate_linear_rows(x, w, op: str = "linear_rows") -> tuple:
    """Checks linear_rows' arguments (x [T, N] bf16/fp32; w [N, M] column-major or [S, N/S, M]
    row slabs each column-major, in x's dtype); returns (T, N, M, S)."""
    check_same_device(op, ("x", "w"), (x, w))
    torch._check(x.dtype in (torch.bfloat16, torch.float32),
                 lambda: f"{op}: x must be bfloat16 or float32, got {dtype_name(x.dtype)}")
    check_dim(op, "x", x, "[T, N]", 2)
    check_dtype(op, "w", w, x.dtype, " (x's dtype)")
    torch._check(w.dim() in (2, 3), lambda: f"{op}: w must have shape [N, M] or [S, N/S, M], got {_shape(w)}")
    T, N = int(x.shape[0]), int(x.shape[1])
    S = int(w.shape[0]) if w.dim() == 3 else 1
    K, M = int(w.shape[-2]), int(w.shape[-1])
    torch._check(S >= 1 and S * K == N,
                 lambda: f"{op}: w must have {N} rows (x's N) in {S} slab(s), got shape {_shape(w)}")
    torch._check(w.numel() == 0 or ((K <= 1 or w.stride(-2) == 1) and (M <= 1 or w.stride(-1) == K)
                                    and (S == 1 or w.stride(0) == K * M)),
                 lambda: f"{op}: w must be column-major (w.t() contiguous, or each slab's), got strides "
                         f"{list(w.stride())}")
    return T, N, M, S


def validate_linear_one_slabs(x, w, side, op: str = "linear_one_slabs") -> tuple:
    """Checks linear_one_slabs' arguments (x [N] or [1, N] bf16/fp32; w [S, N/S, M] row slabs, each
    column-major; uint8 w with side = mx, rx, my, ry, else w in x's dtype and side empty); returns
    (N, M, S). ``op`` names the op in messages."""
    q = w.dtype == torch.uint8
    torch._check(len(side) == (4 if q else 0),
                 lambda: f"{op}: side must " + ("hold mx, rx, my, ry (w is uint8)" if q else
                                                 "be empty (w is not uint8)") + f", got {len(side)} tensors")
    check_same_device(op, ("x", "w"), (x, w))
    if q:
        check_same_device(op, ("x", "mx", "rx", "my", "ry"), (x, *side))
    torch._check(x.dtype in (torch.bfloat16, torch.float32),
                 lambda: f"{op}: x must be bfloat16 or float32, got {dtype_name(x.dtype)}")
    check_one_row(op, "x", x)
    check_dim(op, "w", w, "[S, N/S, M]", 3)
    N = int(x.shape[-1])
    S, K, M = (int(d) for d in w.shape)
    torch._check(S >= 1 and S * K == N,
                 lambda: f"{op}: w must have shape [S, N/S, M] with S >= 1 slabs of N/S rows (N = {N}), "
                         f"got {_shape(w)}")
    torch._check(w.numel() == 0 or ((K <= 1 or w.stride(1) == 1) and (M <= 1 or w.stride(2) == K)),
                 lambda: f"{op}: w's slabs must be column-major (w[s].t() contiguous), got strides "
                         f"{list(w.stride())}")
    if not q:
        check_dtype(op, "w", w, x.dtype, " (x's dtype)")
        return N, M, S
    _check_side(op, x, side, N, M, True)
    return N, M, S


def _validate_one_product(op: str, x, w, side) -> int:
    """One product as linear_one (bf16/fp32 w [N, M], side empty), mm8_one_i16 (uint8 w [N, M], side
    mx, rx, my, ry) or linear_one_slabs (w [S, N/S, M]) takes it, in ``op``'s words; returns M."""
    if w.dim() == 3:
        return validate_linear_one_slabs(x, w, side, op)[1]
    q = w.dtype == torch.uint8
    torch._check(len(side) == (4 if q else 0),
                 lambda: f"{op}: side must " + ("hold mx, rx, my, ry (w is uint8)" if q else
                                                 "be empty (w is not uint8)") + f", got {len(side)} tensors")
    return validate_mm8(op, x, w, *side, False, fp32_side=True)[1] if q else validate_linear_one(x, w, op)[1]


def _validate_member(name: str, x, w, side, act) -> tuple:
    """One product of a group (linear_one for side None, else mm8_one_i16 with side) and its
    activation, in ``name``'s words; returns (N, M)."""
    dims = validate_linear_one(x, w, name) if side is None else validate_mm8(name, x, w, *side, False,
                                                                             fp32_side=True)
    check_act(name, act)
    return dims


def validate_linear_one_residual(x, w, side, act, residual, gate) -> int:
    """Checks linear_one_residual's arguments (the product's as linear_one, mm8_one_i16 or
    linear_one_slabs takes them; residual and gate: the product's shape and x's dtype); returns M."""
    op = "linear_one_residual"
    M = _validate_one_product(op, x, w, side)
    check_act(op, act)
    _check_residual(op, x, M, residual, gate)
    return M


def _check_residual(op: str, x, M: int, residual, gate) -> None:
    """A residual and a gate (None: none) for a product of x with M columns."""
    shape = one_row_shape(x, M)
    for name, t in (("residual", residual), ("gate", gate)):
        if t is None:
            continue
        check_same_device(op, ("x", name), (x, t))
        check_dtype(op, name, t, x.dtype, " (x's dtype)")
        torch._check(tuple(t.shape) == tuple(shape),
                     lambda: f"{op}: {name} must have the product's shape {list(shape)}, got {_shape(t)}")


def validate_linear_one_ffn(x, w, side, act, residual, gate) -> tuple:
    """Checks linear_one_ffn's arguments (the value's x: the last product's result, of that x's
    dtype); returns (an empty tensor shaped as the value's x, the value's M)."""
    op = "linear_one_ffn"
    torch._check(len(x) > 0, lambda: f"{op}: needs at least one product of x, got none")
    torch._check(len(w) == len(x) + 1 and len(act) == len(x),
                 lambda: f"{op}: w must hold a weight per x and the value's ({len(x) + 1}), act one per x "
                         f"({len(x)}), got {len(w)} and {len(act)}")
    torch._check(-1 <= gate < len(x),
                 lambda: f"{op}: gate must be -1 (none) or one of the {len(x)} products of x, got {gate}")
    members = linear_one_group_members([*x, None], w, side, op)
    dims = [_validate_member(name, xi, wi, side_i, a) for (name, xi, wi, side_i), a in zip(members[:-1], act)]
    _, _, wv, side_v = members[-1]
    xv = x[-1].new_empty(one_row_shape(x[-1], dims[-1][1]))  # the last product's result
    M = _validate_one_product(op, xv, wv, list(side_v or ()))
    g = None if gate < 0 else x[gate].new_empty(one_row_shape(x[gate], dims[gate][1]))
    _check_residual(op, xv, M, residual, g)
    return xv, M


def linear_one_group_members(x, w, side, op: str = "linear_one_group") -> list:
    """linear_one_group's products as (op name, x, w, (mx, rx, my, ry) or None): side holds the
    side tensors of each uint8 w in turn. Checks side's length."""
    n8 = sum(t.dtype == torch.uint8 for t in w)
    torch._check(len(side) == 4 * n8,
                 lambda: f"{op}: side must hold mx, rx, my, ry of each uint8 w, in order: {4 * n8} "
                         f"tensors for {n8}, got {len(side)}")
    members, s = [], 0
    for i, (xi, wi) in enumerate(zip(x, w)):
        q = wi.dtype == torch.uint8
        members.append((f"{op} (product {i})", xi, wi, tuple(side[s:s + 4]) if q else None))
        s += 4 if q else 0
    return members


def validate_linear_one_chain(x, w, side, act, src) -> tuple:
    """Checks linear_one_chain's arguments (a second product's x: its src product's result, of that
    x's dtype and M columns); returns ((N, M) of the products of x, (N, M) of the others)."""
    op = "linear_one_chain"
    torch._check(len(x) > 0, lambda: f"{op}: needs at least one product of x, got none")
    n = len(x) + len(src)
    torch._check(len(w) == n and len(act) == n,
                 lambda: f"{op}: w and act must have one entry per product (len(x) + len(src) = {n}), "
                         f"got {len(w)} and {len(act)}")
    for j, s in enumerate(src):
        torch._check(0 <= s < len(x),
                     lambda: f"{op}: src[{j}] must name one of the {len(x)} products of x (0 to "
                             f"{len(x) - 1}), got {s}")
    members = linear_one_group_members([*x, *([None] * len(src))], w, side, op)
    first = [_validate_member(name, xi, wi, side_i, a)
             for (name, xi, wi, side_i), a in zip(members[:len(x)], act)]
    # a second product's x: the shape and dtype of its src product's result
    second = [_validate_member(name, x[s].new_empty(one_row_shape(x[s], first[s][1])), wi, side_i, a)
              for (name, _, wi, side_i), a, s in zip(members[len(x):], act[len(x):], src)]
    return first, second


def validate_linear_one_group(x, w, side, act) -> list:
    """Checks linear_one_group's arguments; returns (N, M) of each product."""
    op = "linear_one_group"
    torch._check(len(x) > 0, lambda: f"{op}: needs at least one product, got none")
    torch._check(len(w) == len(x) and len(act) == len(x),
                 lambda: f"{op}: x, w and act must have the same length (one entry per product), "
                         f"got {len(x)}, {len(w)} and {len(act)}")
    return [_validate_member(name, xi, wi, side_i, a)
            for (name, xi, wi, side_i), a in zip(linear_one_group_members(x, w, side), act)]
