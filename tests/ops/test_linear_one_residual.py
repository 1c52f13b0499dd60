"""linear_one_residual (one one-token product, then the residual add and an optional gate, in one
call): equal, bit for bit, to the product's own op (linear_one, mm8_one_i16 or linear_one_slabs)
followed by torch's `residual + y` / `residual + gate * y`, for every weight kind and activation
dtype, both implementations, every CPU ISA; the caller's residual and gate are not written;
empty sizes; opcheck; input errors in the op's words."""

import pytest
import test_linear_one
import test_linear_one_slabs
import test_mm8
import torch
from ops_testlib import IMPLS, compiled_or_skip, implementation, uniform, with_threads

from rwkv import ops
from rwkv.ops import _testing

OP = "linear_one_residual"
f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16


def make_product(kind, dtype, N, M, rng, S=2):
    """(x [1, N], w, side, the product's own op and its arguments after x) for kind "dense",
    "int8" or "slabs" (int8 row slabs; "dense_slabs": bf16/fp32 ones)."""
    if kind == "dense":
        x, w = test_linear_one.make_inputs(N, M, rng, dtype=dtype)
        return x[None], w, [], "linear_one"
    if kind == "int8":
        x, w, *side = test_mm8.make_inputs(0, N, M, rng, dtype)
        return x[None], w, list(side), "mm8_one_i16"
    x, w3, side, _ = test_linear_one_slabs.make_inputs("int8" if kind == "slabs" else "dense",
                                                       dtype, N, S, M, rng, two_d=True)
    return x, w3, side, "linear_one_slabs"


def composed(x, w, side, act, residual, gate, product, mode="compiled"):
    """The product's own op, then torch's elementwise ops (what the model did before)."""
    fn = ops.resolve(product, "cpu", mode)
    y = fn(x, w, *side, act) if product == "mm8_one_i16" else \
        fn(x, w, side, act) if product == "linear_one_slabs" else fn(x, w, act)
    return residual + (y if gate is None else gate * y)


def make_gated_case(kind, dtype, N, M, rng):
    """make_product's (x, w, side, product), then a residual and a gate [1, M] in dtype."""
    x, w, side, product = make_product(kind, dtype, N, M, rng)
    return (x, w, side, product, uniform((1, M), rng, -4, 4, "cpu", dtype),
            uniform((1, M), rng, 0, 1, "cpu", dtype))


