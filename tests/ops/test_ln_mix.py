"""ln_mix and ln_mix_split (its values as separate tensors): compiled kernel and reference vs the
float64 spec (fp32 and bf16 activations), every CPU ISA, rows split between threads, the split
op against ln_mix bit for bit, opcheck, errors."""

import pytest
import torch
from ops_testlib import ACT_DTYPES, ACT_IDS, IMPLS, assert_close_act, compiled_or_skip, implementation, uniform

from rwkv.models.common import LAYER_NORM_EPS
from rwkv.ops import _testing, reference as ref

OP = "ln_mix"
OPS = ("ln_mix", "ln_mix_split")


def stacked(op, fn):
    """fn's results in ln_mix's form (xx, mixed [n, T, C]); for ln_mix_split, after checking its
    list: n + 2 tensors, the shift state [C] xx's last row (sx's values when T is 0), each its own
    memory."""
    if op == "ln_mix":
        return fn

    def call(x, sx, w, b, mix, lerp, eps):
        out = fn(x, sx, w, b, mix, lerp, eps)
        assert isinstance(out, list) and len(out) == mix.shape[0] + 2
        xx, shift, *mixed = out
        assert shift.shape == (x.shape[1],) and shift.dtype == x.dtype
        assert torch.equal(shift, xx[-1] if x.shape[0] else sx)
        if x.shape[0]:
            assert len({t.untyped_storage().data_ptr() for t in out}) == len(out)
        return xx, torch.stack(mixed)

    return call


def make_inputs(T, C, n, rng, dtype=torch.float32):
    """x and sx (activations) in dtype; w, b, mix fp32."""
    x = uniform((T, C), rng, 2.0, 4.0, dtype=dtype)  # an offset: the mean is not ~0, so it must be removed
    sx = uniform((C,), rng, dtype=dtype)
    w = uniform((C,), rng, 0.5, 1.5)
    b = uniform((C,), rng, -0.5, 0.5)
    mix = uniform((n, C), rng, 0.0, 1.0)
    return x, sx, w, b, mix


def spec64(x, sx, w, b, mix, lerp):
    """The float64 spec: (xx [T, C], mixed [n, T, C])."""
    m = mix.double().unsqueeze(1)
    return ref.ln_mix_math(x.double(), sx.double(), w.double(), b.double(), m,
                           1 - m if lerp else None, LAYER_NORM_EPS)


