"""Projection's products of several rows on CPU: up to ROWS_MAX rows our linear_rows (each weight
read once for all rows); more rows, for fp32 weights oneDNN's linear
(rwkv.models.common.onednn_linear) instead of ``x @ W`` (MKL's sgemm), except with
kernels="reference"; the same values up to fp32 rounding, row slabs included. For bf16 weights
on a CPU without native bf16 GEMM, fp32 tiles of the weight (bf16_product_fp32). Tests of the
GEMM paths with few rows turn linear_rows off (``gemm_only``), as more rows would."""

import pytest
import torch

from rwkv import slabs
from rwkv import ops
from rwkv.models.common import BF16_VIA_FP32_MIN_ROWS, ROWS_MAX, Projection, onednn_linear
from rwkv.ops import _testing
from rwkv.strategy import LayerPlacement

FP32 = LayerPlacement(device="cpu", dtype="fp32", quant=None, stream=False)
BF16 = LayerPlacement(device="cpu", dtype="bf16", quant=None, stream=False)

needs_onednn = pytest.mark.skipif(onednn_linear() is None, reason="this torch has no oneDNN")


def gemm_only(p: Projection) -> Projection:
    """p with linear_rows off: its products of few rows take the GEMM paths, as more rows do."""
    p._rows = None
    return p


def column_major(rows, cols, gen):
    return torch.randn(cols, rows, generator=gen).t()  # [rows, cols], w.t() contiguous


def fp32_close(y, want64):
    # fp32 sums of N products: a few ulps of the largest partial sums.
    scale = float(want64.abs().max())
    assert float((y.double() - want64).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("T", [2, 7, ROWS_MAX])
def test_few_rows_use_linear_rows(T, dtype):
    gen = torch.Generator().manual_seed(T)
    W = column_major(300, 200, gen).to(dtype)
    x = torch.randn(T, 300, generator=gen).to(dtype)
    p = Projection({"w": W}, "w", FP32 if dtype == torch.float32 else BF16, "auto")
    if p._rows is None:
        pytest.skip("linear_rows is not compiled")
    y = p(x, act="relu2")
    h = torch.relu(ops.linear_rows(x, W).to(dtype))  # rounded to x's dtype, then activated in it
    assert y.dtype == dtype and torch.equal(y, h * h)
    slabbed = Projection({"w": slabs.split_rows(W, 3)}, "w", FP32 if dtype == torch.float32 else BF16, "auto")
    assert torch.allclose(slabbed(x).float(), p(x).float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                          atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("T", [2, 7, ROWS_MAX + 1])
def test_rows_use_onednn(T):
    gen = torch.Generator().manual_seed(T)
    W = column_major(300, 200, gen)
    x = torch.randn(T, 300, generator=gen)
    p = Projection({"w": W}, "w", FP32, "auto")
    if T <= ROWS_MAX:
        gemm_only(p)
    assert p._linear_seq is not None
    y = p(x)
    assert torch.equal(y, onednn_linear()(x, W.t(), None, "none", [], None))
    fp32_close(y, x.double() @ W.double())
    # a non-contiguous x (a column slice) gives the same values
    wide = torch.randn(T, 400, generator=gen)
    wide[:, 50:350] = x
    assert torch.equal(p(wide[:, 50:350]), y)


def test_reference_mode_keeps_torch_matmul():
    gen = torch.Generator().manual_seed(3)
    W, x = column_major(64, 48, gen), torch.randn(5, 64, generator=gen)
    p = Projection({"w": W}, "w", FP32, "reference")
    assert p._linear_seq is None
    assert torch.equal(p(x), x @ W)


@needs_onednn
def test_row_slabs_sum_onednn_products():
    gen = torch.Generator().manual_seed(5)
    W, x = column_major(512, 96, gen), torch.randn(6, 512, generator=gen)
    p = gemm_only(Projection({"w": slabs.split_rows(W, 4)}, "w", FP32, "auto"))
    assert p.slabs is not None and p._linear_seq is not None
    fp32_close(p(x), x.double() @ W.double())


def test_bf16_weights_keep_torch_matmul_for_few_rows():
    gen = torch.Generator().manual_seed(7)
    W = column_major(64, 32, gen).to(torch.bfloat16)
    p = gemm_only(Projection({"w": W}, "w", BF16, "auto"))
    assert p._linear_seq is None
    x = torch.randn(BF16_VIA_FP32_MIN_ROWS - 1, 64, generator=gen).to(torch.bfloat16)
    assert torch.equal(p(x), x @ W)


class Spy:
    """Counts the calls of a linear (onednn_linear's signature), optionally failing them."""

    def __init__(self, inner, fail=False):
        self.inner, self.fail, self.calls = inner, fail, 0

    def __call__(self, x, w, *rest):
        self.calls += 1
        if self.fail:
            raise RuntimeError("could not create a primitive")
        return self.inner(x, w, *rest) if self.inner is not None else x @ w.t()


def bf16_close(y, want64):
    # the fp32 sums rounded to bf16: half a bf16 ulp of each value, plus the fp32 sums' error.
    err = (y.double() - want64).abs()
    assert bool((err <= want64.abs() * 2.0 ** -8 + 1e-4 * float(want64.abs().max())).all())


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_bf16_rows_use_fp32_tiles_without_native_bf16(cpu_isa, mode):
    """2^21-element tiles: N = 3000 gives tiles of 699 columns, so M = 1500 is three tiles."""
    gen = torch.Generator().manual_seed(11)
    W = column_major(3000, 1500, gen).to(torch.bfloat16)
    x = torch.randn(BF16_VIA_FP32_MIN_ROWS, 3000, generator=gen).to(torch.bfloat16)
    p = gemm_only(Projection({"w": W}, "w", BF16, mode))
    spy = p._fp32_linear = Spy(p._fp32_linear)
    with _testing.force_cpu_isa(cpu_isa):
        y = p(x)
    assert y.dtype == torch.bfloat16 and y.shape == (BF16_VIA_FP32_MIN_ROWS, 1500)
    tiled = mode == "auto" and cpu_isa != "avx512bf16"
    assert spy.calls == (3 if tiled else 0)
    if not tiled:
        assert torch.equal(y, x @ W)
    bf16_close(y, x.double() @ W.double())


def test_bf16_fp32_tiles_fall_back_to_torch_matmul():
    gen = torch.Generator().manual_seed(13)
    W = column_major(64, 40, gen).to(torch.bfloat16)
    x = torch.randn(BF16_VIA_FP32_MIN_ROWS + 3, 64, generator=gen).to(torch.bfloat16)
    p = gemm_only(Projection({"w": W}, "w", BF16, "auto"))
    assert p._bf16_seq
    spy = p._fp32_linear = Spy(None, fail=True)
    with _testing.force_cpu_isa("scalar"):
        y = p(x)
        assert spy.calls == 1 and p._fp32_linear is None
        assert torch.equal(p(x), y)
    bf16_close(y, x.double() @ W.double())


@needs_onednn
def test_onednn_failure_falls_back_to_torch_matmul():
    """A oneDNN build that raises for a product leaves the projection on ``x @ W`` for good."""
    gen = torch.Generator().manual_seed(9)
    W, x = column_major(64, 40, gen), torch.randn(3, 64, generator=gen)
    p = gemm_only(Projection({"w": W}, "w", FP32, "auto"))
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("could not create a primitive")

    p._linear_seq = failing
    assert torch.equal(p(x), x @ W)
    assert p._linear_seq is None and len(calls) == 1
    assert torch.equal(p(x), x @ W)
