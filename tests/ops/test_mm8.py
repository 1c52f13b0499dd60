"""mm8_one and mm8_seq: compiled kernels vs the float64 spec (fp32) or vs upstream's
low-precision torch path (bf16/fp16), every weight layout and CPU ISA, opcheck, input errors."""

import pytest
import torch
from ops_testlib import (IMPLS, assert_close_f32, assert_low_precision_ok, compiled_or_skip, f64,
                         implementation, uniform)

from rwkv import ops
from rwkv.ops import _testing, reference as ref

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def make_weight(N, M, rng, layout="column_major", device="cpu"):
    if layout == "column_major":  # how the model stores int8 weights: w.t() contiguous
        return torch.randint(0, 256, (M, N), generator=rng, dtype=torch.uint8).t().to(device)
    if layout == "row_major":
        return torch.randint(0, 256, (N, M), generator=rng, dtype=torch.uint8).to(device)
    big = torch.randint(0, 256, (N + 3, 2 * M), generator=rng, dtype=torch.uint8)
    return big[1:N + 1, ::2].to(device)  # neither layout, with a storage offset


def make_inputs(T, N, M, rng, dtype=torch.float32, layout="column_major", device="cpu"):
    """T = 0 means mm8_one (x: [N])."""
    x = uniform((T, N) if T else (N,), rng, -1, 1, device, dtype)
    w = make_weight(N, M, rng, layout, device)
    mx = uniform((M,), rng, -0.1, 0.1, device, dtype)
    rx = uniform((M,), rng, 0.01, 0.1, device, dtype) / 16
    my = uniform((N, 1), rng, -0.1, 0.1, device, dtype)
    ry = uniform((N, 1), rng, 0.01, 0.1, device, dtype) / 16
    return x, w, mx, rx, my, ry


def check(fn, T, N, M, rng, dtype=torch.float32, layout="column_major", device="cpu"):
    args = make_inputs(T, N, M, rng, dtype, layout, device)
    y = fn(*args)
    assert y.dtype == dtype and y.shape == ((T, M) if T else (M,))
    x, w, *side = args
    y64 = ref.mm8_math(*f64(x), w, *f64(*side))
    if dtype == torch.float32:
        assert_close_f32(y, y64, rtol=1e-5, atol=1e-5)
    else:
        assert_low_precision_ok(y.cpu(), y64.cpu(), ref.mm8_math(*args).cpu())


def op_name(T):
    return "mm8_seq" if T else "mm8_one"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,N,M", [(0, 1, 1), (0, 77, 45), (0, 130, 64), (1, 33, 17),
                                   (5, 77, 45), (3, 256, 20)])
def test_mm8_matches_reference(device, impl, dtype, T, N, M, rng):
    check(implementation(op_name(T), impl, device), T, N, M, rng, dtype, device=device)


@pytest.mark.parametrize("layout", ["row_major", "strided"])
@pytest.mark.parametrize("T", [0, 4])
def test_mm8_any_weight_strides(layout, T, rng):
    check(compiled_or_skip(op_name(T)), T, 50, 23, rng, layout=layout)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,N,M", [(0, 77, 45), (0, 1000, 67), (3, 200, 36), (2, 15, 5),
                                   (40, 100, 37)])
def test_mm8_isa(cpu_isa, dtype, T, N, M, rng):
    fn = compiled_or_skip(op_name(T))
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, N, M, rng, dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,N,M", [(0, 0, 5), (0, 6, 0), (3, 0, 4), (0, 0, 0), (40, 0, 3), (40, 5, 0)])
def test_mm8_empty_sizes(impl, T, N, M, rng):
    fn = implementation(op_name(T), impl, "cpu")
    x, w, mx, rx, my, ry = make_inputs(T, N, M, rng)
    y = fn(x, w, mx, rx, my, ry)
    assert y.shape == ((T, M) if T else (M,))
    # With N = 0 every sum is empty: y = rx*0 + 0 + mx*0.
    assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("T", [2, 3, 4, 7, 31])
