"""maa_mix and maa_mix_split (its values as separate tensors): compiled kernel and reference vs the
float64 spec (fp32 and bf16 activations, fp32 and bf16 w2), every CPU ISA, rows vs one-row calls
(two code paths), any thread count, the split op against maa_mix bit for bit, opcheck, errors."""

import pytest
import torch
from ops_testlib import ACT_DTYPES, IMPLS, assert_close_act, compiled_or_skip, implementation, uniform

from rwkv.ops import _testing, reference as ref

OP = "maa_mix"
OPS = ("maa_mix", "maa_mix_split")


def stacked(op, fn):
    """fn's result in maa_mix's form [n, T, C]; for maa_mix_split, after checking its list: n
    tensors [T, C], each its own memory."""
    if op == "maa_mix":
        return fn

    def call(xx, sx, z, w2, maa):
        out = fn(xx, sx, z, w2, maa)
        assert isinstance(out, list) and len(out) == w2.shape[0]
        assert all(t.shape == xx.shape and t.dtype == xx.dtype for t in out)
        if xx.shape[0]:
            assert len({t.untyped_storage().data_ptr() for t in out}) == len(out)
        return torch.stack(out)

    return call


def make_inputs(T, C, n, D, rng, dtype=torch.float32, w2_dtype=torch.float32):
    """xx, sx, z (activations) in dtype; w2 in w2_dtype; maa fp32."""
    xx = uniform((T, C), rng, -2.0, 2.0, dtype=dtype)
    sx = uniform((C,), rng, -2.0, 2.0, dtype=dtype)
    z = uniform((T, n * D), rng, -3.0, 3.0, dtype=dtype)  # before tanh: covers its saturating range
    w2 = uniform((n, D, C), rng, -0.3, 0.3, dtype=w2_dtype)
    maa = uniform((n, C), rng, 0.0, 1.0)
    return xx, sx, z, w2, maa


def spec64(xx, sx, z, w2, maa):
    return ref.maa_mix_math(*(t.double() for t in (xx, sx, z, w2)), maa.double().unsqueeze(1))


def check(fn, T, C, n, D, rng, dtypes=(torch.float32, torch.float32)):
    inputs = make_inputs(T, C, n, D, rng, *dtypes)
    out = fn(*inputs)
    assert out.shape == (n, T, C)
    assert_close_act(out, spec64(*inputs), dtypes[0], rtol=1e-5, atol=1e-5)


