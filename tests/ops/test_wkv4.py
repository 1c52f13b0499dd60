"""wkv4_forward: compiled kernels vs the float64 spec, every CPU ISA, opcheck, input errors."""

import pytest
import torch
from ops_testlib import IMPLS, assert_close_f32, compiled_or_skip, f64, implementation, uniform

from rwkv.ops import _testing, reference as ref

OP = "wkv4_forward"


def make_inputs(T, C, rng, device="cpu"):
    w = -torch.exp(uniform((C,), rng, -3, 1, device))
    u = uniform((C,), rng, -1, 1, device)
    k = uniform((T, C), rng, -3, 3, device)
    v = uniform((T, C), rng, -2, 2, device)
    aa = uniform((C,), rng, -1, 1, device)
    bb = uniform((C,), rng, 0.1, 2, device)
    pp = uniform((C,), rng, -2, 2, device)
    return w, u, k, v, aa, bb, pp


def check(fn, T, C, rng, device="cpu"):
    args = make_inputs(T, C, rng, device)
    state = [t.clone() for t in args[4:]]
    y = fn(*args[:4], *state)
    y64, *state64 = ref.wkv4_math(*f64(*args))
    assert y.shape == (T, C) and y.dtype == torch.float32
    assert_close_f32(y, y64)
    for got, want in zip(state, state64):  # aa, bb, pp were updated in place
        assert_close_f32(got, want)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,C", [(1, 1), (1, 37), (7, 16), (33, 45), (4, 100)])
def test_wkv4_matches_reference(device, impl, T, C, rng):
    check(implementation(OP, impl, device), T, C, rng, device)


@pytest.mark.parametrize("T,C", [(1, 8), (5, 23), (9, 64)])
def test_wkv4_isa(cpu_isa, T, C, rng):
    fn = compiled_or_skip(OP)
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, C, rng)


def test_wkv4_starts_from_upstream_zero_state(rng):
    # Upstream starts with aa = bb = 0 and pp = -1e38: the exponentials must underflow to 0.
    fn = compiled_or_skip(OP)
    w, u, k, v, *_ = make_inputs(6, 19, rng)
    aa, bb, pp = torch.zeros(19), torch.zeros(19), torch.full((19,), -1e38)
    y = fn(w, u, k, v, aa, bb, pp)
    y64, *_ = ref.wkv4_math(*f64(w, u, k, v, torch.zeros(19), torch.zeros(19), torch.full((19,), -1e38)))
    assert torch.isfinite(y).all()
    assert_close_f32(y, y64)


def test_wkv4_empty_sequence(rng):
    fn = compiled_or_skip(OP)
    w, u, k, v, aa, bb, pp = make_inputs(0, 5, rng)
    before = aa.clone()
    assert fn(w, u, k, v, aa, bb, pp).shape == (0, 5)
    assert torch.equal(aa, before)


def test_wkv4_opcheck(rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.wkv4_forward.default, make_inputs(3, 20, rng))


REJECT_CASES = {
    "k_dtype": "wkv4_forward: k must be float32, got float64",
    "v_shape": r"wkv4_forward: v must have shape \[T, C\] = \[3, 8\], got \[3, 7\]",
    "w_shape": r"wkv4_forward: w must have shape \[C\] = \[8\], got \[9\]",
    "pp_dtype": "wkv4_forward: pp must be float32, got float16",
    "aa_strided": r"wkv4_forward: aa must be contiguous, got strides \[2\]",
    "k_dim": r"wkv4_forward: k must have shape \[T, C\], got \[24\]",
    "device": r"wkv4_forward: u must be on the same device as k \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_wkv4_rejects(impl, case, rng):
    match = REJECT_CASES[case]
    fn = implementation(OP, impl, "cpu")
    w, u, k, v, aa, bb, pp = make_inputs(3, 8, rng)
    if case == "k_dtype":
        k = k.double()
    elif case == "v_shape":
        v = v[:, :7]
    elif case == "w_shape":
        w = torch.zeros(9)
    elif case == "pp_dtype":
        pp = pp.half()
    elif case == "aa_strided":
        aa = torch.zeros(16)[::2]
    elif case == "k_dim":
        k = k.reshape(-1)
    elif case == "device":
        u = u.to("meta")
    with pytest.raises(RuntimeError, match=match):
        fn(w, u, k, v, aa, bb, pp)
