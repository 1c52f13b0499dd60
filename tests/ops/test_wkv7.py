"""wkv7_forward: compiled kernels vs the float64 spec, every CPU ISA, opcheck, input errors."""

import pytest
import torch
from ops_testlib import IMPLS, assert_close_f32, compiled_or_skip, f64, implementation, uniform

from rwkv.ops import _testing, reference as ref

OP = "wkv7_forward"


def make_inputs(T, H, N, rng, device="cpu"):
    state = uniform((H, N, N), rng, -1, 1, device)
    r, k, v = (uniform((T, H * N), rng, -1, 1, device) for _ in range(3))
    w = uniform((T, H * N), rng, 0.6, 1.0, device)
    # As the model calls it: a = -kk, b = kk * gate with kk unit-norm per head.
    kk = torch.nn.functional.normalize(uniform((T, H, N), rng, -1, 1, device), dim=-1)
    gate = uniform((T, H, N), rng, 0, 1, device)
    a, b = (-kk).reshape(T, H * N), (kk * gate).reshape(T, H * N)
    return state, r, w, k, v, a, b


def check(fn, T, H, N, rng, device="cpu"):
    state, *rest = make_inputs(T, H, N, rng, device)
    y64, s64 = ref.wkv7_math(*f64(state, *rest))
    y = fn(state, *rest)
    assert y.shape == (T, H * N) and y.dtype == torch.float32
    assert_close_f32(y, y64)
    assert_close_f32(state, s64)  # updated in place


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,H,N", [(1, 1, 1), (1, 2, 64), (6, 3, 20), (19, 2, 33),
                                   (3, 2, 32), (2, 2, 128), (2, 1, 256)])  # RWKV-7 head sizes
def test_wkv7_matches_reference(device, impl, T, H, N, rng):
    check(implementation(OP, impl, device), T, H, N, rng, device)


@pytest.mark.parametrize("T,H,N", [(1, 4, 64), (5, 2, 24), (3, 3, 7), (2, 2, 128), (1, 1, 256)])
def test_wkv7_isa(cpu_isa, T, H, N, rng):
    fn = compiled_or_skip(OP)
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, H, N, rng)


def test_wkv7_sequence_equals_token_by_token(rng):
    fn = compiled_or_skip(OP)
    state, *rest = make_inputs(5, 2, 16, rng)
    s_seq, s_one = state.clone(), state.clone()
    y_seq = fn(s_seq, *rest)
    y_one = torch.cat([fn(s_one, *(t[i:i + 1] for t in rest)) for i in range(5)])
    torch.testing.assert_close(y_seq, y_one, rtol=0, atol=0)
    torch.testing.assert_close(s_seq, s_one, rtol=0, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_wkv7_empty_sequence_leaves_state(impl, rng):
    state, *rest = make_inputs(0, 2, 8, rng)
    before = state.clone()
    assert implementation(OP, impl, "cpu")(state, *rest).shape == (0, 16)
    assert torch.equal(state, before)


def test_wkv7_opcheck(rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.wkv7_forward.default, make_inputs(3, 2, 8, rng))


REJECT_CASES = {
    "state_dtype": "wkv7_forward: state must be float32, got float16",
    "state_dim": r"wkv7_forward: state must have shape \[H, N, N\], got \[16, 8\]",
    "state_strided": r"wkv7_forward: state must be contiguous, got strides \[64, 1, 8\]",
    "a_shape": r"wkv7_forward: a must have shape \[T, H\*N\] = \[3, 16\], got \[2, 16\]",
    "b_dtype": "wkv7_forward: b must be float32, got float64",
    "device": r"wkv7_forward: v must be on the same device as state \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_wkv7_rejects(impl, case, rng):
    match = REJECT_CASES[case]
    fn = implementation(OP, impl, "cpu")
    state, r, w, k, v, a, b = make_inputs(3, 2, 8, rng)
    if case == "state_dtype":
        state = state.half()
    elif case == "state_dim":
        state = state.reshape(16, 8)
    elif case == "state_strided":
        state = state.transpose(1, 2)
    elif case == "a_shape":
        a = a[:2]
    elif case == "b_dtype":
        b = b.double()
    elif case == "device":
        v = v.to("meta")
    with pytest.raises(RuntimeError, match=match):
        fn(state, r, w, k, v, a, b)