# (activation dtype, w2 dtype): the models' fp32 and bf16 layers, and the mixed pair.
DTYPES = [(a, w) for a in ACT_DTYPES for w in ACT_DTYPES]
DTYPE_IDS = ["fp32-fp32", "fp32-bf16w2", "bf16-fp32w2", "bf16-bf16"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("T,C,n,D", [(1, 64, 5, 32), (1, 100, 5, 8), (1, 33, 2, 3), (1, 70, 3, 1),
                                     (3, 33, 2, 3), (4, 2048, 5, 32)])
def test_maa_mix_matches_spec(op, impl, dtypes, T, C, n, D, rng):
    check(stacked(op, implementation(op, impl, "cpu")), T, C, n, D, rng, dtypes)


@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("T,C,n,D", [(1, 256, 5, 32), (1, 17, 5, 5), (2, 17, 5, 4), (3, 130, 1, 16)])
@pytest.mark.parametrize("op", OPS)
def test_maa_mix_isa(cpu_isa, op, dtypes, T, C, n, D, rng):
    fn = stacked(op, compiled_or_skip(op))
    with _testing.force_cpu_isa(cpu_isa):
        check(fn, T, C, n, D, rng, dtypes)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("T,C,n,D", [(0, 40, 5, 4), (1, 2048, 5, 32), (1, 33, 2, 3), (9, 810, 5, 7)])
def test_maa_mix_split_equals_maa_mix(cpu_isa, impl, dtypes, T, C, n, D, rng):
    """maa_mix_split's tensors hold maa_mix's values bit for bit (the same kernels), at every ISA:
    one token (w2 by half-mixes), sequences (by channels) and no rows at all."""
    if impl == "compiled":
        compiled_or_skip("maa_mix_split")
    inputs = make_inputs(T, C, n, D, rng, *dtypes)
    with _testing.force_cpu_isa(cpu_isa):
        out = implementation("maa_mix", impl, "cpu")(*inputs)
        split = stacked("maa_mix_split", implementation("maa_mix_split", impl, "cpu"))(*inputs)
    assert torch.equal(out, split)


@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("D", [16, 7, 130])
@pytest.mark.parametrize("T,C", [(9, 810), (6, 824)])
def test_maa_mix_rows_equal_token_by_token(cpu_isa, dtypes, D, T, C, rng):
    """A sequence (channels split between threads) gives the bits of one-row calls (w2's rows split
    by half-mixes), each shifting in the previous row: both sum each half of the low-rank product
    in the same order. The sequence kernel takes 4 rows at a time, then single rows, and channels
    two registers at a time, then one, then single channels: with AVX2 810 and 824 channels end in
    one register and a tail, with AVX-512 810 in a tail alone, 824 in one register and a tail;
    with D = 130 the sequence kernel reads w2 where it lies instead of copying each mix's columns.
    (In bf16 the sequence's results are rounded by ATen, a row's by the glue's own loop:
    cpu/float_io.h, the same rounding.)"""
    fn = compiled_or_skip(OP)
    xx, sx, z, w2, maa = make_inputs(T, C, 5, D, rng, *dtypes)
    with _testing.force_cpu_isa(cpu_isa):
        out = fn(xx, sx, z, w2, maa)
        prev = sx
        for t in range(xx.shape[0]):
            assert torch.equal(out[:, t:t + 1], fn(xx[t:t + 1], prev, z[t:t + 1], w2, maa))
            prev = xx[t]


@pytest.mark.parametrize("T", [1, 3])
def test_maa_mix_same_bits_for_any_thread_count(T, rng):
    fn = compiled_or_skip(OP)
    inputs = make_inputs(T, 2048, 5, 32, rng)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(fn(*inputs))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
def test_maa_mix_opcheck(op, dtypes, rng):
    compiled_or_skip(op)
    torch.library.opcheck(getattr(torch.ops.rwkv, op).default, make_inputs(3, 40, 5, 4, rng, *dtypes))


# (Each op names itself: "maa_mix" below is replaced by the op's name.)
REJECT_CASES = {
    "xx_dtype": "maa_mix: xx must be float32 or bfloat16, got float16",
    "z_dtype": r"maa_mix: z must be float32 \(xx's dtype\), got bfloat16",
    "w2_dtype": "maa_mix: w2 must be float32 or bfloat16, got float64",
    "sx_shape": r"maa_mix: sx must have shape \[C\] = \[40\], got \[41\]",
    "w2_dim": r"maa_mix: w2 must have shape \[n, D, C\], got \[20, 40\]",
    "w2_shape": r"maa_mix: w2 must have shape \[n, D, C\] = \[5, 4, 40\], got \[5, 4, 39\]",
    "z_shape": r"maa_mix: z must have shape \[T, n\*D\] = \[3, 20\], got \[3, 19\]",
    "maa_shape": r"maa_mix: maa must have shape \[n, C\] = \[5, 40\], got \[4, 40\]",
    "device": r"maa_mix: z must be on the same device as xx \(cpu\), got meta",
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_maa_mix_rejects(op, impl, case, rng):
    fn = implementation(op, impl, "cpu")
    xx, sx, z, w2, maa = make_inputs(3, 40, 5, 4, rng)
    if case == "xx_dtype":
        xx = xx.half()
    elif case == "z_dtype":
        z = z.bfloat16()
    elif case == "w2_dtype":
        w2 = w2.double()
    elif case == "sx_shape":
        sx = torch.cat([sx, sx[:1]])
    elif case == "w2_dim":
        w2 = w2.reshape(20, 40)
    elif case == "w2_shape":
        w2 = w2[:, :, :39]
    elif case == "z_shape":
        z = z[:, :19]
    elif case == "maa_shape":
        maa = maa[:4]
    elif case == "device":
        z = z.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case].replace("maa_mix:", op + ":")):
        fn(xx, sx, z, w2, maa)
