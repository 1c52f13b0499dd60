"""CUDA kernels (csrc/cuda/) against the float64 spec (rwkv.ops.reference.*_math).

Covers every op for its dtypes (wkv*: fp32; mm8: fp32/fp16/bf16; gemm_fp16: fp16 in, fp32/fp16
out), T = 1 and T > 1, head sizes 32/64/128 plus odd ones (the kernels are compiled for buckets
16..256 and mask the rest), in-place state semantics, sequence == token by token, bitwise
determinism of mm8, both mm8 load paths (16-byte vector and scalar), CUDA graph capture, a
side stream, opcheck, and the rejection messages (the words of rwkv/ops/_checks.py).
Skipped without a GPU; fails (does not skip) when a GPU is present but no CUDA kernel is
registered, since then the build is broken.
"""

from __future__ import annotations

import pytest
import torch

import rwkv.ops as ops
from rwkv.ops import reference as ref

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]

DEV = "cuda"


def op(name):
    return ops.resolve(name, "cuda", "compiled")  # raises, saying why, without a CUDA kernel


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def uni(shape, gen, lo=-1.0, hi=1.0, dtype=torch.float32):
    t = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    return t.to(device=DEV, dtype=dtype)


def d64(*ts):
    return [t.detach().to("cpu", torch.float64) for t in ts]


def close(actual, expected64, tol=1e-4):
    """fp32 vs float64: |err| <= tol * max(1, max|expected|) + tol * |expected|."""
    scale = max(1.0, float(expected64.abs().max())) if expected64.numel() else 1.0
    torch.testing.assert_close(actual.detach().cpu().double(), expected64, rtol=tol, atol=tol * scale)


# ----------------------------------------------------------------------------------- wkv4

def wkv4_inputs(T, C, gen, fresh_state):
    w = -torch.exp(uni((C,), gen, -3, 1))
    u, v = uni((C,), gen), uni((T, C), gen)
    k = uni((T, C), gen, -3, 3)
    if fresh_state:  # the model's initial state
        aa, bb = torch.zeros(C, device=DEV), torch.zeros(C, device=DEV)
        pp = torch.full((C,), -1e38, device=DEV)
    else:
        aa, bb, pp = uni((C,), gen), uni((C,), gen, 0.5, 2), uni((C,), gen, -2, 2)
    return w, u, k, v, aa, bb, pp


@pytest.mark.parametrize("fresh_state", [True, False])
@pytest.mark.parametrize("T,C", [(1, 1), (1, 2048), (7, 37), (64, 256), (3, 4096)])
def test_wkv4_matches_reference(T, C, fresh_state, gen):
    w, u, k, v, aa, bb, pp = wkv4_inputs(T, C, gen, fresh_state)
    y64, aa64, bb64, pp64 = ref.wkv4_math(*d64(w, u, k, v, aa, bb, pp))
    aa_obj = aa
    y = op("wkv4_forward")(w, u, k, v, aa, bb, pp)
    assert y.shape == (T, C) and y.dtype == torch.float32 and y.device.type == DEV
    close(y, y64)
    assert aa is aa_obj
    for got, want in ((aa, aa64), (bb, bb64), (pp, pp64)):
        close(got, want)


# --------------------------------------------------------------------------------- wkv5/6/7

SHAPES = [(1, 4, 64), (1, 2, 32), (1, 2, 128), (17, 3, 64), (33, 2, 32), (9, 2, 128),
          (5, 2, 256), (4, 3, 20), (3, 2, 33), (2, 1, 1), (2, 2, 16), (130, 2, 64)]


def wkv56_inputs(version, T, H, N, gen):
    state = uni((H, N, N), gen)
    r, k, v = (uni((T, H * N), gen) for _ in range(3))
    w = uni((T, H * N) if version == 6 else (H, N), gen, 0.6, 1.0)
    u = uni((H, N), gen)
    return state, r, k, v, w, u


def wkv7_inputs(T, H, N, gen):
    state = uni((H, N, N), gen)
    r, k, v = (uni((T, H * N), gen) for _ in range(3))
    w = uni((T, H * N), gen, 0.6, 1.0)
    kk = torch.nn.functional.normalize(uni((T, H, N), gen), dim=-1)
    gate = uni((T, H, N), gen, 0, 1)
    return state, r, w, k, v, (-kk).reshape(T, H * N), (kk * gate).reshape(T, H * N)