KINDS = [("dense", f32), ("dense", bf16), ("int8", f32), ("int8", bf16), ("int8", f16),
         ("slabs", f32), ("slabs", bf16), ("dense_slabs", f32), ("dense_slabs", bf16)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gated", [False, True], ids=["add", "gate"])
@pytest.mark.parametrize("act", [0, 2])
@pytest.mark.parametrize("kind, dtype", KINDS, ids=lambda v: str(v))
def test_equals_product_then_torch_ops(impl, kind, dtype, act, gated, rng):
    fn = implementation(OP, impl, "cpu")
    x, w, side, product = make_product(kind, dtype, 300, 70, rng)
    residual = uniform((1, 70), rng, -4, 4, "cpu", dtype)
    gate = uniform((1, 70), rng, 0, 1, "cpu", dtype) if gated else None
    keep = (residual.clone(), None if gate is None else gate.clone())
    y = fn(x, w, side, act, residual, gate)
    assert y.dtype == dtype and y.shape == (1, 70)
    assert torch.equal(y, composed(x, w, side, act, residual, gate, product, impl))
    assert torch.equal(residual, keep[0]) and (gate is None or torch.equal(gate, keep[1]))


@pytest.mark.parametrize("kind, dtype", [("dense", f32), ("dense", bf16), ("int8", f32), ("slabs", bf16)],
                         ids=lambda v: str(v))
def test_isa(cpu_isa, kind, dtype, rng):
    fn = compiled_or_skip(OP)
    x, w, side, product, residual, gate = make_gated_case(kind, dtype, 130, 33, rng)
    with _testing.force_cpu_isa(cpu_isa):
        assert torch.equal(fn(x, w, side, 0, residual, gate),
                           composed(x, w, side, 0, residual, gate, product))


@pytest.mark.parametrize("impl", IMPLS)
def test_one_dimensional_x(impl, rng):
    # x [N] gives y [M]: residual and gate are [M] too.
    fn = implementation(OP, impl, "cpu")
    x, w = test_linear_one.make_inputs(40, 20, rng, dtype=f32)
    residual, gate = uniform((20,), rng, -1, 1, "cpu", f32), uniform((20,), rng, 0, 1, "cpu", f32)
    assert torch.equal(fn(x, w, [], 1, residual, gate), residual + gate * ops.linear_one(x, w, 1, mode=impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("N, M", [(0, 5), (7, 0)])
def test_empty_sizes(impl, N, M, rng):
    fn = implementation(OP, impl, "cpu")
    x, w, side, product = make_product("int8", f32, N, M, rng)
    residual = uniform((1, M), rng, -1, 1, "cpu", f32)
    assert torch.equal(fn(x, w, side, 0, residual), composed(x, w, side, 0, residual, None, product, impl))


@pytest.mark.parametrize("kind, dtype", [("dense", bf16), ("int8", f32), ("slabs", f32)], ids=lambda v: str(v))
def test_opcheck(kind, dtype, rng):
    compiled_or_skip(OP)
    x, w, side, _ = make_product(kind, dtype, 128, 12, rng)
    residual, gate = uniform((1, 12), rng, -1, 1, "cpu", dtype), uniform((1, 12), rng, 0, 1, "cpu", dtype)
    torch.library.opcheck(torch.ops.rwkv.linear_one_residual.default, (x, w, side, 0, residual, gate))


REJECT_CASES = {
    "side_count": r"linear_one_residual: side must hold mx, rx, my, ry \(w is uint8\), got 3 tensors",
    "product": r"linear_one_residual: w must be float32 \(x's dtype\), got bfloat16",
    "slabs": r"linear_one_residual: w's slabs must be column-major \(w\[s\]\.t\(\) contiguous\)",
    "residual_dtype": r"linear_one_residual: residual must be float32 \(x's dtype\), got bfloat16",
    "residual_shape": r"linear_one_residual: residual must have the product's shape \[1, 5\], got \[5\]",
    "gate_shape": r"linear_one_residual: gate must have the product's shape \[1, 5\], got \[1, 4\]",
    "gate_dtype": r"linear_one_residual: gate must be float32 \(x's dtype\), got float16",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    kind = {"product": "dense", "slabs": "slabs"}.get(case, "int8")
    x, w, side, _ = make_product(kind, f32, 16, 5, rng)
    residual, gate = torch.zeros(1, 5), torch.ones(1, 5)
    if case == "side_count":
        side = side[:3]
    elif case == "product":
        w = w.bfloat16()
    elif case == "slabs":
        w = w.contiguous()
    elif case == "residual_dtype":
        residual = residual.bfloat16()
    elif case == "residual_shape":
        residual = residual[0]
    elif case == "gate_shape":
        gate = gate[:, :4]
    elif case == "gate_dtype":
        gate = gate.half()
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w, side, 0, residual, gate)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("kind, dtype", [("dense", f32), ("dense", bf16), ("int8", f32), ("int8", bf16)],
                         ids=lambda v: str(v))
def test_thread_split(threads, kind, dtype, rng):
    # Products this large are split between threads in many chunks: the same bits as one thread
    # doing the whole product, then torch's elementwise ops.
    fn = compiled_or_skip(OP)
    x, w, side, product, residual, gate = make_gated_case(kind, dtype, 1024, 1100, rng)
    want = with_threads(1, lambda: composed(x, w, side, 2, residual, gate, product))
    assert torch.equal(with_threads(threads, lambda: fn(x, w, side, 2, residual, gate)), want)
    assert torch.equal(with_threads(threads, lambda: fn(x, w, side, 0, residual, None)),
                       with_threads(1, lambda: composed(x, w, side, 0, residual, None, product)))