def test_mm8_seq_rows_equal_mm8_one_bitwise(cpu_isa, T, rng):
    # Below the tiled threshold every row of mm8_seq is summed in mm8_one's order.
    one, seq = compiled_or_skip("mm8_one"), compiled_or_skip("mm8_seq")
    x, w, *side = make_inputs(T, 1000, 37, rng)
    with _testing.force_cpu_isa(cpu_isa):
        y = seq(x, w, *side)
        for t in range(T):
            assert torch.equal(y[t], one(x[t], w, *side)), t


def test_mm8_threaded_large(rng):
    check(compiled_or_skip("mm8_one"), 0, 2048, 777, rng)
    check(compiled_or_skip("mm8_seq"), 9, 512, 301, rng)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,N,M", [(16, 40, 19), (32, 40, 19), (40, 2100, 70), (33, 5, 300),
                                   (64, 3000, 1500)])
def test_mm8_seq_tiled_path(cpu_isa, dtype, T, N, M, rng):
    # From 32 rows on, mm8_seq converts column tiles of w and lets a GEMM do the products
    # (csrc/cpu/mm8.cpp): fp32 tiles, or for bf16 x with the avx512bf16 ISA active bf16 tiles from
    # 16 rows on. Tiles hold 2^21 elements, so (64, 3000, 1500) spans three (699 + 699 + 102 columns).
    fn = compiled_or_skip("mm8_seq")
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, N, M, rng, dtype)


def test_mm8_seq_bf16_x_uses_fp32_tiles_without_native_bf16(cpu_isa, rng):
    # Without the avx512bf16 ISA, oneDNN's bf16 GEMM is slower than its fp32 one, so bf16 x goes
    # through the fp32 tiles: the fp32 x's result, rounded. With it, bf16 tiles (other bits).
    fn = compiled_or_skip("mm8_seq")
    x, w, *side = make_inputs(40, 300, 50, rng, torch.bfloat16)
    with _testing.force_cpu_isa(cpu_isa):
        y = fn(x, w, *side)
        via_fp32 = fn(x.float(), w, *(t.float() for t in side)).bfloat16()
    assert torch.equal(y, via_fp32) == (cpu_isa != "avx512bf16")


def test_mm8_wrapper_picks_one_or_seq(rng):
    args1 = make_inputs(0, 20, 8, rng)
    args2 = make_inputs(3, 20, 8, rng)
    assert ops.mm8(*args1, mode="reference").shape == (8,)
    assert ops.mm8(*args2, mode="reference").shape == (3, 8)


