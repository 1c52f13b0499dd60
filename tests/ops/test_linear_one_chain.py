"""linear_one_chain (two groups of one-token products in one call, the second's x being results of
the first): each result equals that of two linear_one_group calls, bit for bit, with both
implementations, every CPU ISA and thread split; opcheck; input errors, each in the words of the
op and the product it concerns."""

import pytest
import test_linear_one
import test_mm8
import torch
from ops_testlib import IMPLS, compiled_or_skip, implementation

from rwkv import ops
from rwkv.ops import _testing

OP = "linear_one_chain"
f32, bf16 = torch.float32, torch.bfloat16


def make_chain(first, second, rng):
    """first: (kind, x dtype, N, M, act) per product of x; second: (kind, src, M, act) per product
    of the result of product src. Returns the op's arguments (x, w, side, act, src)."""
    x, w, side, act, src = [], [], [], [], []
    dtypes, widths = [], []
    for kind, dtype, N, M, a in first:
        if kind == "int8":
            xi, wi, *s = test_mm8.make_inputs(0, N, M, rng, dtype)
            side += s
        else:
            xi, wi = test_linear_one.make_inputs(N, M, rng, dtype=dtype)
        x.append(xi[None])
        w.append(wi)
        act.append(a)
        dtypes.append(dtype)
        widths.append(M)
    for kind, j, M, a in second:
        if kind == "int8":
            _, wi, *s = test_mm8.make_inputs(0, widths[j], M, rng, dtypes[j])
            side += s
        else:
            _, wi = test_linear_one.make_inputs(widths[j], M, rng, dtype=dtypes[j])
        w.append(wi)
        act.append(a)
        src.append(j)
    return x, w, side, act, src


def two_groups(x, w, side, act, src, mode):
    """The same products as two linear_one_group calls."""
    n, s = len(x), 4 * sum(t.dtype == torch.uint8 for t in w[:len(x)])
    first = ops.linear_one_group(x, w[:n], side[:s], act[:n], mode=mode)
    return first + ops.linear_one_group([first[j] for j in src], w[n:], side[s:], act[n:], mode=mode)


CHAINS = {
    # RWKV-7's shape: r, w1 (tanh), k, v (int8), a1, g1 (sigmoid), v1; then w2, a2, g2, v2
    "v7_like": ([("int8", f32, 200, 200, 0), ("dense", f32, 200, 16, 3), ("int8", f32, 200, 200, 0),
                 ("int8", f32, 200, 200, 0), ("dense", f32, 200, 12, 0), ("dense", f32, 200, 24, 1),
                 ("dense", f32, 200, 8, 0)],
                [("dense", 1, 200, 0), ("dense", 4, 200, 0), ("dense", 5, 200, 0), ("dense", 6, 200, 0)]),
    # RWKV-6's decay: its first factor among the products, the second after them
    "v6_like": ([("int8", bf16, 130, 64, 0), ("dense", bf16, 130, 40, 3)], [("dense", 1, 130, 0)]),
    # int8 second products, one result feeding two, an activation in the second group
    "mixed": ([("dense", f32, 77, 45, 2), ("int8", bf16, 30, 33, 0)],
              [("int8", 0, 20, 4), ("dense", 1, 17, 1), ("int8", 0, 9, 0)]),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_chain_equals_two_groups(impl, chain, rng):
    fn = implementation(OP, impl, "cpu")
    args = make_chain(*CHAINS[chain], rng)
    ys = fn(*args)
    want = two_groups(*args, impl)
    assert len(ys) == len(want)
    for y, z in zip(ys, want):
        assert y.dtype == z.dtype and y.shape == z.shape
        assert torch.equal(y, z)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_chain_isa(cpu_isa, chain, rng):
    fn = compiled_or_skip(OP)
    args = make_chain(*CHAINS[chain], rng)
    with _testing.force_cpu_isa(cpu_isa):
        ys, want = fn(*args), two_groups(*args, "compiled")
    assert all(torch.equal(y, z) for y, z in zip(ys, want))


@pytest.mark.parametrize("threads", [1, 3])
def test_chain_thread_split(threads, rng):
    fn = compiled_or_skip(OP)
    args = make_chain([("int8", f32, 1000, 1030, 0), ("dense", f32, 1000, 64, 3)],
                      [("dense", 1, 1000, 0), ("int8", 0, 70, 0)], rng)
    want = two_groups(*args, "compiled")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert all(torch.equal(y, z) for y, z in zip(fn(*args), want))
    finally:
        torch.set_num_threads(before)


def test_chain_opcheck(rng):
    compiled_or_skip(OP)
    x, w, side, act, src = make_chain(*CHAINS["mixed"], rng)
    torch.library.opcheck(torch.ops.rwkv.linear_one_chain.default, (x, w, side, act, src))


REJECT_CASES = {
    "no_x": r"linear_one_chain: needs at least one product of x, got none",
    "w_count": r"linear_one_chain: w and act must have one entry per product \(len\(x\) \+ len\(src\) = 3\), "
               r"got 2 and 3",
    "src_range": r"linear_one_chain: src\[0\] must name one of the 2 products of x \(0 to 1\), got 2",
    "side_count": r"linear_one_chain: side must hold mx, rx, my, ry of each uint8 w, in order: 8 tensors "
                  r"for 2, got 7",
    "first_w": r"linear_one_chain \(product 0\): w must be float32 \(x's dtype\), got bfloat16",
    "second_w": r"linear_one_chain \(product 2\): w must have shape \[N, M\] = \[9, 5\], got \[8, 5\]",
    "second_side": r"linear_one_chain \(product 2\): my must have shape \[N, 1\] = \[9, 1\], got \[8, 1\]",
    "act": r"linear_one_chain \(product 2\): act must be 0 \(none\), 1 \(sigmoid\), 2 \(relu squared\), "
           r"3 \(tanh\) or 4 \(silu\), got 9",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_chain_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    second_kind = "int8" if case in ("second_side", "side_count") else "dense"
    x, w, side, act, src = make_chain([("dense", f32, 16, 9, 0), ("int8", f32, 16, 7, 0)],
                                      [(second_kind, 0, 5, 0)], rng)
    if case == "no_x":
        x, src = [], []
    elif case == "w_count":
        w = w[:2]
    elif case == "src_range":
        src = [2]
    elif case == "side_count":
        side = side[:7]
    elif case == "first_w":
        w[0] = w[0].bfloat16()
    elif case == "second_w":
        w[2] = w[2][:8]
    elif case == "second_side":
        side[6] = side[6][:8]
    elif case == "act":
        act[2] = 9
    if case == "no_x" and impl == "compiled":
        fn = ops.linear_one_chain  # (nothing to dispatch on: the wrapper's reference answers)
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(x, w, side, act, src)
