"""gemm_fp16: fp16 GEMM with fp32 accumulation (a CUDA kernel; the reference elsewhere)."""

import warnings

import pytest
import torch
from ops_testlib import implementation, uniform

from rwkv import ops

OP = "gemm_fp16"


@pytest.mark.parametrize("fp32_out", [True, False])
@pytest.mark.parametrize("T,K,M", [(1, 16, 8), (7, 33, 21)])
def test_gemm_fp16_matches_reference(device, fp32_out, T, K, M, rng):
    impl = "compiled" if device == "cuda" else "reference"
    fn = implementation(OP, impl, device)
    a = uniform((T, K), rng, -1, 1, device, torch.float16)
    b = uniform((K, M), rng, -1, 1, device, torch.float16)
    y = fn(a, b, fp32_out)
    assert y.dtype == (torch.float32 if fp32_out else torch.float16) and y.shape == (T, M)
    want = a.double() @ b.double()
    tol = 1e-5 if fp32_out else 2e-3
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol * K ** 0.5)


def test_gemm_fp16_fp32_out_does_not_overflow():
    # 300 * 300 = 90000 > fp16 max (65504): the fp32 output must keep it (upstream's cuBLAS fix).
    a = torch.full((1, 1), 300.0, dtype=torch.float16)
    assert ops.gemm_fp16(a, a, True).item() == 90000.0
    assert ops.gemm_fp16(a, a, False).isinf().all()


@pytest.mark.cuda
def test_gemm_fp16_opcheck(rng):
    # Only where a kernel exists: on CPU the reference is the implementation by design, and
    # opcheck needs a registered kernel for the inputs' device.
    implementation(OP, "compiled", "cuda")
    a = uniform((3, 8), rng, -1, 1, "cuda", torch.float16)
    b = uniform((8, 5), rng, -1, 1, "cuda", torch.float16)
    torch.library.opcheck(torch.ops.rwkv.gemm_fp16.default, (a, b, True))


def test_gemm_fp16_cpu_uses_reference_silently():
    a = torch.ones(2, 3, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops.resolve(OP, "cpu", "auto") is ops.reference.gemm_fp16
        ops.gemm_fp16(a, a.t().contiguous(), True)
    with pytest.raises(RuntimeError, match="no compiled gemm_fp16 kernel for device type 'cpu'"):
        ops.resolve(OP, "cpu", "compiled")


@pytest.mark.parametrize("case,match", [
    ("a_dtype", "gemm_fp16: a must be float16, got float32"),
    ("b_shape", r"gemm_fp16: b must have shape \[K, M\] = \[3, 4\], got \[2, 4\]"),
    ("a_dim", r"gemm_fp16: a must have shape \[T, K\], got \[3\]"),
])
def test_gemm_fp16_rejects(case, match):
    a, b = torch.ones(2, 3, dtype=torch.float16), torch.ones(3, 4, dtype=torch.float16)
    if case == "a_dtype":
        a = a.float()
    elif case == "b_shape":
        b = b[:2]
    elif case == "a_dim":
        a = a[0]
    with pytest.raises(RuntimeError, match=match):
        ops.gemm_fp16(a, b, True, mode="reference")