@pytest.mark.parametrize("T", [0, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mm8_opcheck(T, dtype, rng):
    compiled_or_skip(op_name(T))
    op = getattr(torch.ops.rwkv, op_name(T)).default
    torch.library.opcheck(op, make_inputs(T, 24, 10, rng, dtype))


REJECT_CASES = {
    "x_dtype": "x must be float32, bfloat16 or float16, got int64",
    "x_dim": r"x must have shape {x}, got \[2, 3, 8\]",
    "w_dtype": "w must be uint8, got int8",
    "w_shape": r"w must have shape \[N, M\] = \[8, 5\], got \[9, 5\]",
    "w_dim": r"w must have shape \[N, M\], got \[40\]",
    "mx_dtype": r"mx must be float16 \(x's dtype\), got float32",
    "my_shape": r"my must have shape \[N, 1\] = \[8, 1\], got \[8\]",
    "rx_shape": r"rx must have shape \[M\] = \[5\], got \[6\]",
    "device": r"ry must be on the same device as x \(cpu\), got meta",
}


ONE_ROW = r"\[N\] or \[1, N\] \(one token\)"  # one-token x (tests/ops/test_one_row.py)


@pytest.mark.parametrize("T", [0, 2])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_mm8_rejects(T, impl, case, rng):
    op = op_name(T)
    fn = implementation(op, impl, "cpu")
    x, w, mx, rx, my, ry = make_inputs(T, 8, 5, rng, torch.float16)
    if case == "x_dtype":
        x = x.long()
    elif case == "x_dim":
        x = torch.zeros(2, 3, 8, dtype=torch.float16)
    elif case == "w_dtype":
        w = w.to(torch.int8)
    elif case == "w_shape":
        w = torch.zeros(9, 5, dtype=torch.uint8)
    elif case == "w_dim":
        w = w.reshape(-1)
    elif case == "mx_dtype":
        mx = mx.float()
    elif case == "my_shape":
        my = my.reshape(-1)
    elif case == "rx_shape":
        rx = torch.zeros(6, dtype=torch.float16)
    elif case == "device":
        ry = ry.to("meta")
    match = REJECT_CASES[case].format(x=r"\[T, N\]" if T else ONE_ROW)
    with pytest.raises(RuntimeError, match=f"{op}: {match}"):
        fn(x, w, mx, rx, my, ry)


# ---------------------------------------------------------------------------------------------
# mm8_one_i16: xs = x*ry rounded to int16 with one scale, exact integer dot products.
# ---------------------------------------------------------------------------------------------

def i16_error_bound(x, w, ry, rx):
    """|y - exact| from rounding xs to int16: each xs[n] moves by at most 0.5 (+ the fp32 rounding
    of xs*inv, < 0.002) of a step scale = max|xs|/XQ_MAX, so y[m] moves by at most
    rx[m] * 0.502 * scale * sum_n w[n, m]."""
    xs = x.double() * ry.double()[:, 0]
    scale = xs.abs().max() / ref.XQ_MAX
    return rx.double().abs() * 0.502 * scale * w.double().sum(0)


def check_i16(fn, N, M, rng, dtype=torch.float32, x=None):
    args = list(make_inputs(0, N, M, rng, dtype))
    if x is not None:
        args[0] = x.to(dtype)
    y = fn(*args)
    assert y.dtype == dtype and y.shape == (M,)
    x, w, mx, rx, my, ry = args
    y64 = ref.mm8_math(*f64(x), w, *f64(mx, rx, my, ry))
    if dtype != torch.float32:
        assert_low_precision_ok(y, y64, ref.mm8_math(*args))
        return
    # Against the exact product: the derived int16 bound plus fp32 rounding (assert_close_f32's).
    slack = 1e-5 * max(1.0, float(y64.abs().max()))
    excess = (y.double() - y64).abs() - i16_error_bound(x, w, ry, rx)
    assert float(excess.max()) <= slack, float(excess.max())
    # Against the reference op, which quantizes identically: only fp32 summation order differs.
    assert_close_f32(y, ref.mm8_one_i16(*args).double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N,M", [(1, 1), (77, 45), (64, 3), (130, 64), (1000, 67), (2048, 33),
                                 (4109, 9)])
def test_mm8_one_i16_isa(cpu_isa, dtype, N, M, rng):
    fn = compiled_or_skip("mm8_one_i16")
    with _testing.force_cpu_isa(cpu_isa):
        check_i16(fn, N, M, rng, dtype)


@pytest.mark.parametrize("N,M", [(77, 45), (130, 64), (2048, 33), (4109, 9), (3000, 70)])
def test_mm8_one_i16_read_orders_agree_bit_for_bit(cpu_isa, N, M, rng):
    """Both orders (one column at a time / 4 streams with prefetch) pass the accuracy checks,
    and since the dots are exact integers they give identical bits."""
    fn = compiled_or_skip("mm8_one_i16")
    args = make_inputs(0, N, M, rng, torch.float32)
    out = {}
    with _testing.force_cpu_isa(cpu_isa):
        for order in _testing.READ_ORDERS:
            with _testing.force_cpu_read_order(order):
                assert ops.cpu_read_order() == order
                check_i16(fn, N, M, rng)
                out[order] = fn(*args)
    assert torch.equal(out["sequential"], out["streams"])


@pytest.mark.parametrize("N,M", [(1, 3), (63, 5), (64, 17), (65, 4), (127, 9), (128, 16),
                                 (129, 33), (250, 7), (448, 5), (2048, 40), (4109, 9)])
def test_mm8_one_i16_vnni_equals_avx512_bit_for_bit(N, M, rng):
    """avx512vnni computes the same exact integer dots as avx512 another way (bytes of the int16
    activation, vec_avx512vnni.h), with the same epilogue: identical bits, in both read orders,
    for lengths around its 64-value blocks and 128-value steps."""
    fn = compiled_or_skip("mm8_one_i16")
    if "avx512vnni" not in _testing.supported_cpu_isas():
        pytest.skip("this CPU has no AVX-512 VNNI")
    args = make_inputs(0, N, M, rng, torch.float32)
    args[0].mul_(uniform((N,), rng, 0, 4))  # activation bytes of every size, both signs
    for order in _testing.READ_ORDERS:
        with _testing.force_cpu_read_order(order):
            out = {}
            for isa in ("avx512", "avx512vnni"):
                with _testing.force_cpu_isa(isa):
                    out[isa] = fn(*args)
            assert torch.equal(out["avx512"], out["avx512vnni"]), order


def test_mm8_one_i16_vnni_split_edges_bit_for_bit(rng):
    """The VNNI kernel splits each int16 activation into two signed bytes, 256*h + l (pack() in
    vec_avx512vnni.h): activations at the ends of the range (xq = +-XQ_MAX) and at every byte
    boundary give the same bits as avx512's int16 products."""
    fn = compiled_or_skip("mm8_one_i16")
    if "avx512vnni" not in _testing.supported_cpu_isas():
        pytest.skip("this CPU has no AVX-512 VNNI")
    top = int(ref.XQ_MAX)
    edges = [top, -top, 0, 1, -1, 127, 128, -128, -129, 255, 256, -256, -257, 32512, -32512,
             top - 1, -(top - 1), 32383, -32384]
    levels = torch.tensor(edges + list(range(-top, top + 1, 97)), dtype=torch.float64)
    N, M = levels.numel(), 37
    x = (levels / ref.XQ_MAX).float()  # max|xs| = 1, so xq = the levels exactly
    w = torch.randint(0, 256, (M, N), generator=rng, dtype=torch.uint8).t()
    mx, my, rx, ry = torch.zeros(M), torch.zeros(N, 1), torch.ones(M), torch.ones(N, 1)
    out = {}
    for isa in ("avx512", "avx512vnni"):
        with _testing.force_cpu_isa(isa):
            out[isa] = fn(x, w, mx, rx, my, ry)
    assert torch.equal(out["avx512"], out["avx512vnni"])


def test_mm8_one_i16_scale_is_xq_max(cpu_isa, rng):
    """xq = round(xs * XQ_MAX / max|xs|): activations that are integers over XQ_MAX round to
    themselves, so the result is the exact product up to fp32 rounding (~1e-7). Another
    constant would round them (errors ~1e-5 of y here)."""
    fn = compiled_or_skip("mm8_one_i16")
    top = int(ref.XQ_MAX)
    N, M = 4096, 16
    levels = torch.randint(-top, top + 1, (N,), generator=rng).double()
    levels[0] = top
    x = (levels / ref.XQ_MAX).float()
    w = torch.randint(0, 256, (M, N), generator=rng, dtype=torch.uint8).t()
    mx, my, rx, ry = torch.zeros(M), torch.zeros(N, 1), torch.ones(M), torch.ones(N, 1)
    exact = ref.mm8_math(x.double(), w, mx.double(), rx.double(), my.double(), ry.double())
    with _testing.force_cpu_isa(cpu_isa):
        y = fn(x, w, mx, rx, my, ry).double()
    assert float((y - exact).abs().max()) <= 1e-6 * float(exact.abs().max())


@pytest.mark.parametrize("impl", IMPLS)
def test_mm8_one_i16_bound_is_tight_enough_to_matter(impl, rng):
    # The int16 error is real (so the bound is what is being tested) but small next to int8's own
    # noise: weights rounded to steps of rx*ry move y[m] with std rx[m]*|xs|/sqrt(12). Expected
    # ratio ~ (max|xs|/XQ_MAX) * rms(w) / rms(xs) ~ 1%; 5% is the figure the model tests use.
    fn = implementation("mm8_one_i16", impl, "cpu")
    x, w, mx, rx, my, ry = make_inputs(0, 3000, 50, rng)
    y, y64 = fn(x, w, mx, rx, my, ry).double(), ref.mm8_math(*f64(x), w, *f64(mx, rx, my, ry))
    err = (y - y64).abs()
    assert float(err.max()) > 0
    assert bool((err <= i16_error_bound(x, w, ry, rx) + 1e-6).all())
    xs = x.double() * ry.double()[:, 0]
    int8_noise = rx.double() * xs.norm() / 12 ** 0.5
    assert float((err / int8_noise).max()) < 0.05


@pytest.mark.parametrize("N", [20000, 140000])
@pytest.mark.parametrize("sign", [1, -1])
def test_mm8_one_i16_no_int32_overflow(cpu_isa, sign, N):
    # Every product at its largest (|xq| = XQ_MAX, w = 255): over 20000 rows the integer sums pass
    # 2^31 many times over, so partial sums must be widened in time (kernels/mm8.h, flush). The
    # avx512vnni split sums (h and l, each product at most 255 * 128) pass 2^31 only past 65536
    # rows: 140000 rows need its flushes too.
    fn = compiled_or_skip("mm8_one_i16")
    M = 5
    x = torch.full((N,), float(sign))
    w = torch.full((M, N), 255, dtype=torch.uint8).t()
    mx, my = torch.zeros(M), torch.zeros(N, 1)
    rx, ry = torch.ones(M), torch.ones(N, 1)
    with _testing.force_cpu_isa(cpu_isa):
        y = fn(x, w, mx, rx, my, ry)
    expected = sign * (255.5 * N)  # (w + 0.5) summed; xq = ±XQ_MAX exactly, scale = 1/XQ_MAX
    torch.testing.assert_close(y, torch.full((M,), expected), rtol=1e-6, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["zeros", "nan", "inf", "tiny"])
def test_mm8_one_i16_falls_back_to_fp32(impl, case, rng):
    # Where int16 cannot represent xs, the result is mm8_one's (same NaN/inf propagation).
    fn = implementation("mm8_one_i16", impl, "cpu")
    one = implementation("mm8_one", impl, "cpu")
    x, w, mx, rx, my, ry = make_inputs(0, 100, 20, rng)
    if case == "zeros":
        x = torch.zeros_like(x)
    elif case == "nan":
        x[7] = float("nan")
    elif case == "inf":
        x[3] = float("inf")
    else:  # max|xs| so small that XQ_MAX/max|xs| overflows fp32
        x = torch.full_like(x, 1e-40)
    torch.testing.assert_close(fn(x, w, mx, rx, my, ry), one(x, w, mx, rx, my, ry), rtol=0, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("N,M", [(0, 5), (6, 0), (0, 0)])
def test_mm8_one_i16_empty_sizes(impl, N, M, rng):
    fn = implementation("mm8_one_i16", impl, "cpu")
    y = fn(*make_inputs(0, N, M, rng))
    assert y.shape == (M,) and torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("layout", ["row_major", "strided"])
def test_mm8_one_i16_any_weight_strides(layout, rng):
    args = list(make_inputs(0, 50, 23, rng, layout=layout))
    fn = compiled_or_skip("mm8_one_i16")
    assert_close_f32(fn(*args), ref.mm8_one_i16(*args).double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mm8_one_i16_opcheck(dtype, rng):
    compiled_or_skip("mm8_one_i16")
    torch.library.opcheck(torch.ops.rwkv.mm8_one_i16.default, make_inputs(0, 70, 10, rng, dtype))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_mm8_one_i16_rejects(impl, case, rng):
    fn = implementation("mm8_one_i16", impl, "cpu")
    x, w, mx, rx, my, ry = make_inputs(0, 8, 5, rng, torch.float16)
    bad = {"x_dtype": lambda: (x.long(), w, mx, rx, my, ry),
           "x_dim": lambda: (torch.zeros(2, 3, 8, dtype=torch.float16), w, mx, rx, my, ry),
           "w_dtype": lambda: (x, w.to(torch.int8), mx, rx, my, ry),
           "w_shape": lambda: (x, torch.zeros(9, 5, dtype=torch.uint8), mx, rx, my, ry),
           "w_dim": lambda: (x, w.reshape(-1), mx, rx, my, ry),
           "mx_dtype": lambda: (x, w, mx.bfloat16(), rx, my, ry),  # float32 is allowed here
           "my_shape": lambda: (x, w, mx, rx, my.reshape(-1), ry),
           "rx_shape": lambda: (x, w, mx, torch.zeros(6, dtype=torch.float16), my, ry),
           "device": lambda: (x, w, mx, rx, my, ry.to("meta"))}[case]()
    match = REJECT_CASES[case].format(x=ONE_ROW)
    if case == "mx_dtype":
        match = r"mx must be float16 \(x's dtype\) or float32, got bfloat16"
    with pytest.raises(RuntimeError, match=f"mm8_one_i16: {match}"):
        fn(*bad)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mm8_one_i16_fp32_side_tensors_give_the_same_bits(impl, dtype, rng):
    """mm8_one_i16 computes in fp32, so float32 copies of the side tensors (which the model keeps
    for bf16 layers) give exactly the result of side tensors in x's dtype."""
    fn = implementation("mm8_one_i16", impl, "cpu")
    x, w, *side = make_inputs(0, 300, 70, rng, dtype)
    side32 = [t.float() for t in side]
    for act in (0, 1):
        assert torch.equal(fn(x, w, *side32, act), fn(x, w, *side, act))
    if impl == "compiled":
        torch.library.opcheck(torch.ops.rwkv.mm8_one_i16.default, (x, w, *side32, 1))


@pytest.mark.parametrize("op", ["mm8_one", "mm8_one_i16", "mm8_seq"])
@pytest.mark.parametrize("M", [45, 33000])  # results below / above float_io.h's loop threshold
def test_bf16_results_are_the_fp32_results_rounded_as_torch_does(op, M, rng):
    """The CPU int8 ops compute bf16 inputs in fp32 (x widened exactly) and round the result once,
    with a plain loop for short results and ATen's conversion for long ones (cpu/float_io.h): both
    must round exactly as torch's .to(torch.bfloat16) does, infinities included."""
    fn = compiled_or_skip(op)
    N = 16
    x, w, mx, rx, my, ry = make_inputs(2 if op == "mm8_seq" else 0, N, M, rng, torch.float32)
    mx, rx, my, ry = (t * 1e3 for t in (mx, rx, my, ry))  # results of every magnitude
    rx[:3] = torch.tensor([3e38, -3e38, 1e-30])  # overflow to +-inf in bf16, and a tiny one
    xb = x.bfloat16()
    side = (mx.bfloat16().float(), rx.bfloat16().float(), my.bfloat16().float(), ry.bfloat16().float())
    if op == "mm8_one_i16":
        got, want = fn(xb, w, *side), fn(xb.float(), w, *side)
    else:  # mm8_one / mm8_seq take side tensors in x's dtype: bf16 values, exact in fp32
        got = fn(xb, w, *(t.bfloat16() for t in side))
        want = fn(xb.float(), w, *side)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want.to(torch.bfloat16))
