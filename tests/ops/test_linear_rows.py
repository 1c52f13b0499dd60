"""linear_rows (bf16 or fp32 products of several rows, column-major weight or row slabs): compiled
vs the float64 spec (bf16: at most 2x the error of torch's own bf16 `x @ w`; fp32: the fp32
tolerance), every CPU ISA, row counts around the kernel's 4-row groups and column pairs, slabs,
opcheck, input errors."""

import pytest
import torch
from ops_testlib import IMPLS, assert_close_f32, assert_low_precision_ok, compiled_or_skip, implementation, uniform

from rwkv.ops import _testing

OP = "linear_rows"
DTYPES = (torch.bfloat16, torch.float32)


def make_inputs(T, N, M, rng, dtype, slabs=1):
    x = uniform((T, N), rng, -1, 1, "cpu", dtype)
    w = uniform((M, N), rng, -1, 1, "cpu", dtype).t()  # column-major, as the model stores it
    if slabs > 1:  # rwkv/slabs.py's layout: [S, N/S, M], each slab column-major
        K = N // slabs
        w = torch.stack([w[s * K:(s + 1) * K].t().contiguous() for s in range(slabs)]).transpose(1, 2)
    return x, w


def dense(w):
    return w if w.dim() == 2 else w.flatten(0, 1)


def check(fn, T, N, M, rng, dtype, slabs=1):
    x, w = make_inputs(T, N, M, rng, dtype, slabs)
    y = fn(x, w)
    assert y.dtype == torch.float32 and y.shape == (T, M)
    y64 = x.double() @ dense(w).double()
    if dtype == torch.float32:
        assert_close_f32(y, y64)
    else:
        assert_low_precision_ok(y, y64, (x @ dense(w)).float())
    return x, w, y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,N,M", [(1, 1, 1), (2, 16, 4), (3, 12, 41), (4, 64, 33), (5, 77, 45),
                                   (8, 300, 130), (9, 2048, 67), (17, 100, 8), (64, 256, 19), (70, 33, 5)])
def test_linear_rows_matches_reference(impl, T, N, M, dtype, rng):
    check(implementation(OP, impl, "cpu"), T, N, M, rng, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,N,M,S", [(1, 4096, 37, 2), (6, 4096, 16, 2), (13, 600, 9, 3)])
def test_linear_rows_slabs(T, N, M, S, dtype, rng):
    check(compiled_or_skip(OP), T, N, M, rng, dtype, S)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,N,M", [(1, 20, 3), (4, 33, 2), (7, 160, 35), (12, 17, 64)])
def test_linear_rows_isa(cpu_isa, T, N, M, dtype, rng):
    fn = compiled_or_skip(OP)
    with _testing.force_cpu_isa(cpu_isa):
        x, w, y = check(fn, T, N, M, rng, dtype)
        # every row is the one-row product of that row: rows do not affect each other
        for t in (0, T - 1):
            assert torch.equal(fn(x[t:t + 1], w)[0], y[t])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_rows_opcheck(dtype, rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.linear_rows.default, make_inputs(5, 40, 12, rng, dtype))


REJECT_CASES = {
    "x_dtype": "linear_rows: x must be bfloat16 or float32, got float16",
    "w_dtype": r"linear_rows: w must be bfloat16 \(x's dtype\), got float16",
    "x_dim": r"linear_rows: x must have shape \[T, N\], got \[8\]",
    "w_rows": r"linear_rows: w must have 8 rows \(x's N\) in 1 slab\(s\), got shape \[9, 5\]",
    "w_row_major": r"linear_rows: w must be column-major \(w.t\(\) contiguous, or each slab's\), got strides \[5, 1\]",
    "device": r"linear_rows: w must be on the same device as x \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_linear_rows_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    x, w = make_inputs(3, 8, 5, rng, torch.bfloat16)
    if case == "x_dtype":
        x = x.half()
    elif case == "w_dtype":
        w = w.half()
    elif case == "x_dim":
        x = x[0]
    elif case == "w_rows":
        w = torch.zeros(5, 9, dtype=torch.bfloat16).t()
    elif case == "w_row_major":
        w = w.contiguous()
    elif case == "device":
        w = w.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w)
