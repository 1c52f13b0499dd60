"""linear_one_slabs (one one-token product whose weight is stored as row slabs, rwkv/slabs.py): with
fp32 x it equals the separate per-slab ops (mm8_one_i16 / linear_one on the slab's rows) summed in
fp32 in slab order, bit for bit; compiled against the reference op and against the float64 math of
the whole matrix; every CPU ISA, read order and thread split; the int8 fp32 fallback of one slab;
empty sizes; opcheck; input errors in the op's words."""

import pytest
import torch
import test_mm8
from ops_testlib import IMPLS, compiled_or_skip, implementation, uniform

from rwkv import ops, slabs
from rwkv.ops import _testing, reference as ref

OP = "linear_one_slabs"
f32, bf16 = torch.float32, torch.bfloat16


def make_inputs(kind, dtype, N, S, M, rng, two_d=False):
    """(x, w [S, N/S, M], side, the whole matrix [N, M]) for kind "int8" or "dense"."""
    if kind == "int8":
        x, w, *side = test_mm8.make_inputs(0, N, M, rng, dtype)
    else:
        x = uniform((N,), rng, -1, 1, "cpu", dtype)
        w = uniform((M, N), rng, -1, 1, "cpu", dtype).t()  # column-major, as the model keeps it
        side = []
    if two_d:
        x = x.unsqueeze(0)
    return x, slabs.split_rows(w, S), list(side), w


def separate_sum(x, w3, side, mode="compiled"):
    """The old way: each slab's product as its own op (fp32 x), the fp32 results summed in order."""
    S, K, _ = w3.shape
    y = None
    for s in range(S):
        rows = slice(s * K, (s + 1) * K)
        if side:
            mx, rx, my, ry = side
            part = ops.mm8_one_i16(x[..., rows], w3[s], mx, rx, my[rows], ry[rows], mode=mode)
        else:
            part = ops.linear_one(x[..., rows], w3[s], mode=mode)
        y = part if y is None else y + part
    return y


def whole_f64(x, w, side):
    """x @ the whole (dequantized) matrix in float64."""
    if side:
        return ref.mm8_math(*(t.double() for t in [x]), w, *(t.double() for t in side))
    return x.double() @ w.double()


CASES = [("int8", 8192, 2, 300), ("int8", 300, 3, 17), ("int8", 6, 3, 1), ("int8", 2100, 5, 70),
         ("dense", 8192, 4, 67), ("dense", 300, 3, 17), ("dense", 77, 1, 45), ("dense", 1000, 8, 33)]


@pytest.mark.parametrize("two_d", [False, True], ids=["x1d", "x2d"])
@pytest.mark.parametrize("kind, N, S, M", CASES)
def test_fp32_equals_separate_slab_products_summed(kind, N, S, M, two_d, rng):
    fn = compiled_or_skip(OP)
    x, w3, side, _ = make_inputs(kind, f32, N, S, M, rng, two_d)
    y = fn(x, w3, side, 0)
    assert y.shape == x.shape[:-1] + (M,) and y.dtype == f32
    assert torch.equal(y, separate_sum(x, w3, side))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("act", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [f32, bf16], ids=str)
@pytest.mark.parametrize("kind, N, S, M", CASES)
def test_matches_reference_and_whole_matrix(impl, kind, N, S, M, dtype, act, rng):
    fn = implementation(OP, impl, "cpu")
    x, w3, side, w = make_inputs(kind, dtype, N, S, M, rng)
    y = fn(x, w3, side, act)
    assert y.dtype == dtype and y.shape == (M,)
    want = ops.resolve(OP, "cpu", "reference")(x, w3, side, act)
    # The slab sum and the activation in fp32, rounded once: compiled and reference differ only
    # in the fp32 dot products' summation order (bf16: then at most one rounding step apart).
    scale = float(want.float().abs().max()) + 1e-6
    tol = 2 ** -7 * scale if dtype == bf16 else 1e-5 * scale
    assert float((y.float() - want.float()).abs().max()) <= tol
    # And the product is that of the whole matrix (int8: within the int16 rounding of x).
    y64 = ref.activate(whole_f64(x.float(), w, [t.float() for t in side]), act)
    scale64 = float(y64.abs().max()) + 1e-6
    tol64 = (2 ** -7 if dtype == bf16 else 2e-4 if kind == "int8" else 2e-5) * scale64
    assert float((y.double() - y64).abs().max()) <= tol64


@pytest.mark.parametrize("kind, N, S, M", [("int8", 2100, 5, 70), ("dense", 1000, 8, 33),
                                           ("int8", 130, 2, 9), ("dense", 15, 3, 3)])
