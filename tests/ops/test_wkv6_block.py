"""wkv6_block: compiled kernel and reference vs the float64 spec (fp32 and bf16 gates, the activation
dtype), every CPU ISA, opcheck, errors."""

import pytest
import torch
from ops_testlib import (ACT_DTYPES, ACT_IDS, IMPLS, STATE_IN_REJECT_CASES, assert_block_sequence_equals_steps,
                         assert_close_act, assert_state_in_equals_in_place, bad_state_in, opcheck_state_in,
                         assert_close_f32, compiled_or_skip, f64, implementation, uniform)

from rwkv.models.common import GROUP_NORM_EPS
from rwkv.ops import _testing, reference as ref

OP = "wkv6_block"
# Ranges like a trained model's: (lo, hi) per p row (time_decay, time_first, ln_x w, ln_x b).
PARAM_RANGES = ((-6, 0), (-1, 1), (0.5, 1.5), (-0.5, 0.5))


def make_inputs(T, H, N, rng, dtype=torch.float32):
    """g (the activation: the result's dtype) in dtype; everything else fp32."""
    C = H * N
    state = uniform((H, N, N), rng)
    r, k, v = (uniform((T, C), rng) for _ in range(3))
    g = uniform((T, C), rng, dtype=dtype)
    w = uniform((T, C), rng, -2, 2)
    p = torch.stack([uniform((C,), rng, lo, hi) for lo, hi in PARAM_RANGES])
    return state, r, k, v, w, g, p


def spec64(state, r, k, v, w, g, p):
    """The float64 spec: (y, new state); the inputs are not changed."""
    S = state.double()
    y = ref.wkv6_block_math(ref.wkv6_inplace_math, S, *f64(r, k, v, w, g), p.double().unbind(0),
                            GROUP_NORM_EPS)
    return y, S


def check(fn, T, H, N, rng, dtype=torch.float32):
    state, *rest = make_inputs(T, H, N, rng, dtype)
    y64, s64 = spec64(state, *rest)
    y = fn(state, *rest, GROUP_NORM_EPS)
    assert y.shape == (T, H * N)
    # The group norm divides by a head's spread of values, which costs a few fp32 ulps.
    assert_close_act(y, y64, dtype, rtol=1e-4, atol=1e-4)
    assert_close_f32(state, s64)  # updated in place, fp32 whatever the activations


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("T,H,N", [(1, 3, 2), (1, 2, 64), (6, 3, 20), (4, 2, 33)])
def test_wkv6_block_matches_spec(impl, dtype, T, H, N, rng):
    check(implementation(OP, impl, "cpu"), T, H, N, rng, dtype)


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("T,H,N", [(1, 4, 64), (3, 3, 7), (2, 2, 40), (3, 2, 32)])  # N % 16 == 0: streamed rows
def test_wkv6_block_isa(cpu_isa, dtype, T, H, N, rng):
    fn = compiled_or_skip(OP)
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, H, N, rng, dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("T", [1, 4])
def test_wkv6_block_state_in_equals_in_place(impl, dtype, T, rng):
    state, *args = make_inputs(T, 3, 16, rng, dtype=dtype)
    assert_state_in_equals_in_place(implementation(OP, impl, "cpu"), state, args, GROUP_NORM_EPS)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T", [1, 3])
def test_wkv6_block_bf16_rows_equal_their_fp32_values(impl, T, rng):
    """With bf16 activations, r, k, v and w may come in bf16 (the model passes its products'
    results as they are): the op widens them exactly, so the result and the new state are those
    of the same values passed in fp32, bit for bit; mixed dtypes too."""
    fn = implementation(OP, impl, "cpu")
    state, r, k, v, w, g, p = make_inputs(T, 2, 32, rng, dtype=torch.bfloat16)
    rows16 = [t.bfloat16() for t in (r, k, v, w)]
    s32, s16, smix = state.clone(), state.clone(), state.clone()
    y32 = fn(s32, *(t.float() for t in rows16), g, p, GROUP_NORM_EPS)
    y16 = fn(s16, *rows16, g, p, GROUP_NORM_EPS)
    ymix = fn(smix, rows16[0], rows16[1].float(), rows16[2], rows16[3].float(), g, p, GROUP_NORM_EPS)
    for y, s in ((y16, s16), (ymix, smix)):
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, y32) and torch.equal(s, s32)


def test_wkv6_block_sequence_equals_token_by_token(rng):
    state, *rows, p = make_inputs(5, 2, 16, rng)
    assert_block_sequence_equals_steps(compiled_or_skip(OP), state, rows, p, GROUP_NORM_EPS)


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
def test_wkv6_block_opcheck(dtype, rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.wkv6_block.default, (*make_inputs(3, 2, 8, rng, dtype), GROUP_NORM_EPS))



def test_wkv6_block_opcheck_state_in(rng):
    compiled_or_skip(OP)
    state, *args = make_inputs(3, 2, 8, rng)
    opcheck_state_in(OP, state, args, GROUP_NORM_EPS)

REJECT_CASES = {
    "state_strided": r"wkv6_block: state must be contiguous, got strides \[64, 1, 8\]",
    "w_shape": r"wkv6_block: w must have shape \[T, H\*N\] = \[3, 16\], got \[2, 16\]",
    "g_dtype": "wkv6_block: g must be float32 or bfloat16, got float16",
    "k_dtype": r"wkv6_block: k must be float32 or g's dtype \(float32\), got bfloat16",
    "v_dtype_bf16_gate": r"wkv6_block: v must be float32 or g's dtype \(bfloat16\), got float16",
    "p_shape": r"wkv6_block: p must have shape \[4, H\*N\] = \[4, 16\], got \[8, 16\]",
    **{k: m.format(op="wkv6_block") for k, m in STATE_IN_REJECT_CASES.items()},
    "device": r"wkv6_block: v must be on the same device as state \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_wkv6_block_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    state, r, k, v, w, g, p = make_inputs(3, 2, 8, rng)
    original, before = state, state.clone()
    state_in = None
    if case.startswith("state_in"):
        state, state_in = bad_state_in(case, state)
        original, before = state_in, state_in.clone()  # the old state must stay as it was
    elif case == "state_strided":
        state = state.transpose(1, 2)
    elif case == "w_shape":
        w = w[:2]
    elif case == "g_dtype":
        g = g.half()
    elif case == "k_dtype":
        k = k.bfloat16()
    elif case == "v_dtype_bf16_gate":
        g, v = g.bfloat16(), v.half()
    elif case == "p_shape":
        p = torch.cat([p, p])
    elif case == "device":
        v = v.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(state, r, k, v, w, g, p, GROUP_NORM_EPS, state_in)
    assert torch.equal(original, before)  # rejected before anything is written
