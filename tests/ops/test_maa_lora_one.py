"""maa_lora_one (one token's maa_mix_split with its first low-rank product z = xw @ w1 inside):
compiled kernel and reference vs the float64 spec (fp32 and bf16 activations, fp32 and bf16 w2),
the compiled op against linear_one then maa_mix_split bit for bit at every CPU ISA (long and short
columns of w1, odd ranks, more mixes than its stack counters), any thread count, opcheck, errors."""

import pytest
import torch
from ops_testlib import ACT_DTYPES, IMPLS, assert_close_act, compiled_or_skip, implementation, uniform

from rwkv.ops import _testing, reference as ref

OP = "maa_lora_one"
# (activation dtype, w2 dtype), as test_maa_mix.py.
DTYPES = [(a, w) for a in ACT_DTYPES for w in ACT_DTYPES]
DTYPE_IDS = ["fp32-fp32", "fp32-bf16w2", "bf16-fp32w2", "bf16-bf16"]


def make_inputs(C, n, D, rng, dtype=torch.float32, w2_dtype=torch.float32):
    """xx, sx, xw, w1 (column-major [C, n*D]) in dtype; w2 in w2_dtype; maa fp32. z = xw @ w1
    spans about [-3, 3], tanh's saturating range."""
    xx = uniform((1, C), rng, -2.0, 2.0, dtype=dtype)
    sx = uniform((C,), rng, -2.0, 2.0, dtype=dtype)
    xw = uniform((1, C), rng, -1.0, 1.0, dtype=dtype)
    bound = 9.0 / C ** 0.5
    w1 = uniform((n * D, C), rng, -bound, bound, dtype=dtype).t()
    w2 = uniform((n, D, C), rng, -0.3, 0.3, dtype=w2_dtype)
    maa = uniform((n, C), rng, 0.0, 1.0)
    return xx, sx, xw, w1, w2, maa


def spec64(xx, sx, xw, w1, w2, maa):
    """float64, with z rounded to xx's dtype as the op returns linear_one's result."""
    z = (xw.double() @ w1.double()).to(xx.dtype).double()
    return ref.maa_mix_math(xx.double(), sx.double(), z, w2.double(), maa.double().unsqueeze(1))


def stacked(out, inputs):
    """The op's list (n tensors [1, C] in xx's dtype, each its own memory) as [n, 1, C]."""
    xx, w2 = inputs[0], inputs[4]
    assert isinstance(out, list) and len(out) == w2.shape[0]
    assert all(t.shape == xx.shape and t.dtype == xx.dtype for t in out)
    assert len({t.untyped_storage().data_ptr() for t in out}) == len(out)
    return torch.stack(out)


def split_ops(inputs):
    """linear_one, then maa_mix_split: the calls maa_lora_one replaces (compiled)."""
    xx, sx, xw, w1, w2, maa = inputs
    z = compiled_or_skip("linear_one")(xw, w1)
    return compiled_or_skip("maa_mix_split")(xx, sx, z, w2, maa)


