"""linear_one_group (several one-token products in one call): each product equals the separate op
(linear_one for bf16/fp32 weights, mm8_one_i16 for int8 ones) bit for bit, with both
implementations, every CPU ISA and thread split; empty sizes; opcheck; input errors, each in the
words of the op and the product it concerns."""

import pytest
import torch
import test_linear_one
import test_mm8
from ops_testlib import IMPLS, compiled_or_skip, implementation

from rwkv import ops
from rwkv.ops import _testing

OP = "linear_one_group"


def make_group(specs, rng):
    """specs: (kind, x dtype, N, M, act) per product, kind "int8" or "dense". Returns the op's
    arguments (x, w, side, act) and each product's separate call (op name, args)."""
    x, w, side, act, separate = [], [], [], [], []
    for kind, dtype, N, M, a in specs:
        if kind == "int8":
            xi, wi, *s = test_mm8.make_inputs(0, N, M, rng, dtype)
            side += s
            separate.append(("mm8_one_i16", (xi, wi, *s, a)))
        else:
            xi, wi = test_linear_one.make_inputs(N, M, rng, dtype=dtype)
            separate.append(("linear_one", (xi, wi, a)))
        x.append(xi)
        w.append(wi)
        act.append(a)
    return (x, w, side, act), separate


f32, bf16 = torch.float32, torch.bfloat16
# Mixed kinds, dtypes and activations; sizes that are not multiples of the vector width or of the
# 16-column blocks; one product of 4 MiB, so that both threads share the group's columns.
GROUPS = {
    "one_int8": [("int8", f32, 77, 45, 0)],
    "one_dense": [("dense", f32, 77, 45, 3)],
    "model_like": [("int8", f32, 200, 200, 1), ("int8", f32, 200, 200, 0),
                   ("int8", f32, 200, 200, 0), ("dense", f32, 200, 33, 3)],
    "mixed": [("dense", bf16, 130, 17, 4), ("int8", bf16, 130, 64, 2), ("dense", f32, 130, 5, 0),
              ("int8", torch.float16, 130, 31, 1), ("int8", f32, 15, 3, 0)],
    "short_columns": [("dense", f32, 16, 2048, 0), ("dense", f32, 12, 100, 1), ("dense", bf16, 24, 50, 2),
                      ("dense", f32, 8, 33, 0), ("int8", f32, 64, 48, 0)],
    "large": [("int8", f32, 1000, 70, 0), ("dense", f32, 1000, 1030, 1), ("int8", f32, 333, 999, 2)],
}


def check_group(fn, args, separate, mode="compiled"):
    ys = fn(*args)
    assert len(ys) == len(separate)
    for y, (name, sargs) in zip(ys, separate):
        want = ops.resolve(name, "cpu", mode)(*sargs)
        assert y.dtype == want.dtype and y.shape == want.shape
        assert torch.equal(y, want), name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_group_equals_separate_products(impl, group, rng):
    fn = implementation(OP, impl, "cpu")
    if impl == "compiled":
        compiled_or_skip("mm8_one_i16")
    args, separate = make_group(GROUPS[group], rng)
    check_group(fn, args, separate, impl)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_group_isa_and_read_order(cpu_isa, group, rng):
    fn = compiled_or_skip(OP)
    args, separate = make_group(GROUPS[group], rng)
    with _testing.force_cpu_isa(cpu_isa):
        for order in _testing.READ_ORDERS:
            with _testing.force_cpu_read_order(order):
                check_group(fn, args, separate)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_group_thread_split(threads, rng):
    # The columns of all products are split between threads as one range, cut inside products;
    # every column is computed whole by one thread, so any split gives the same bits.
    fn = compiled_or_skip(OP)
    args, separate = make_group(GROUPS["large"] + GROUPS["mixed"], rng)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_group(fn, args, separate)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [2, 3, 9])