def test_isa_and_read_order(cpu_isa, kind, N, S, M, rng):
    fn = compiled_or_skip(OP)
    x, w3, side, _ = make_inputs(kind, f32, N, S, M, rng)
    out = {}
    with _testing.force_cpu_isa(cpu_isa):
        for order in _testing.READ_ORDERS:
            with _testing.force_cpu_read_order(order):
                out[order] = fn(x, w3, side, 2)
                want = separate_sum(x, w3, side)
                assert torch.equal(out[order], ref.activate(want, 2))
    assert torch.equal(out["sequential"], out["streams"])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_split(threads, rng):
    # Each slab's columns are computed whole by one thread: any split gives the same bits.
    fn = compiled_or_skip(OP)
    x, w3, side, _ = make_inputs("int8", f32, 4096, 4, 1030, rng)
    want = separate_sum(x, w3, side)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.equal(fn(x, w3, side, 0), want)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("impl", IMPLS)
def test_int8_slab_with_zero_x_takes_the_fp32_path(impl, rng):
    # A slab whose rows of x*ry are all zero cannot be rounded to int16: that slab takes
    # mm8_one_i16's fp32 math, the others the integer path, as separate calls would.
    fn = implementation(OP, impl, "cpu")
    x, w3, side, _ = make_inputs("int8", f32, 300, 3, 17, rng)
    x[100:200] = 0
    assert torch.equal(fn(x, w3, side, 0), separate_sum(x, w3, side, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind, N, S, M", [("int8", 0, 2, 5), ("dense", 0, 3, 4), ("int8", 6, 2, 0),
                                           ("dense", 8, 4, 0)])
def test_empty_sizes(impl, kind, N, S, M, rng):
    fn = implementation(OP, impl, "cpu")
    x, w3, side, w = make_inputs(kind, f32, N, S, M, rng)
    y = fn(x, w3, side, 0)
    assert y.shape == (M,)
    assert torch.equal(y, separate_sum(x, w3, side, impl))


@pytest.mark.parametrize("dtype", [f32, bf16], ids=str)
@pytest.mark.parametrize("kind", ["int8", "dense"])
def test_opcheck(kind, dtype, rng):
    compiled_or_skip(OP)
    x, w3, side, _ = make_inputs(kind, dtype, 128, 2, 12, rng)
    torch.library.opcheck(torch.ops.rwkv.linear_one_slabs.default, (x, w3, side, 1))


REJECT_CASES = {
    "side_count_int8": r"linear_one_slabs: side must hold mx, rx, my, ry \(w is uint8\), got 3 tensors",
    "side_count_dense": r"linear_one_slabs: side must be empty \(w is not uint8\), got 4 tensors",
    "x_dtype": r"linear_one_slabs: x must be bfloat16 or float32, got float16",
    "x_rows": r"linear_one_slabs: x must have shape \[N\] or \[1, N\] \(one token\), got \[2, 16\]",
    "w_dim": r"linear_one_slabs: w must have shape \[S, N/S, M\], got \[16, 5\]",
    "w_rows": r"linear_one_slabs: w must have shape \[S, N/S, M\] with S >= 1 slabs of N/S rows "
              r"\(N = 16\), got \[3, 8, 5\]",
    "w_row_major": r"linear_one_slabs: w's slabs must be column-major \(w\[s\]\.t\(\) contiguous\), "
                   r"got strides \[40, 5, 1\]",
    "w_dtype": r"linear_one_slabs: w must be float32 \(x's dtype\), got bfloat16",
    "side_dtype": r"linear_one_slabs: ry must be float32 \(x's dtype\), got bfloat16",
    "side_shape": r"linear_one_slabs: my must have shape \[N, 1\] = \[16, 1\], got \[8, 1\]",
    "act": r"linear_one_slabs: act must be 0 \(none\), 1 \(sigmoid\), 2 \(relu squared\), 3 \(tanh\) or "
           r"4 \(silu\), got 7",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    kind = "dense" if case in ("side_count_dense", "w_dtype") else "int8"
    x, w3, side, _ = make_inputs(kind, f32, 16, 2, 5, rng)
    act = 0
    if case == "side_count_int8":
        side = side[:3]
    elif case == "side_count_dense":
        side = [torch.zeros(5), torch.zeros(5), torch.zeros(16, 1), torch.zeros(16, 1)]
    elif case == "x_dtype":
        x = x.half()
    elif case == "x_rows":
        x = torch.zeros(2, 16)
    elif case == "w_dim":
        w3 = w3.reshape(16, 5)
    elif case == "w_rows":
        w3 = torch.zeros(5, 24, dtype=torch.uint8).t().reshape(3, 8, 5)
    elif case == "w_row_major":
        w3 = w3.contiguous()
    elif case == "w_dtype":
        w3 = w3.bfloat16()
    elif case == "side_dtype":
        side[3] = side[3].bfloat16()
    elif case == "side_shape":
        side[2] = side[2][:8]
    elif case == "act":
        act = 7
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w3, side, act)
