"""wkv4_block: compiled kernel and reference vs the float64 spec (fp32 gate) and, bit for bit, vs the
unfused ops it replaces (fp32 and bf16 gates; k and v in fp32 or, as the products return them, in
the gate's dtype), every CPU ISA, the caller's state never written, opcheck, errors."""

import pytest
import torch
from ops_testlib import (ACT_DTYPES, ACT_IDS, IMPLS, assert_close_f32, compiled_or_skip, f64,
                         implementation, uniform)
from test_wkv4 import make_inputs as wkv4_inputs

from rwkv.ops import _testing, reference as ref

OP = "wkv4_block"


def make_inputs(T, C, rng, dtype=torch.float32, kv_in_dtype=False):
    """(w, u, k, v, r, aa, bb, pp): wkv4_forward's, with the gate r (after the sigmoid) in dtype,
    and k, v in dtype too when kv_in_dtype (else fp32)."""
    w, u, k, v, aa, bb, pp = wkv4_inputs(T, C, rng)
    r = uniform((T, C), rng, 0.0, 1.0, dtype=dtype)
    if kv_in_dtype:
        k, v = k.to(dtype), v.to(dtype)
    return w, u, k, v, r, aa, bb, pp


def unfused(wkv4, w, u, k, v, r, aa, bb, pp):
    """What the model ran before: k and v converted to fp32, the state copied, wkv4_forward on the
    copies, the gate's multiply in r's dtype."""
    aa, bb, pp = aa.clone(), bb.clone(), pp.clone()
    y = wkv4(w, u, k.float(), v.float(), aa, bb, pp)
    return [r * y.to(r.dtype), aa, bb, pp]


def run_checked(fn, args):
    """fn's results, checking that it wrote none of its inputs and returned new tensors."""
    before = [t.clone() for t in args]
    out = fn(*args)
    assert len(out) == 4
    assert all(torch.equal(a, b) for a, b in zip(args, before))  # nothing written
    ptrs = {t.data_ptr() for t in args}
    assert not any(t.numel() and t.data_ptr() in ptrs for t in out)
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,C", [(1, 1), (1, 37), (7, 16), (4, 100)])
def test_wkv4_block_matches_spec(impl, T, C, rng):
    args = make_inputs(T, C, rng)
    y, aa, bb, pp = run_checked(implementation(OP, impl, "cpu"), args)
    w, u, k, v, r, *state = args
    y64, *state64 = ref.wkv4_math(*f64(w, u, k, v, *state))
    assert y.shape == (T, C)
    assert_close_f32(y, r.double() * y64)
    for got, want in zip((aa, bb, pp), state64):
        assert got.shape == (C,)
        assert_close_f32(got, want)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv", ["fp32", "act"])
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("T,C", [(1, 2048), (1, 37), (5, 64)])
def test_wkv4_block_equals_the_unfused_ops(impl, kv, dtype, T, C, rng):
    """The same bits as the ops the model ran before (bf16: wkv rounded to bf16, then the product
    rounded), with the same implementation's wkv4_forward; k and v given in fp32 or in the
    activation dtype (then widened exactly, as the conversions the op replaces did)."""
    args = make_inputs(T, C, rng, dtype, kv == "act")
    got = run_checked(implementation(OP, impl, "cpu"), args)
    want = unfused(implementation("wkv4_forward", impl, "cpu"), *args)
    assert got[0].dtype == dtype
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("kv", ["fp32", "act"])
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("T,C", [(1, 8), (3, 23), (1, 64)])
def test_wkv4_block_isa(cpu_isa, kv, dtype, T, C, rng):
    fn, wkv4 = compiled_or_skip(OP), compiled_or_skip("wkv4_forward")
    args = make_inputs(T, C, rng, dtype, kv == "act")
    with _testing.force_cpu_isa(cpu_isa):
        got = run_checked(fn, args)
        want = unfused(wkv4, *args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("impl", IMPLS)
def test_wkv4_block_empty_sequence(impl, rng):
    args = make_inputs(0, 5, rng)
    y, *state = run_checked(implementation(OP, impl, "cpu"), args)
    assert y.shape == (0, 5)
    assert all(torch.equal(a, b) for a, b in zip(state, args[5:]))  # unchanged values, new tensors


@pytest.mark.parametrize("kv", ["fp32", "act"])
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
def test_wkv4_block_opcheck(kv, dtype, rng):
    compiled_or_skip(OP)
    torch.library.opcheck(torch.ops.rwkv.wkv4_block.default,
                          make_inputs(3, 20, rng, dtype, kv == "act"))


REJECT_CASES = {
    "r_dtype": "wkv4_block: r must be float32 or bfloat16, got float16",
    "r_shape": r"wkv4_block: r must have shape \[T, C\] = \[3, 8\], got \[3, 7\]",
    "r_device": r"wkv4_block: r must be on the same device as k \(cpu\), got meta",
    "k_dtype": r"wkv4_block: k must be float32 or r's dtype \(float32\), got float64",
    "k_bf16_r_fp32": r"wkv4_block: k must be float32 or r's dtype \(float32\), got bfloat16",
    "v_not_as_k": r"wkv4_block: v must be bfloat16 \(as k\), got float32",
    "v_shape": r"wkv4_block: v must have shape \[T, C\] = \[3, 8\], got \[2, 8\]",
    "aa_strided": r"wkv4_block: aa must be contiguous, got strides \[2\]",
    "pp_dtype": "wkv4_block: pp must be float32, got bfloat16",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT_CASES))
def test_wkv4_block_rejects(impl, case, rng):
    fn = implementation(OP, impl, "cpu")
    w, u, k, v, r, aa, bb, pp = make_inputs(3, 8, rng)
    if case == "r_dtype":
        r = r.half()
    elif case == "r_shape":
        r = r[:, :7]
    elif case == "r_device":
        r = r.to("meta")
    elif case == "k_dtype":
        k = k.double()
    elif case == "k_bf16_r_fp32":
        k, v = k.bfloat16(), v.bfloat16()
    elif case == "v_not_as_k":
        k, r = k.bfloat16(), r.bfloat16()
    elif case == "v_shape":
        v = v[:2]
    elif case == "aa_strided":
        aa = torch.zeros(16)[::2]
    elif case == "pp_dtype":
        pp = pp.bfloat16()
    args = (w, u, k, v, r, aa, bb, pp)
    before = [t.clone() for t in args if t.device.type == "cpu"]
    with pytest.raises(RuntimeError, match=REJECT_CASES[case]):
        fn(*args)
    assert all(torch.equal(a, b) for a, b in zip([t for t in args if t.device.type == "cpu"], before))