def wkv_case(version, T, H, N, gen):
    """(op name, inputs with state first, float64 math)."""
    if version == 7:
        return "wkv7_forward", wkv7_inputs(T, H, N, gen), ref.wkv7_math
    return f"wkv{version}_forward", wkv56_inputs(version, T, H, N, gen), ref.wkv56_math


@pytest.mark.parametrize("version", [5, 6, 7])
@pytest.mark.parametrize("T,H,N", SHAPES)
def test_wkv_matches_reference(version, T, H, N, gen):
    name, (state, *rest), math = wkv_case(version, T, H, N, gen)
    y64, s64 = math(*d64(state, *rest))
    before = [t.clone() for t in rest]
    state_obj, ptr = state, state.data_ptr()
    y = op(name)(state, *rest)
    assert y.shape == (T, H * N) and y.dtype == torch.float32 and y.device.type == DEV
    close(y, y64)
    # The state is updated in place (same tensor, same storage); the inputs are untouched.
    assert state is state_obj and state.data_ptr() == ptr
    close(state, s64)
    for a, b in zip(rest, before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("version", [5, 6, 7])
@pytest.mark.parametrize("N", [32, 64, 128])
def test_wkv_sequence_equals_token_by_token(version, N, gen):
    name, (state, *rest), _ = wkv_case(version, 6, 2, N, gen)
    fn = op(name)
    s_seq, s_one = state.clone(), state.clone()
    y_seq = fn(s_seq, *rest)
    # Which inputs have a row per token: wkv5's w and u, and wkv6's u, are per head.
    per_token = {5: (1, 1, 1, 0, 0), 6: (1, 1, 1, 1, 0), 7: (1, 1, 1, 1, 1, 1)}[version]
    steps = [fn(s_one, *(x[t:t + 1] if p else x for x, p in zip(rest, per_token)))
             for t in range(6)]
    torch.testing.assert_close(y_seq, torch.cat(steps), rtol=0, atol=0)
    torch.testing.assert_close(s_seq, s_one, rtol=0, atol=0)


@pytest.mark.parametrize("version", [5, 6, 7])
def test_wkv_noncontiguous_inputs_accepted(version, gen):
    name, (state, *rest), math = wkv_case(version, 4, 2, 64, gen)
    y64, s64 = math(*d64(state, *rest))
    strided = [x.t().contiguous().t() if x.dim() == 2 else x for x in rest]
    assert any(not x.is_contiguous() for x in strided)
    close(op(name)(state, *strided), y64)
    close(state, s64)


def test_wkv_zero_tokens_keeps_state(gen):
    state, *rest = wkv7_inputs(0, 2, 64, gen)
    before = state.clone()
    y = op("wkv7_forward")(state, *rest)
    assert y.shape == (0, 128)
    assert torch.equal(state, before)


# ------------------------------------------------------------------------------------ mm8

def quantize(wf):
    """Upstream's per-matrix int8 quantization (reference-behaviour 7.2) of wf [N, M] fp32."""
    w = wf.clone()
    if w.shape[0] > w.shape[1]:
        my = w.amin(dim=1, keepdim=True)
        w = w - my
        mx = w.amin(dim=0)
        w = w - mx
    else:
        mx = w.amin(dim=0)
        w = w - mx
        my = w.amin(dim=1, keepdim=True)
        w = w - my
    rx = w.amax(dim=0)
    w = w / rx
    ry = w.amax(dim=1, keepdim=True)
    w = w / ry
    q = torch.clamp(torch.floor(w * 256), 0, 255).to(torch.uint8)
    return q, mx, rx / 16, my, ry / 16


def mm8_inputs(T, N, M, dtype, gen, seq=True):
    q, mx, rx, my, ry = quantize(uni((N, M), gen, -0.5, 0.5))
    q = q.t().contiguous().t()  # the model's storage: column-major, w.t() contiguous
    x = uni((T, N) if seq else (N,), gen, -2, 2, dtype)
    return x, q, *(t.to(dtype) for t in (mx, rx, my, ry))


def check_mm8(y, args):
    x = args[0]
    y64 = ref.mm8_math(*d64(*args))
    # fp32 accumulation error scales with sum|x| * max|W|.
    q, mx, rx, my, ry = d64(*args[1:])
    wdeq = (q + 0.5) * ry * rx + my + mx
    scale = float(x.detach().abs().double().sum(-1).max()) * float(wdeq.abs().max())
    fp32_err = 3e-5 * max(scale, 1.0)
    err = float((y.detach().cpu().double() - y64).abs().max()) if y.numel() else 0.0
    if x.dtype == torch.float32:
        assert err <= fp32_err, (err, fp32_err)
    else:  # rounding the fp32 result to x's dtype: at most 2x the spec's own rounding
        err_low = float((y64.to(x.dtype).double() - y64).abs().max()) if y.numel() else 0.0
        ulp = torch.finfo(x.dtype).eps * max(1.0, float(y64.abs().max()))
        assert err <= 2 * err_low + ulp + fp32_err, (err, err_low)


MM8_SIZES = [(64, 48), (1024, 1024), (1024, 4096), (4096, 1024), (48, 40), (100, 37), (16, 3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("N,M", MM8_SIZES)
def test_mm8_one_matches_reference(N, M, dtype, gen):
    args = mm8_inputs(1, N, M, dtype, gen, seq=False)
    y = op("mm8_one")(*args)
    assert y.shape == (M,) and y.dtype == dtype and y.device.type == DEV
    check_mm8(y, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 3, 5, 8, 16, 17, 64, 100])
@pytest.mark.parametrize("N,M", [(64, 48), (1024, 1024), (48, 40), (100, 37)])
def test_mm8_seq_matches_reference(T, N, M, dtype, gen):
    args = mm8_inputs(T, N, M, dtype, gen)
    y = op("mm8_seq")(*args)
    assert y.shape == (T, M) and y.dtype == dtype
    check_mm8(y, args)


@pytest.mark.parametrize("T", [1, 4, 16, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mm8_is_deterministic(T, dtype, gen):
    args = mm8_inputs(T, 2048, 1536, dtype, gen)
    fn = op("mm8_seq")
    first = fn(*args)
    for _ in range(3):
        assert torch.equal(fn(*args), first)
    one = op("mm8_one")(args[0][0], *args[1:])
    assert torch.equal(op("mm8_one")(args[0][0], *args[1:]), one)


def test_mm8_one_equals_seq_of_one_row(gen):
    x, *rest = mm8_inputs(1, 512, 384, torch.float16, gen)
    assert torch.equal(op("mm8_one")(x[0], *rest), op("mm8_seq")(x, *rest)[0])
    assert op("mm8_seq")(x[:0], *rest).shape == (0, 384)


def test_mm8_any_weight_layout_and_alignment(gen):
    """Row-major weights are copied into the column-major layout (same result, bit for bit);
    a misaligned x takes the scalar-load path (same math, another summation order)."""
    x, q, *side = mm8_inputs(3, 256, 96, torch.float32, gen)
    fn = op("mm8_seq")
    base = fn(x, q, *side)
    assert torch.equal(fn(x, q.contiguous(), *side), base)
    buf = torch.empty(3 * 256 + 1, device=DEV)
    xm = buf[1:].view(3, 256)
    xm.copy_(x)
    assert xm.data_ptr() % 16 != 0
    torch.testing.assert_close(fn(xm, q, *side), base, rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------ gemm_fp16

@pytest.mark.parametrize("fp32_out", [True, False])
@pytest.mark.parametrize("col_major_b", [True, False])
@pytest.mark.parametrize("T,K,M", [(1, 256, 512), (5, 64, 48), (128, 1024, 768), (3, 7, 5)])
def test_gemm_fp16_matches_reference(T, K, M, col_major_b, fp32_out, gen):
    a = uni((T, K), gen, dtype=torch.float16)
    if col_major_b:  # the model's weight layout: a transposed view
        b = uni((M, K), gen, dtype=torch.float16).t()
    else:
        b = uni((K, M), gen, dtype=torch.float16)
    c = op("gemm_fp16")(a, b, fp32_out)
    assert c.shape == (T, M) and c.dtype == (torch.float32 if fp32_out else torch.float16)
    a64, b64 = d64(a, b)
    close(c.float(), a64 @ b64, tol=1e-3 if fp32_out else 2e-3)


def test_gemm_fp16_fp32_out_does_not_overflow(gen):
    a = torch.full((2, 64), 60.0, device=DEV, dtype=torch.float16)
    b = torch.full((64, 8), 30.0, device=DEV, dtype=torch.float16)  # 64*60*30 > 65504
    c32 = op("gemm_fp16")(a, b, True)
    assert torch.isfinite(c32).all() and float(c32[0, 0]) == pytest.approx(115200.0)
    assert torch.isinf(op("gemm_fp16")(a, b, False)).all()


# ----------------------------------------------------------------------------- linear_one

@pytest.mark.parametrize("N,M", [(1024, 1024), (4096, 1000), (100, 37), (8, 3)])
def test_linear_one_matches_reference(N, M, gen):
    x = uni((N,), gen, dtype=torch.bfloat16)
    w = uni((M, N), gen, dtype=torch.bfloat16).t()  # the model's column-major weight
    y = op("linear_one")(x, w)
    assert y.shape == (M,) and y.dtype == torch.bfloat16
    want = x.double().cpu() @ w.double().cpu()
    err = float((y.double().cpu() - want).abs().max())
    err_low = float((want.to(torch.bfloat16).double() - want).abs().max())
    assert err <= 2 * err_low + torch.finfo(torch.bfloat16).eps * float(want.abs().max()) + 1e-5 * N
    assert torch.equal(op("linear_one")(x, w), y)  # deterministic
    xm = torch.empty(N + 1, device=DEV, dtype=torch.bfloat16)[1:]
    xm.copy_(x)  # misaligned: the scalar-load path
    torch.testing.assert_close(op("linear_one")(xm, w), y, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------- streams, graphs, opcheck

# ------------------------------------------------------------------- ln_mix, wkv7_block

ACT = [torch.float32, torch.float16, torch.bfloat16]
LN_EPS, GN_EPS = 1e-5, 64e-5
BLOCK_PARAM_RANGES = ((-3, 1), (-1, 1), (-1, 1), (0.5, 1.5), (0, 1), (-1, 1), (0.5, 1.5), (-0.5, 0.5))


def close_act(actual, expected64, dtype, tol=1e-4):
    """Computed in fp32 (fast-math exp, division) and rounded once: tol plus half a dtype ulp."""
    assert actual.dtype == dtype and actual.device.type == DEV
    extra = 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps / 2
    close(actual, expected64, tol + extra)


def ln_mix_inputs(T, C, n, dtype, gen):
    x, sx = uni((T, C), gen, 2, 4, dtype), uni((C,), gen, -1, 1, dtype)
    return x, sx, uni((C,), gen, 0.5, 1.5), uni((C,), gen, -0.5, 0.5), uni((n, C), gen, 0, 1)


def ln_mix_spec(x, sx, w, b, mix, lerp):
    x, sx, w, b, mix = d64(x, sx, w, b, mix)
    m = mix.unsqueeze(1)
    return ref.ln_mix_math(x, sx, w, b, m, 1 - m if lerp else None, LN_EPS)


@pytest.mark.parametrize("dtype", ACT, ids=str)
@pytest.mark.parametrize("lerp", [True, False], ids=["lerp", "delta"])
@pytest.mark.parametrize("T,C,n", [(1, 1024, 6), (1, 4096, 1), (3, 33, 2), (7, 2048, 5), (1, 8, 1),
                                   (300, 520, 2)])
def test_ln_mix_matches_spec(T, C, n, lerp, dtype, gen):
    args = ln_mix_inputs(T, C, n, dtype, gen)
    xx, mixed = op("ln_mix")(*args, lerp, LN_EPS)
    want_xx, want_mixed = ln_mix_spec(*args, lerp)
    assert xx.shape == (T, C) and mixed.shape == (n, T, C)
    close_act(xx, want_xx, dtype)
    close_act(mixed, want_mixed, dtype)


def test_ln_mix_rows_equal_token_by_token_fp32(gen):
    x, sx, w, b, mix = ln_mix_inputs(5, 300, 3, torch.float32, gen)
    xx, mixed = op("ln_mix")(x, sx, w, b, mix, False, LN_EPS)
    prev = sx
    for t in range(5):
        xx1, mixed1 = op("ln_mix")(x[t:t + 1], prev, w, b, mix, False, LN_EPS)
        assert torch.equal(xx1[0], xx[t]) and torch.equal(mixed1[:, 0], mixed[:, t])
        prev = xx1[0]


def block_inputs(T, H, N, dtype, gen, first_layer=False):
    C = H * N
    state = uni((H, N, N), gen)
    r, w, k, v, a, g = (uni((T, C), gen, -2, 2, dtype) for _ in range(6))
    vf, vg = (None, None) if first_layer else (uni((T, C), gen, -1, 1, dtype),
                                               uni((T, C), gen, -2, 2, dtype))
    p = torch.stack([uni((C,), gen, lo, hi) for lo, hi in BLOCK_PARAM_RANGES])
    return state, r, w, k, v, a, g, vf, vg, p


def block_spec(state, r, w, k, v, a, g, vf, vg, p):
    S = state.detach().to("cpu", torch.float64)
    opt = [None if t is None else d64(t)[0] for t in (vf, vg)]
    y = ref.wkv7_block_math(ref.wkv7_inplace_math, S, *d64(r, w, k, v, a, g), *opt,
                            d64(p)[0].unbind(0), GN_EPS)
    return y, S


@pytest.mark.parametrize("dtype", ACT, ids=str)
@pytest.mark.parametrize("first_layer", [False, True], ids=["later", "first"])
@pytest.mark.parametrize("T,H,N", [(1, 32, 64), (1, 3, 33), (5, 4, 64), (2, 2, 128), (3, 1, 256),
                                   (1, 2, 1)])
def test_wkv7_block_matches_spec(T, H, N, first_layer, dtype, gen):
    args = block_inputs(T, H, N, dtype, gen, first_layer)
    y64, s64 = block_spec(*args)
    state_obj = args[0]
    y = op("wkv7_block")(*args, GN_EPS)
    assert y.shape == (T, H * N) and args[0] is state_obj
    close_act(y, y64, dtype)
    close(state_obj, s64)


def test_wkv7_block_state_in_equals_in_place(gen):
    state, *rest = block_inputs(2, 4, 64, torch.float16, gen)
    before = state.clone()
    in_place = state.clone()
    y0 = op("wkv7_block")(in_place, *rest, GN_EPS)
    fresh = torch.full_like(state, float("nan"))
    y1 = op("wkv7_block")(fresh, *rest, GN_EPS, state)
    assert torch.equal(y0, y1) and torch.equal(fresh, in_place) and torch.equal(state, before)


def test_wkv7_block_sequence_equals_token_by_token(gen):
    state, *rows, p = block_inputs(6, 3, 64, torch.float16, gen)
    s_seq, s_one = state.clone(), state.clone()
    y = op("wkv7_block")(s_seq, *rows, p, GN_EPS)
    for t in range(6):
        y1 = op("wkv7_block")(s_one, *(x[t:t + 1] for x in rows), p, GN_EPS)
        assert torch.equal(y1[0], y[t])
    assert torch.equal(s_seq, s_one)


def test_wkv7_block_and_ln_mix_capture_in_cuda_graph(gen):
    state, *rows, p = block_inputs(1, 4, 64, torch.float16, gen)
    lm = ln_mix_inputs(1, 256, 6, torch.float16, gen)
    eager_state = state.clone()
    eager = (op("wkv7_block")(eager_state, *rows, p, GN_EPS), op("ln_mix")(*lm, False, LN_EPS))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture
        op("wkv7_block")(state.clone(), *rows, p, GN_EPS)
        op("ln_mix")(*lm, False, LN_EPS)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (op("wkv7_block")(state, *rows, p, GN_EPS), op("ln_mix")(*lm, False, LN_EPS))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], eager[0]) and torch.equal(state, eager_state)
    assert all(torch.equal(a, b) for a, b in zip(out[1], eager[1]))


def test_fused_ops_reject_bad_inputs(gen):
    state, r, w, k, v, a, g, vf, vg, p = block_inputs(2, 2, 64, torch.float16, gen)
    before = state.clone()
    blk = op("wkv7_block")
    with pytest.raises(RuntimeError, match="wkv7_block: r must be float32, bfloat16 or float16, "
                                           "got float64"):
        blk(state, r.double(), w, k, v, a, g, vf, vg, p, GN_EPS)
    with pytest.raises(RuntimeError, match=r"wkv7_block: w must be float16 \(r's dtype\), got float32"):
        blk(state, r, w.float(), k, v, a, g, vf, vg, p, GN_EPS)
    with pytest.raises(RuntimeError, match=r"wkv7_block: p must have shape \[8, H\*N\] = \[8, 128\]"):
        blk(state, r, w, k, v, a, g, vf, vg, p[:7], GN_EPS)
    with pytest.raises(RuntimeError, match="wkv7_block: v_first and v_gate must be given together"):
        blk(state, r, w, k, v, a, g, vf, None, p, GN_EPS)
    with pytest.raises(RuntimeError, match="wkv7_block: state must have a head size N .* at most 256"):
        blk(torch.zeros(1, 300, 300, device=DEV), *[torch.zeros(1, 300, device=DEV)] * 6, None,
            None, torch.zeros(8, 300, device=DEV), GN_EPS)
    assert torch.equal(state, before)  # rejected before anything is written
    x, sx, lw, lb, mix = ln_mix_inputs(2, 64, 2, torch.float16, gen)
    with pytest.raises(RuntimeError, match=r"ln_mix: sx must be float16 \(x's dtype\), got float32"):
        op("ln_mix")(x, sx.float(), lw, lb, mix, True, LN_EPS)
    with pytest.raises(RuntimeError, match=r"ln_mix: mix must have shape \[n, C\] = \[2, 64\], got \[2, 63\]"):
        op("ln_mix")(x, sx, lw, lb, mix[:, :63], True, LN_EPS)
    # The CPU kernels have no fp16 path and say so.
    with pytest.raises(RuntimeError, match="ln_mix: x must be float32 or bfloat16, got float16"):
        ops.resolve("ln_mix", "cpu", "compiled")(x.cpu(), sx.cpu(), lw.cpu(), lb.cpu(), mix.cpu(),
                                                True, LN_EPS)


def test_ops_run_on_the_current_stream(gen):
    state, *rest = wkv7_inputs(9, 2, 64, gen)
    y64, s64 = ref.wkv7_math(*d64(state, *rest))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = op("wkv7_forward")(state, *rest)
    torch.cuda.current_stream().wait_stream(side)
    close(y, y64)
    close(state, s64)


def test_ops_capture_in_cuda_graph(gen):
    state, *rest = wkv7_inputs(1, 4, 64, gen)
    x, q, *side = mm8_inputs(1, 256, 128, torch.float16, gen, seq=False)
    eager_state = state.clone()
    eager = (op("wkv7_forward")(eager_state, *rest), op("mm8_one")(x, q, *side))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture
        op("wkv7_forward")(state.clone(), *rest)
        op("mm8_one")(x, q, *side)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (op("wkv7_forward")(state, *rest), op("mm8_one")(x, q, *side))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], eager[0]) and torch.equal(state, eager_state)
    assert torch.equal(out[1], eager[1])


def test_opcheck_cuda(gen):
    cases = {
        "wkv4_forward": wkv4_inputs(3, 32, gen, False),
        "wkv5_forward": wkv56_inputs(5, 3, 2, 32, gen),
        "wkv6_forward": wkv56_inputs(6, 3, 2, 32, gen),
        "wkv7_forward": wkv7_inputs(3, 2, 32, gen),
        "mm8_one": mm8_inputs(1, 64, 48, torch.float16, gen, seq=False),
        "mm8_seq": mm8_inputs(3, 64, 48, torch.bfloat16, gen),
        "gemm_fp16": (uni((3, 16), gen, dtype=torch.float16),
                      uni((16, 8), gen, dtype=torch.float16), True),
        "ln_mix": (*ln_mix_inputs(3, 64, 2, torch.float16, gen), False, LN_EPS),
        "wkv7_block": (*block_inputs(3, 2, 32, torch.float16, gen), GN_EPS),
        "linear_one": (uni((16,), gen, dtype=torch.bfloat16),
                       uni((8, 16), gen, dtype=torch.bfloat16).t()),
    }
    for name, args in cases.items():
        op(name)
        torch.library.opcheck(getattr(torch.ops.rwkv, name).default, tuple(args))


# ------------------------------------------------------------------------------- rejections

def test_rejects_bad_inputs_with_contract_messages(gen):
    state, *rest = wkv7_inputs(2, 2, 64, gen)
    wkv7 = op("wkv7_forward")
    with pytest.raises(RuntimeError, match="wkv7_forward: state must be float32, got float16"):
        wkv7(state.half(), *rest)
    with pytest.raises(RuntimeError, match="wkv7_forward: r must be on the same device as state"):
        wkv7(state, rest[0].cpu(), *rest[1:])
    with pytest.raises(RuntimeError, match="wkv7_forward: state must be contiguous"):
        wkv7(state.transpose(1, 2), *rest)
    with pytest.raises(RuntimeError, match=r"wkv7_forward: k must have shape \[T, H\*N\]"):
        wkv7(state, rest[0], rest[1], rest[2][:1], *rest[3:])
    big = torch.zeros(1, 300, 300, device=DEV)
    seq = [torch.zeros(1, 300, device=DEV)] * 6
    with pytest.raises(RuntimeError, match="wkv7_forward: state must have a head size N .* at "
                                           "most 256 on CUDA, got 300"):
        wkv7(big, *seq)
    s5, *r5 = wkv56_inputs(5, 2, 2, 32, gen)
    with pytest.raises(RuntimeError, match=r"wkv5_forward: w must have shape \[H, N\]"):
        op("wkv5_forward")(s5, *r5[:3], r5[0], r5[4])
    w, u, k, v, aa, bb, pp = wkv4_inputs(2, 8, gen, False)
    with pytest.raises(RuntimeError, match="wkv4_forward: aa must be contiguous"):
        op("wkv4_forward")(w, u, k, v, torch.zeros(16, device=DEV)[::2], bb, pp)
    x, q, mx, rx, my, ry = mm8_inputs(1, 64, 48, torch.float16, gen, seq=False)
    with pytest.raises(RuntimeError, match="mm8_one: x must be float32, bfloat16 or float16, "
                                           "got int32"):
        op("mm8_one")(x.int(), q, mx, rx, my, ry)
    with pytest.raises(RuntimeError, match=r"mm8_one: my must have shape \[N, 1\]"):
        op("mm8_one")(x, q, mx, rx, my.view(-1), ry)
    with pytest.raises(RuntimeError, match="mm8_seq: rx must be float16 \\(x's dtype\\)"):
        op("mm8_seq")(x[None], q, mx, rx.float(), my, ry)
    with pytest.raises(RuntimeError, match="mm8_seq: w must be uint8, got int8"):
        op("mm8_seq")(x[None], q.to(torch.int8), mx, rx, my, ry)
    with pytest.raises(RuntimeError, match="gemm_fp16: a must be float16, got float32"):
        op("gemm_fp16")(torch.zeros(2, 4, device=DEV), torch.zeros(4, 3, device=DEV).half(), True)
    with pytest.raises(RuntimeError, match=r"gemm_fp16: b must have shape \[K, M\] = \[4, 3\]"):
        op("gemm_fp16")(torch.zeros(2, 4, device=DEV).half(),
                        torch.zeros(5, 3, device=DEV).half(), True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(gen):
    state, *rest = wkv7_inputs(3, 2, 64, gen)
    y64, s64 = ref.wkv7_math(*d64(state, *rest))
    moved = [t.to("cuda:1") for t in (state, *rest)]
    y = op("wkv7_forward")(*moved)
    assert y.device == torch.device("cuda:1")
    close(y, y64)
    close(moved[0], s64)