def check(fn, T, C, n, lerp, rng, dtype=torch.float32):
    inputs = make_inputs(T, C, n, rng, dtype)
    xx64, mixed64 = spec64(*inputs, lerp)
    xx, mixed = fn(*inputs, lerp, LAYER_NORM_EPS)
    assert xx.shape == (T, C) and mixed.shape == (n, T, C)
    # The layer norm divides by the row's spread (~0.6 here), which costs a few fp32 ulps.
    assert_close_act(xx, xx64, dtype, rtol=1e-5, atol=1e-5)
    assert_close_act(mixed, mixed64, dtype, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("lerp", [True, False], ids=["lerp", "delta"])
@pytest.mark.parametrize("T,C,n", [(1, 64, 1), (1, 40, 6), (3, 33, 2), (5, 2048, 4)])
def test_ln_mix_matches_spec(op, impl, dtype, lerp, T, C, n, rng):
    check(stacked(op, implementation(op, impl, "cpu")), T, C, n, lerp, rng, dtype)


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("lerp", [True, False], ids=["lerp", "delta"])
@pytest.mark.parametrize("T,C,n", [(1, 256, 5), (2, 17, 2), (4, 100, 1)])
@pytest.mark.parametrize("op", OPS)
def test_ln_mix_isa(cpu_isa, op, dtype, lerp, T, C, n, rng):
    fn = stacked(op, compiled_or_skip(op))
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, C, n, lerp, rng, dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("lerp", [True, False], ids=["lerp", "delta"])
@pytest.mark.parametrize("T,C,n", [(0, 40, 2), (1, 40, 1), (1, 2048, 6), (3, 33, 2), (700, 64, 3)])
def test_ln_mix_split_equals_ln_mix(cpu_isa, impl, dtype, lerp, T, C, n, rng):
    """ln_mix_split's tensors hold ln_mix's values bit for bit (the same kernels), at every ISA:
    one token, short and threaded sequences, and no rows at all (the shift state is sx's)."""
    if impl == "compiled":
        compiled_or_skip("ln_mix_split")
    pair, split = stacked("ln_mix", implementation("ln_mix", impl, "cpu")), \
        stacked("ln_mix_split", implementation("ln_mix_split", impl, "cpu"))
    inputs = make_inputs(T, C, n, rng, dtype)
    with _testing.force_cpu_isa(cpu_isa):
        xx, mixed = pair(*inputs, lerp, LAYER_NORM_EPS)
        xx_s, mixed_s = split(*inputs, lerp, LAYER_NORM_EPS)
    assert torch.equal(xx, xx_s) and torch.equal(mixed, mixed_s)


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("lerp", [True, False], ids=["lerp", "delta"])
def test_ln_mix_rows_equal_token_by_token(lerp, dtype, rng):
    """Many rows (split between threads, the layer norm before the mixes) give the bits of one-row
    calls, each shifting in the previous row's layer norm. In bf16 the layer norm rows do (the
    sequence's 44800 values are converted by ATen, a row's by the glue's own loop: cpu/float_io.h,
    the same rounding); the mixes do not, since a sequence shifts in the previous row's fp32 layer
    norm where a one-row call gets it rounded to bf16."""
    fn = compiled_or_skip(OP)
    x, sx, w, b, mix = make_inputs(700, 64, 3, rng, dtype)
    xx, mixed = fn(x, sx, w, b, mix, lerp, LAYER_NORM_EPS)
    prev = sx
    for t in range(x.shape[0]):
        xx_t, mixed_t = fn(x[t:t + 1], prev, w, b, mix, lerp, LAYER_NORM_EPS)
        assert torch.equal(xx[t:t + 1], xx_t)
        if dtype == torch.float32:
            assert torch.equal(mixed[:, t:t + 1], mixed_t)
        prev = xx_t[0]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
def test_ln_mix_opcheck(op, dtype, rng):
    compiled_or_skip(op)
    torch.library.opcheck(getattr(torch.ops.rwkv, op).default,
                          (*make_inputs(3, 40, 2, rng, dtype), True, LAYER_NORM_EPS))


# (Each op names itself: "ln_mix" below is replaced by the op's name.)
REJECT_CASES = {
    "x_dtype": "ln_mix: x must be float32 or bfloat16, got float16",
    "sx_dtype": r"ln_mix: sx must be float32 \(x's dtype\), got bfloat16",
    "x_dim": r"ln_mix: x must have shape \[T, C\], got \[40\]",
    "sx_shape": r"ln_mix: sx must have shape \[C\] = \[40\], got \[39\]",
    "b_dtype": "ln_mix: b must be float32, got float16",
    "mix_shape": r"ln_mix: mix must have shape \[n, C\] = \[2, 40\], got \[2, 41\]",
    "mix_dim": r"ln_mix: mix must have shape \[n, C\], got \[40\]",
    "device": r"ln_mix: w must be on the same device as x \(cpu\), got meta",
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_ln_mix_rejects(op, impl, case, rng):
    fn = implementation(op, impl, "cpu")
    x, sx, w, b, mix = make_inputs(3, 40, 2, rng)
    if case == "x_dtype":
        x = x.half()
    elif case == "sx_dtype":
        sx = sx.bfloat16()
    elif case == "x_dim":
        x = x[0]
    elif case == "sx_shape":
        sx = sx[:39]
    elif case == "b_dtype":
        b = b.half()
    elif case == "mix_shape":
        mix = torch.cat([mix, mix[:, :1]], dim=1)
    elif case == "mix_dim":
        mix = mix[0]
    elif case == "device":
        w = w.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case].replace("ln_mix:", op + ":")):
        fn(x, sx, w, b, mix, True, LAYER_NORM_EPS)
