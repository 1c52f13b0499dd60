"""linear_one (bf16 or fp32 matrix-vector, column-major weight): compiled vs the float64 spec
(bf16: the low-precision rule, at most 2x the error of torch's own bf16 `x @ w`; fp32: the fp32
tolerance), every CPU ISA, opcheck, input errors."""

import pytest
import torch
from ops_testlib import IMPLS, assert_close_f32, assert_low_precision_ok, compiled_or_skip, implementation, uniform

from rwkv.ops import _testing

OP = "linear_one"


DTYPES = (torch.bfloat16, torch.float32)


def make_inputs(N, M, rng, device="cpu", dtype=torch.bfloat16):
    x = uniform((N,), rng, -1, 1, device, dtype)
    w = uniform((M, N), rng, -1, 1, device, dtype).t()  # column-major, as the model stores it
    return x, w


def check(fn, N, M, rng, device="cpu", dtype=torch.bfloat16):
    x, w = make_inputs(N, M, rng, device, dtype)
    y = fn(x, w)
    assert y.dtype == dtype and y.shape == (M,)
    y64 = x.double() @ w.double()
    if dtype == torch.float32:
        assert_close_f32(y.cpu(), y64.cpu())
    else:
        assert_low_precision_ok(y.cpu(), y64.cpu(), (x @ w).cpu())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("N,M", [(1, 1), (16, 4), (12, 40), (64, 33), (77, 45), (300, 130), (2048, 67)])
def test_linear_one_matches_reference(device, impl, N, M, dtype, rng):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("float32 linear_one is a CPU kernel (CUDA rejects it: test_linear_one_cuda_rejects_fp32)")
    check(implementation(OP, impl, device), N, M, rng, device, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N,M", [(77, 45), (1000, 9), (15, 3),
                                 # columns past the 2 KiB prefetch distance (kernels/streams.h),
                                 # M leaving three columns after the 4 streams
                                 (2100, 7),
                                 # short columns (at most 1 KiB: kernels/linear.h), a register's
                                 # width of columns at a time, M leaving columns after those:
                                 # rows fewer than a register, whole registers and a tail, at
                                 # fp32's and bf16's limits and one row past fp32's
                                 (3, 16), (12, 40), (16, 35), (24, 48), (64, 33), (96, 20),
                                 (256, 17), (257, 18), (512, 16), (513, 17),
                                 # short columns as 4 streams of whole groups (at least 4 groups),
                                 # groups and columns left after them; row tails
                                 (96, 150), (77, 150), (40, 200), (256, 70)])
def test_linear_one_isa(cpu_isa, N, M, dtype, rng):
    # Both read orders (one column at a time, or 4 streams sharing each x load; M = 45, 9 and 7
    # leave a remainder after the streams; short columns one group after another, or 4 streams
    # of groups): the same per-column summation, so the same bits.
    fn = compiled_or_skip(OP)
    x, w = make_inputs(N, M, rng, dtype=dtype)
    out = {}
    with _testing.force_cpu_isa(cpu_isa):
        for order in _testing.READ_ORDERS:
            with _testing.force_cpu_read_order(order):
                check(fn, N, M, rng, dtype=dtype)
                out[order] = fn(x, w)
    assert torch.equal(out["sequential"], out["streams"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_one_opcheck(dtype, rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.linear_one.default, make_inputs(40, 12, rng, dtype=dtype))


def test_linear_one_cuda_rejects_fp32(rng):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    fn = compiled_or_skip(OP, "cuda")
    x, w = make_inputs(16, 4, rng, "cuda", torch.float32)
    with pytest.raises(RuntimeError, match="linear_one: float32 is implemented on CPU only"):
        fn(x, w)


REJECT_CASES = {
    "x_dtype": "linear_one: x must be bfloat16 or float32, got float16",
    "w_dtype": r"linear_one: w must be bfloat16 \(x's dtype\), got float16",
    "w_dtype_mixed": r"linear_one: w must be float32 \(x's dtype\), got bfloat16",
    "x_dim": r"linear_one: x must have shape \[N\] or \[1, N\] \(one token\), got \[2, 4\]",
    "w_shape": r"linear_one: w must have shape \[N, M\] = \[8, 5\], got \[9, 5\]",
    "w_row_major": r"linear_one: w must be column-major \(w.t\(\) contiguous\), got strides \[5, 1\]",
    "device": r"linear_one: w must be on the same device as x \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_linear_one_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    x, w = make_inputs(8, 5, rng)
    if case == "x_dtype":
        x = x.half()
    elif case == "w_dtype":
        w = w.half()
    elif case == "w_dtype_mixed":
        x = x.float()
    elif case == "x_dim":
        x = x.reshape(2, 4)
    elif case == "w_shape":
        w = torch.zeros(5, 9, dtype=torch.bfloat16).t()
    elif case == "w_row_major":
        w = w.contiguous()
    elif case == "device":
        w = w.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w)
