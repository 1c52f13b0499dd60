"""wkv5_forward and wkv6_forward (one CPU kernel, csrc/cpu/kernels/wkv56.h): compiled vs the
float64 spec, every CPU ISA, opcheck, input errors. wkv6 differs only by a per-token decay."""

import pytest
import torch
from ops_testlib import IMPLS, assert_close_f32, compiled_or_skip, f64, implementation, uniform

from rwkv.ops import _testing, reference as ref

OPS = ("wkv5_forward", "wkv6_forward")


def make_inputs(op, T, H, N, rng, device="cpu"):
    state = uniform((H, N, N), rng, -1, 1, device)
    r, k, v = (uniform((T, H * N), rng, -1, 1, device) for _ in range(3))
    w_shape = (T, H * N) if op == "wkv6_forward" else (H, N)
    w = uniform(w_shape, rng, 0.5, 1.0, device)
    u = uniform((H, N), rng, -1, 1, device)
    return state, r, k, v, w, u


def check(op, fn, T, H, N, rng, device="cpu"):
    state, *rest = make_inputs(op, T, H, N, rng, device)
    y64, s64 = ref.wkv56_math(*f64(state, *rest))
    y = fn(state, *rest)
    assert y.shape == (T, H * N) and y.dtype == torch.float32
    assert_close_f32(y, y64)
    assert_close_f32(state, s64)  # updated in place


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,H,N", [(1, 1, 1), (1, 2, 64), (6, 3, 20), (17, 2, 33)])
def test_wkv56_matches_reference(device, op, impl, T, H, N, rng):
    check(op, implementation(op, impl, device), T, H, N, rng, device)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("T,H,N", [(1, 4, 64), (5, 2, 24), (3, 3, 7)])
def test_wkv56_isa(cpu_isa, op, T, H, N, rng):
    fn = compiled_or_skip(op)
    with _testing.force_cpu_isa(cpu_isa):
        check(op, fn, T, H, N, rng)


def test_wkv56_non_contiguous_inputs(rng):
    # Only the state must be contiguous; other inputs may be views.
    fn = compiled_or_skip("wkv6_forward")
    state, r, k, v, w, u = make_inputs("wkv6_forward", 4, 2, 16, rng)
    r2 = torch.cat([r, r], 1)[:, ::2]
    y64, s64 = ref.wkv56_math(*f64(state, r2, k, v, w, u))
    y = fn(state, r2, k, v, w, u)
    assert_close_f32(y, y64)
    assert_close_f32(state, s64)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
def test_wkv56_empty_sequence_leaves_state(op, impl, rng):
    state, *rest = make_inputs(op, 0, 2, 8, rng)
    before = state.clone()
    assert implementation(op, impl, "cpu")(state, *rest).shape == (0, 16)
    assert torch.equal(state, before)


@pytest.mark.parametrize("op", OPS)
def test_wkv56_opcheck(op, rng):
    compiled_or_skip(op)
    torch.library.opcheck(getattr(torch.ops.rwkv, op).default, make_inputs(op, 3, 2, 8, rng))


REJECT_CASES = {
    "state_dtype": "state must be float32, got float16",
    "state_shape": r"state must have shape \[H, N, N\] = \[2, 8, 8\], got \[2, 8, 9\]",
    "state_strided": r"state must be contiguous, got strides \[64, 1, 8\]",
    "r_shape": r"r must have shape \[T, H\*N\], got \[48\]",
    "k_shape": r"k must have shape \[T, H\*N\] = \[3, 16\], got \[3, 15\]",
    "v_dtype": "v must be float32, got bfloat16",
    "u_shape": r"u must have shape \[H, N\] = \[2, 8\], got \[16\]",
    "device": r"w must be on the same device as state \(cpu\), got meta",
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_wkv56_rejects(op, impl, case, rng):
    match = REJECT_CASES[case]
    fn = implementation(op, impl, "cpu")
    state, r, k, v, w, u = make_inputs(op, 3, 2, 8, rng)
    if case == "state_dtype":
        state = state.half()
    elif case == "state_shape":
        state = torch.zeros(2, 8, 9)
    elif case == "state_strided":
        state = state.transpose(1, 2)
    elif case == "r_shape":
        r = r.reshape(-1)
    elif case == "k_shape":
        k = k[:, :15]
    elif case == "v_dtype":
        v = v.bfloat16()
    elif case == "u_shape":
        u = u.reshape(-1)
    elif case == "device":
        w = w.to("meta")
    with pytest.raises(RuntimeError, match=f"{op}: {match}"):
        fn(state, r, k, v, w, u)


@pytest.mark.parametrize("impl", IMPLS)
def test_wkv5_rejects_per_token_decay_and_wkv6_per_head_decay(impl, rng):
    state, r, k, v, w6, u = make_inputs("wkv6_forward", 3, 2, 8, rng)
    with pytest.raises(RuntimeError, match=r"wkv5_forward: w must have shape \[H, N\] = \[2, 8\]"):
        implementation("wkv5_forward", impl, "cpu")(state, r, k, v, w6, u)
    with pytest.raises(RuntimeError, match=r"wkv6_forward: w must have shape \[T, H\*N\] = \[3, 16\]"):
        implementation("wkv6_forward", impl, "cpu")(state, r, k, v, w6[0].view(2, 8), u)
