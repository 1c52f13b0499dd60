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
                                   (64, 3000, 600)])
def test_mm8_seq_tiled_path(dtype, T, N, M, rng):
    # From 32 rows on (bf16 x: 16), mm8_seq converts column tiles of w (fp32, or bf16 for bf16 x)
    # and uses at::mm (csrc/cpu/mm8.cpp); (64, 3000, 600) spans several tiles of either kind.
    check(compiled_or_skip("mm8_seq"), T, N, M, rng, dtype)


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
    match = REJECT_CASES[case].format(x=r"\[T, N\]" if T else r"\[N\]")
    with pytest.raises(RuntimeError, match=f"{op}: {match}"):
        fn(x, w, mx, rx, my, ry)
