"""mm8_rows_i16 (the batched engine's int8 products): every row's bits equal mm8_one_i16's on that
row alone, every CPU ISA and dtype, row counts around the kernel's groups of rows and its blocks
of columns, rows the integer path cannot represent (zero, NaN) on mm8's fp32 path as mm8_one_i16
takes them; the reference agrees; opcheck; input errors."""

import pytest
import torch
from ops_testlib import IMPLS, assert_close_f32, compiled_or_skip, implementation
from test_mm8 import make_inputs

from rwkv.ops import reference as ref

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# The last three span several of the kernel's blocks of columns, with groups of 4, 2 and 1 rows
# (their rows' activations 2, 8 and 18 KB long) and a last block cut short.
@pytest.mark.parametrize("T,N,M", [(1, 64, 5), (2, 130, 17), (4, 256, 33), (5, 77, 9), (9, 2100, 7), (13, 200, 40),
                                   (5, 1024, 300), (9, 4096, 70), (6, 9000, 40)])
@pytest.mark.parametrize("act", [0, 2])
def test_rows_equal_one_token_calls(cpu_isa, T, N, M, dtype, act, rng):
    fn = compiled_or_skip("mm8_rows_i16")
    one = compiled_or_skip("mm8_one_i16")
    from rwkv.ops import _testing

    x, w, *side = make_inputs(T, N, M, rng, dtype)
    side = [t.float() for t in side]  # the model's fp32 copies of the side tensors
    x[T // 2] = 0  # a row the integer path cannot represent: mm8's fp32 math, as mm8_one_i16
    with _testing.force_cpu_isa(cpu_isa):
        y = fn(x, w, *side, act)
        assert y.dtype == dtype and y.shape == (T, M)
        for t in range(T):
            assert torch.equal(y[t], one(x[t:t + 1], w, *side, act)[0]), t


@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, rng):
    x, w, *side = make_inputs(6, 300, 20, rng)
    y = implementation("mm8_rows_i16", impl, "cpu")(x, w, *side)
    assert_close_f32(y, ref.mm8_rows_i16(x, w, *side).double(), rtol=1e-5, atol=1e-5)


def test_nan_row_stays_in_its_row(rng):
    fn = compiled_or_skip("mm8_rows_i16")
    x, w, *side = make_inputs(3, 64, 8, rng)
    x[1, 5] = float("nan")
    y = fn(x, w, *side)
    assert bool(torch.isnan(y[1]).all()) and bool(torch.isfinite(y[[0, 2]]).all())


def test_opcheck(rng):
    compiled_or_skip("mm8_rows_i16")
    torch.library.opcheck(torch.ops.rwkv.mm8_rows_i16.default, make_inputs(3, 64, 8, rng))


@pytest.mark.parametrize("impl", IMPLS)
def test_rejects_one_row_vector_and_bad_act(impl, rng):
    fn = implementation("mm8_rows_i16", impl, "cpu")
    x, w, *side = make_inputs(2, 16, 4, rng)
    with pytest.raises(RuntimeError, match=r"mm8_rows_i16: x must have shape \[T, N\]"):
        fn(x[0], w, *side)
    with pytest.raises(RuntimeError, match="mm8_rows_i16: act"):
        fn(x, w, *side, 9)
