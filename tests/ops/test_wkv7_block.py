"""wkv7_block: compiled kernel and reference vs the float64 spec (fp32 and bf16 activations), every
CPU ISA, opcheck, errors."""

import pytest
import torch
from ops_testlib import (ACT_DTYPES, ACT_IDS, IMPLS, STATE_IN_REJECT_CASES, assert_block_sequence_equals_steps,
                         assert_close_act, assert_state_in_equals_in_place, bad_state_in, opcheck_state_in,
                         assert_close_f32, compiled_or_skip, f64, implementation, uniform)

from rwkv.models.common import GROUP_NORM_EPS
from rwkv.ops import _testing, reference as ref

OP = "wkv7_block"
# Ranges like a trained model's: (lo, hi) per p row (w0, a0, v0, k_k, k_a, r_k, ln_x w, ln_x b).
PARAM_RANGES = ((-3, 1), (-1, 1), (-1, 1), (0.5, 1.5), (0, 1), (-1, 1), (0.5, 1.5), (-0.5, 0.5))


def make_inputs(T, H, N, rng, first_layer=False, dtype=torch.float32):
    """The [T, H*N] activations in dtype; state and p fp32."""
    C = H * N
    state = uniform((H, N, N), rng)
    r, w, k, v, a, g = (uniform((T, C), rng, -2, 2, dtype=dtype) for _ in range(6))
    v_first, v_gate = (None, None) if first_layer else (uniform((T, C), rng, dtype=dtype),
                                                        uniform((T, C), rng, -2, 2, dtype=dtype))
    p = torch.stack([uniform((C,), rng, lo, hi) for lo, hi in PARAM_RANGES])
    return state, r, w, k, v, a, g, v_first, v_gate, p


def spec64(state, r, w, k, v, a, g, v_first, v_gate, p):
    """The float64 spec: (y, new state); the inputs are not changed."""
    S = state.double()
    opt = [None if t is None else t.double() for t in (v_first, v_gate)]
    y = ref.wkv7_block_math(ref.wkv7_inplace_math, S, *f64(r, w, k, v, a, g), *opt,
                            p.double().unbind(0), GROUP_NORM_EPS)
    return y, S


def check(fn, T, H, N, rng, first_layer=False, dtype=torch.float32):
    state, *rest = make_inputs(T, H, N, rng, first_layer, dtype)
    y64, s64 = spec64(state, *rest)
    y = fn(state, *rest, GROUP_NORM_EPS)
    assert y.shape == (T, H * N)
    # The group norm divides by a head's spread of values, which costs a few fp32 ulps.
    assert_close_act(y, y64, dtype, rtol=1e-4, atol=1e-4)
    assert_close_f32(state, s64)  # updated in place, fp32 whatever the activations


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("first_layer", [False, True])
@pytest.mark.parametrize("T,H,N", [(1, 3, 2), (1, 2, 64), (6, 3, 20), (4, 2, 33)])
def test_wkv7_block_matches_spec(impl, dtype, first_layer, T, H, N, rng):
    check(implementation(OP, impl, "cpu"), T, H, N, rng, first_layer, dtype)


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("first_layer", [False, True])
@pytest.mark.parametrize("T,H,N", [(1, 4, 64), (3, 3, 7), (2, 2, 40), (3, 2, 32),  # N % 16 == 0: streamed rows
                                   (2, 2, 128), (1, 1, 256)])
def test_wkv7_block_isa(cpu_isa, dtype, first_layer, T, H, N, rng):
    fn = compiled_or_skip(OP)
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, H, N, rng, first_layer, dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("T", [1, 4])
def test_wkv7_block_state_in_equals_in_place(impl, dtype, T, rng):
    state, *args = make_inputs(T, 3, 16, rng, dtype=dtype)
    assert_state_in_equals_in_place(implementation(OP, impl, "cpu"), state, args, GROUP_NORM_EPS)


def test_wkv7_block_sequence_equals_token_by_token(rng):
    state, *rows, p = make_inputs(5, 2, 16, rng)
    assert_block_sequence_equals_steps(compiled_or_skip(OP), state, rows, p, GROUP_NORM_EPS)


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
def test_wkv7_block_opcheck(dtype, rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.wkv7_block.default, (*make_inputs(3, 2, 8, rng, dtype=dtype), GROUP_NORM_EPS))



def test_wkv7_block_opcheck_state_in(rng):
    compiled_or_skip(OP)
    state, *args = make_inputs(3, 2, 8, rng)
    opcheck_state_in(OP, state, args, GROUP_NORM_EPS)

REJECT_CASES = {
    "state_dtype": "wkv7_block: state must be float32, got float16",
    "g_shape": r"wkv7_block: g must have shape \[T, H\*N\] = \[3, 16\], got \[2, 16\]",
    "v_first_alone": "wkv7_block: v_first and v_gate must be given together .* got v_first only",
    "v_gate_dtype": r"wkv7_block: v_gate must be float32 \(r's dtype\), got float64",
    "r_dtype": "wkv7_block: r must be float32 or bfloat16, got float16",
    "w_dtype": r"wkv7_block: w must be bfloat16 \(r's dtype\), got float32",
    "p_shape": r"wkv7_block: p must have shape \[8, H\*N\] = \[8, 16\], got \[7, 16\]",
    "p_strided": r"wkv7_block: p must be contiguous, got strides \[1, 8\]",
    **{k: m.format(op="wkv7_block") for k, m in STATE_IN_REJECT_CASES.items()},
    "device": r"wkv7_block: k must be on the same device as state \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_wkv7_block_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    state, r, w, k, v, a, g, v_first, v_gate, p = make_inputs(3, 2, 8, rng)
    original, before = state, state.clone()
    state_in = None
    if case.startswith("state_in"):
        state, state_in = bad_state_in(case, state)
        original, before = state_in, state_in.clone()  # the old state must stay as it was
    elif case == "state_dtype":
        state = state.half()
    elif case == "g_shape":
        g = g[:2]
    elif case == "v_first_alone":
        v_gate = None
    elif case == "v_gate_dtype":
        v_gate = v_gate.double()
    elif case == "r_dtype":
        r = r.half()
    elif case == "w_dtype":  # r bf16, the others fp32
        r = r.bfloat16()
    elif case == "p_shape":
        p = p[:7]
    elif case == "p_strided":
        p = p.t().contiguous().t()
    elif case == "device":
        k = k.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(state, r, w, k, v, a, g, v_first, v_gate, p, GROUP_NORM_EPS, state_in)
    assert torch.equal(original, before)  # rejected before anything is written