# (C, n, D): the 1.5B shape; w1's columns short (C * element size <= 1 KiB: C = 100 and 256, and
# 257 and 300 in bf16) and long; even and odd ranks; D = 1 (an empty second half); n > 8 (the
# counters on the heap); (256, 9, 31) splits short columns between threads at column 140.
SHAPES = [(2048, 5, 32), (100, 5, 8), (257, 2, 1), (600, 3, 7), (1030, 5, 33), (300, 9, 2),
          (256, 9, 31)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("C,n,D", SHAPES)
def test_maa_lora_one_matches_spec(impl, dtypes, C, n, D, rng):
    inputs = make_inputs(C, n, D, rng, *dtypes)
    out = stacked(implementation(OP, impl, "cpu")(*inputs), inputs)
    assert_close_act(out, spec64(*inputs), dtypes[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("C,n,D", SHAPES)
def test_maa_lora_one_equals_linear_one_then_maa_mix_split(cpu_isa, dtypes, C, n, D, rng):
    """The same bits as the two calls it replaces, at every ISA: z by linear_one's kernels (each
    thread one run of w1's columns; short columns all in one range) rounded as linear_one rounds
    its result, then maa_mix_split's half-mix sums and finish."""
    fn = compiled_or_skip(OP)
    inputs = make_inputs(C, n, D, rng, *dtypes)
    with _testing.force_cpu_isa(cpu_isa):
        assert torch.equal(stacked(fn(*inputs), inputs), torch.stack(split_ops(inputs)))


@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("C,n,D", [(2048, 5, 32), (600, 9, 5)])
def test_maa_lora_one_same_bits_for_any_thread_count(dtypes, C, n, D, rng):
    """One thread, and ranges of half-mixes split between 2 or 3 (a mix's halves on different
    threads: whichever sums its half last finishes the mix)."""
    fn = compiled_or_skip(OP)
    inputs = make_inputs(C, n, D, rng, *dtypes)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(stacked(fn(*inputs), inputs))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
def test_maa_lora_one_opcheck(dtypes, rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.maa_lora_one.default, make_inputs(40, 5, 4, rng, *dtypes))


REJECT_CASES = {
    "xx_dtype": "maa_lora_one: xx must be float32 or bfloat16, got float16",
    "xx_rows": r"maa_lora_one: xx must be one token, shape \[1, C\], got \[2, 40\]",
    "sx_shape": r"maa_lora_one: sx must have shape \[C\] = \[40\], got \[41\]",
    "xw_dtype": r"maa_lora_one: xw must be float32 \(xx's dtype\), got bfloat16",
    "xw_shape": r"maa_lora_one: xw must have shape \[1, C\] = \[1, 40\], got \[1, 39\]",
    "w2_dtype": "maa_lora_one: w2 must be float32 or bfloat16, got float64",
    "w2_shape": r"maa_lora_one: w2 must have shape \[n, D, C\] = \[5, 4, 40\], got \[5, 4, 39\]",
    "w1_dtype": r"maa_lora_one: w1 must be float32 \(xx's dtype\), got bfloat16",
    "w1_dim": r"maa_lora_one: w1 must have shape \[C, n\*D\], got \[40, 4, 5\]",
    "w1_shape": r"maa_lora_one: w1 must have shape \[C, n\*D\] = \[40, 20\], got \[40, 19\]",
    "w1_row_major": r"maa_lora_one: w1 must be column-major \(w1.t\(\) contiguous\)",
    "maa_shape": r"maa_lora_one: maa must have shape \[n, C\] = \[5, 40\], got \[4, 40\]",
    "device": r"maa_lora_one: w1 must be on the same device as xx \(cpu\), got meta",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_maa_lora_one_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    xx, sx, xw, w1, w2, maa = make_inputs(40, 5, 4, rng)
    if case == "xx_dtype":
        xx = xx.half()
    elif case == "xx_rows":
        xx = torch.cat([xx, xx])
    elif case == "sx_shape":
        sx = torch.cat([sx, sx[:1]])
    elif case == "xw_dtype":
        xw = xw.bfloat16()
    elif case == "xw_shape":
        xw = xw[:, :39]
    elif case == "w2_dtype":
        w2 = w2.double()
    elif case == "w2_shape":
        w2 = w2[:, :, :39]
    elif case == "w1_dtype":
        w1 = w1.bfloat16()
    elif case == "w1_dim":
        w1 = w1.reshape(40, 4, 5)
    elif case == "w1_shape":
        w1 = w1[:, :19]
    elif case == "w1_row_major":
        w1 = w1.contiguous()
    elif case == "maa_shape":
        maa = maa[:4]
    elif case == "device":
        w1 = w1.to("meta")
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(xx, sx, xw, w1, w2, maa)
