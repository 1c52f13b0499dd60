"""linear_one_ffn (a channel mix's one-token products in one call: a group, the value product of
its last result, the residual add and an optional gate): equal, bit for bit, to linear_one_group
followed by linear_one_residual, for matrix and row-slab values, int8 and dense, fp32 and bf16,
both implementations, every CPU ISA; opcheck; input errors in the op's words."""

import pytest
import test_linear_one
import test_linear_one_chain
import test_linear_one_slabs
import test_mm8
import torch
from ops_testlib import IMPLS, compiled_or_skip, implementation, uniform, with_threads

from rwkv import ops
from rwkv.ops import _testing

OP = "linear_one_ffn"
f32, bf16 = torch.float32, torch.bfloat16


def make_ffn(kind, dtype, C, F, gated, rng, value="matrix"):
    """A channel mix of width C and hidden size F: (x, w, side, act, residual, gate). kind: the
    weights' ("int8" or "dense"); value: "matrix" or "slabs" (2 row slabs)."""
    # (receptance: sigmoid,) key: relu squared
    first = ([(kind, dtype, C, C, 1)] if gated else []) + [(kind, dtype, C, F, 2)]
    x, w, side, act, _ = test_linear_one_chain.make_chain(first, [], rng)
    if value == "slabs":
        _, wv, s, _ = test_linear_one_slabs.make_inputs(kind, dtype, F, 2, C, rng)
        side += s
    elif kind == "int8":
        _, wv, *s = test_mm8.make_inputs(0, F, C, rng, dtype)
        side += s
    else:
        _, wv = test_linear_one.make_inputs(F, C, rng, dtype=dtype)
    w.append(wv)
    return x, w, side, act, uniform((1, C), rng, -4, 4, "cpu", dtype), 0 if gated else -1


def composed(x, w, side, act, residual, gate, mode):
    n, s = len(x), 4 * sum(t.dtype == torch.uint8 for t in w[:len(x)])
    ys = ops.linear_one_group(x, w[:n], side[:s], act, mode=mode)
    return ops.linear_one_residual(ys[-1], w[n], side[s:], 0, residual, None if gate < 0 else ys[gate],
                                   mode=mode)


CASES = [(kind, dtype, gated, value) for kind in ("int8", "dense") for dtype in (f32, bf16)
         for gated in (False, True) for value in ("matrix", "slabs")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind, dtype, gated, value", CASES, ids=str)
def test_ffn_equals_group_then_residual(impl, kind, dtype, gated, value, rng):
    fn = implementation(OP, impl, "cpu")
    args = make_ffn(kind, dtype, 96, 256, gated, rng, value)
    keep = args[4].clone()
    y = fn(*args)
    assert y.dtype == dtype and y.shape == (1, 96)
    assert torch.equal(y, composed(*args, impl))
    assert torch.equal(args[4], keep)  # the caller's residual is not written


@pytest.mark.parametrize("kind, gated, value", [("int8", True, "slabs"), ("dense", False, "matrix")], ids=str)
def test_ffn_isa(cpu_isa, kind, gated, value, rng):
    fn = compiled_or_skip(OP)
    args = make_ffn(kind, f32, 64, 130, gated, rng, value)
    with _testing.force_cpu_isa(cpu_isa):
        assert torch.equal(fn(*args), composed(*args, "compiled"))


def test_ffn_opcheck(rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.linear_one_ffn.default, make_ffn("int8", f32, 32, 64, True, rng, "slabs"))


REJECT_CASES = {
    "no_x": r"linear_one_ffn: needs at least one product of x, got none",
    "w_count": r"linear_one_ffn: w must hold a weight per x and the value's \(3\), act one per x \(2\), "
               r"got 2 and 2",
    "gate": r"linear_one_ffn: gate must be -1 \(none\) or one of the 2 products of x, got 2",
    "side_count": r"linear_one_ffn: side must hold mx, rx, my, ry of each uint8 w, in order: 12 tensors "
                  r"for 3, got 11",
    "key": r"linear_one_ffn \(product 1\): act must be 0 \(none\), 1 \(sigmoid\), 2 \(relu squared\), "
           r"3 \(tanh\) or 4 \(silu\), got 8",
    "value_rows": r"linear_one_ffn: w must have shape \[N, M\] = \[64, 16\], got \[60, 16\]",
    "residual": r"linear_one_ffn: residual must have the product's shape \[1, 16\], got \[1, 15\]",
    "gate_width": r"linear_one_ffn: gate must have the product's shape \[1, 16\], got \[1, 64\]",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_ffn_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    x, w, side, act, residual, gate = make_ffn("int8", f32, 16, 64, True, rng)
    if case == "no_x":
        x = []
    elif case == "w_count":
        w = w[:2]
    elif case == "gate":
        gate = 2
    elif case == "side_count":
        side = side[:11]
    elif case == "key":
        act[1] = 8
    elif case == "value_rows":
        w[2] = w[2][:60]
        side[10] = side[10][:60]
        side[11] = side[11][:60]
    elif case == "residual":
        residual = residual[:, :15]
    elif case == "gate_width":
        gate = 1
    if case == "no_x" and impl == "compiled":
        fn = ops.linear_one_ffn  # (nothing to dispatch on: the wrapper's reference answers)
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w, side, act, residual, gate)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("kind, dtype", [("int8", f32), ("int8", bf16), ("dense", bf16)], ids=str)
def test_ffn_thread_split(threads, kind, dtype, rng):
    # The products split between threads in many chunks: the bits of one thread's group, value
    # product and torch's `residual + gate * y`.
    fn = compiled_or_skip(OP)
    x, w, side, act, residual, gate = make_ffn(kind, dtype, 512, 1200, True, rng)
    s = 4 * sum(t.dtype == torch.uint8 for t in w[:len(x)])

    def reference():
        ys = ops.linear_one_group(x, w[:len(x)], side[:s], act)
        y = ops.mm8_one_i16(ys[-1], w[-1], *side[s:]) if kind == "int8" else ops.linear_one(ys[-1], w[-1])
        return residual + ys[gate] * y

    want = with_threads(1, reference)
    assert torch.equal(with_threads(threads, lambda: fn(x, w, side, act, residual, gate)), want)