def test_group_thread_split_covers_every_column(threads, rng):
    # The split (cpu/parallel.h) cuts the work into chunks smaller than some members' blocks and
    # across member boundaries, each thread running its own share and then taking chunks from
    # the others' (more than 8 threads: the shares' bookkeeping on the heap): every column must
    # still be computed (the results are uninitialized memory otherwise), which the reference,
    # computed without threads, checks.
    fn = compiled_or_skip(OP)
    args, _ = make_group(GROUPS["large"] + GROUPS["model_like"] + GROUPS["large"], rng)
    want = ops.resolve(OP, "cpu", "reference")(*args)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = fn(*args)
    finally:
        torch.set_num_threads(before)
    for y, w in zip(got, want):
        scale = float(w.float().abs().max()) + 1e-6
        assert float((y.float() - w.float()).abs().max()) <= 1e-4 * scale


@pytest.mark.parametrize("impl", IMPLS)
def test_group_int8_fallback(impl, rng):
    # An int8 product whose x*ry is all zero takes mm8_one_i16's fp32 path, inside the group too.
    fn = implementation(OP, impl, "cpu")
    args, separate = make_group(GROUPS["model_like"], rng)
    args[0][1].zero_()
    check_group(fn, args, separate, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_group_empty_sizes(impl, rng):
    fn = implementation(OP, impl, "cpu")
    args, separate = make_group([("int8", f32, 0, 5, 1), ("dense", f32, 6, 0, 0), ("int8", f32, 4, 0, 0),
                                 ("dense", f32, 0, 3, 2)], rng)
    ys = fn(*args)
    assert [tuple(y.shape) for y in ys] == [(5,), (0,), (0,), (3,)]
    check_group(fn, args, separate, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_group_takes_fp32_side_tensors(impl, rng):
    # As mm8_one_i16: float32 copies of a bf16/fp16 member's side tensors give the same bits.
    fn = implementation(OP, impl, "cpu")
    (x, w, side, act), _ = make_group(GROUPS["mixed"], rng)
    want = fn(x, w, side, act)
    got = fn(x, w, [t.float() for t in side], act)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_group_opcheck(rng):
    compiled_or_skip(OP)
    args, _ = make_group(GROUPS["mixed"], rng)
    torch.library.opcheck(torch.ops.rwkv.linear_one_group.default, args)


def test_group_wrapper_rejects_no_products():
    with pytest.raises(RuntimeError, match="linear_one_group: needs at least one product, got none"):
        ops.linear_one_group([], [], [], [])


REJECT_CASES = {
    "lengths": r"linear_one_group: x, w and act must have the same length \(one entry per product\), "
               r"got 3, 3 and 2",
    "side_count": r"linear_one_group: side must hold mx, rx, my, ry of each uint8 w, in order: 8 tensors "
                  r"for 2, got 7",
    "act": r"linear_one_group \(product 2\): act must be 0 \(none\), 1 \(sigmoid\), 2 \(relu squared\), "
           r"3 \(tanh\) or 4 \(silu\), got 5",
    "dense_x_dtype": r"linear_one_group \(product 2\): x must be bfloat16 or float32, got float16",
    "dense_row_major": r"linear_one_group \(product 2\): w must be column-major",
    "int8_side_dtype": r"linear_one_group \(product 1\): ry must be float32 \(x's dtype\), got bfloat16",
    "int8_shape": r"linear_one_group \(product 0\): w must have shape \[N, M\] = \[20, 9\], got \[21, 9\]",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_group_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    (x, w, side, act), _ = make_group([("int8", f32, 20, 9, 0), ("int8", f32, 20, 9, 1),
                                       ("dense", f32, 20, 7, 0)], rng)
    if case == "lengths":
        act = act[:2]
    elif case == "side_count":
        side = side[:7]
    elif case == "act":
        act[2] = 5
    elif case == "dense_x_dtype":
        x[2] = x[2].half()
    elif case == "dense_row_major":
        w[2] = w[2].contiguous()
    elif case == "int8_side_dtype":
        side[7] = side[7].bfloat16()
    elif case == "int8_shape":
        w[0] = torch.zeros(9, 21, dtype=torch.uint8).t()
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w, side, act)
