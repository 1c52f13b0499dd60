"""The one-token products (mm8_one, mm8_one_i16, linear_one, linear_one_group) take x as [N] or as
one row [1, N], and give [M] or [1, M] to match: the model passes its [1, C] activations with no
reshape on either side. A row's result equals the vector's bit for bit, with both implementations,
on every device and CPU ISA; opcheck sees the row shape too; anything else is refused."""

import re

import pytest
import torch
import test_linear_one
import test_linear_one_group
import test_mm8
from ops_testlib import IMPLS, compiled_or_skip, implementation

from rwkv.ops import _testing

OPS = ("mm8_one", "mm8_one_i16", "linear_one", "linear_one_group")
GROUP = [("int8", torch.float32, 77, 45, 1), ("dense", torch.float32, 77, 30, 3),
         ("dense", torch.bfloat16, 50, 17, 0)]


def vector_args(op, rng, dtype=torch.float32, device="cpu"):
    """The op's arguments with x [N] (a list of them for linear_one_group), on device."""
    if op == "linear_one_group":
        args, _ = test_linear_one_group.make_group(GROUP, rng)
        return args
    if op == "linear_one":
        return [t.to(device) for t in test_linear_one.make_inputs(77, 45, rng, dtype=dtype)] + [2]
    args = [t.to(device) for t in test_mm8.make_inputs(0, 77, 45, rng, dtype)]
    return args + ([4] if op == "mm8_one_i16" else [])


def as_row(op, args, shape=None):
    """args with x (every x, for the group) reshaped to one row [1, N] (or to ``shape``)."""
    row = lambda x: x.reshape(shape or (1, x.shape[-1]))  # noqa: E731
    if op == "linear_one_group":
        return [[row(x) for x in args[0]], *args[1:]]
    return [row(args[0]), *args[1:]]


def assert_row_result(got, want):
    """got (from x [1, N]) is want (from x [N]) as one row [1, M], bit for bit."""
    for g, w in (zip(got, want) if isinstance(want, list) else [(got, want)]):
        assert g.shape == (1, *w.shape) and g.dtype == w.dtype
        assert torch.equal(g[0], w)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
def test_one_row_equals_vector(device, impl, op, rng):
    if device == "cuda" and op in ("mm8_one_i16", "linear_one_group"):
        pytest.skip(f"{op} is a CPU op")
    dtype = torch.bfloat16 if device == "cuda" and op == "linear_one" else torch.float32
    fn = implementation(op, impl, device)
    args = vector_args(op, rng, dtype, device)
    assert_row_result(fn(*as_row(op, args)), fn(*args))


@pytest.mark.parametrize("op", OPS)
def test_one_row_every_isa(cpu_isa, op, rng):
    fn = compiled_or_skip(op)
    args = vector_args(op, rng)
    with _testing.force_cpu_isa(cpu_isa):
        assert_row_result(fn(*as_row(op, args)), fn(*args))


@pytest.mark.parametrize("op", OPS)
def test_one_row_opcheck(op, rng):
    compiled_or_skip(op)
    torch.library.opcheck(getattr(torch.ops.rwkv, op).default, as_row(op, vector_args(op, rng)))


@pytest.mark.parametrize("shape", [(2, 77), (1, 1, 77), ()], ids=["two_rows", "3d", "scalar"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
def test_one_row_rejects_other_shapes(impl, op, shape, rng):
    fn = implementation(op, impl, "cpu")
    args = vector_args(op, rng)
    x = args[0][0] if op == "linear_one_group" else args[0]
    bad_x = x[0] if shape == () else x.expand(*shape)
    if op == "linear_one_group":
        bad, name = [[bad_x, *args[0][1:]], *args[1:]], "linear_one_group (product 0)"
    else:
        bad, name = [bad_x, *args[1:]], op
    want = f"{name}: x must have shape [N] or [1, N] (one token), got {list(shape)}"
    with pytest.raises(RuntimeError, match=re.escape(want)):
        fn(*bad)
