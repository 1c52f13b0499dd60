"""ln_mix_rows and maa_mix_rows (the batched engine's mixes: B one-token rows, row b's previous row
in sx[b]): every row's bits equal the one-token op's (ln_mix_split, maa_mix_split) on that row
alone, every CPU ISA; the reference within the fp32 tolerance; opcheck; input errors."""

import pytest
import torch
from ops_testlib import ACT_DTYPES, ACT_IDS, IMPLS, assert_close_f32, compiled_or_skip, implementation, uniform

from rwkv.ops import _testing

EPS = 1e-5


def ln_inputs(B, C, n, rng, dtype):
    return (uniform((B, C), rng, -2, 2, "cpu", dtype), uniform((B, C), rng, -2, 2, "cpu", dtype),
            uniform((C,), rng, 0.5, 1.5), uniform((C,), rng, -0.5, 0.5), uniform((n, C), rng, 0, 1))


def maa_inputs(B, C, n, D, rng, dtype):
    return (uniform((B, C), rng, -2, 2, "cpu", dtype), uniform((B, C), rng, -2, 2, "cpu", dtype),
            uniform((B, n * D), rng, -2, 2, "cpu", dtype), uniform((n, D, C), rng, -0.5, 0.5, "cpu", dtype),
            uniform((n, C), rng, 0, 1))


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("lerp", [False, True])
@pytest.mark.parametrize("B,C,n", [(1, 16, 1), (3, 40, 2), (8, 130, 5), (17, 64, 3)])
def test_ln_mix_rows_rows_equal_one_token_calls(cpu_isa, B, C, n, lerp, dtype, rng):
    fn = compiled_or_skip("ln_mix_rows")
    one = compiled_or_skip("ln_mix_split")
    x, sx, w, b, mix = ln_inputs(B, C, n, rng, dtype)
    with _testing.force_cpu_isa(cpu_isa):
        xx, *mixed = fn(x, sx, w, b, mix, lerp, EPS)
        assert xx.dtype == dtype and xx.shape == (B, C) and len(mixed) == n
        for r in range(B):
            want = one(x[r:r + 1], sx[r], w, b, mix, lerp, EPS)
            assert torch.equal(xx[r], want[0][0])
            for i in range(n):
                assert torch.equal(mixed[i][r], want[2 + i][0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lerp", [False, True])
def test_ln_mix_rows_matches_float64_spec(impl, lerp, rng):
    from rwkv.ops import reference as ref

    x, sx, w, b, mix = ln_inputs(6, 48, 3, rng, torch.float32)
    xx, *mixed = implementation("ln_mix_rows", impl, "cpu")(x, sx, w, b, mix, lerp, EPS)
    m = mix.double().unsqueeze(1)
    want_xx, want = ref.ln_mix_rows_math(x.double(), sx.double(), w.double(), b.double(), m,
                                         1 - m if lerp else None, EPS)
    assert_close_f32(xx, want_xx)
    for i in range(3):
        assert_close_f32(mixed[i], want[i])


@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("B,C,n,D", [(1, 16, 5, 8), (4, 130, 5, 32), (9, 64, 2, 3)])
def test_maa_mix_rows_rows_equal_one_token_calls(cpu_isa, B, C, n, D, dtype, rng):
    fn = compiled_or_skip("maa_mix_rows")
    one = compiled_or_skip("maa_mix_split")
    xx, sx, z, w2, maa = maa_inputs(B, C, n, D, rng, dtype)
    with _testing.force_cpu_isa(cpu_isa):
        out = fn(xx, sx, z, w2, maa)
        assert len(out) == n and all(t.dtype == dtype and t.shape == (B, C) for t in out)
        for r in range(B):
            want = one(xx[r:r + 1], sx[r], z[r:r + 1], w2, maa)
            for i in range(n):
                assert torch.equal(out[i][r], want[i][0])


@pytest.mark.parametrize("impl", IMPLS)
def test_maa_mix_rows_matches_float64_spec(impl, rng):
    from rwkv.ops import reference as ref

    xx, sx, z, w2, maa = maa_inputs(5, 40, 5, 8, rng, torch.float32)
    out = implementation("maa_mix_rows", impl, "cpu")(xx, sx, z, w2, maa)
    want = ref.maa_mix_rows_math(xx.double(), sx.double(), z.double(), w2.double(), maa.double().unsqueeze(1))
    for i in range(5):
        assert_close_f32(out[i], want[i])


def test_mix_rows_opcheck(rng):
    compiled_or_skip("ln_mix_rows")
    torch.library.opcheck(torch.ops.rwkv.ln_mix_rows.default, (*ln_inputs(3, 32, 2, rng, torch.float32), True, EPS))
    torch.library.opcheck(torch.ops.rwkv.maa_mix_rows.default, maa_inputs(3, 32, 5, 4, rng, torch.float32))


REJECT = {
    "sx_shape": r"ln_mix_rows: sx must have shape \[B, C\] = \[3, 8\] \(x's\), got \[8\]",
    "sx_dtype": r"ln_mix_rows: sx must be float32 \(x's dtype\), got bfloat16",
    "x_dim": r"ln_mix_rows: x must have shape \[B, C\], got \[24\]",
    "mix_shape": r"ln_mix_rows: mix must have shape \[n, C\] = \[2, 8\], got \[2, 9\]",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(REJECT))
def test_ln_mix_rows_rejects(impl, case, rng):
    fn = implementation("ln_mix_rows", impl, "cpu")
    x, sx, w, b, mix = ln_inputs(3, 8, 2, rng, torch.float32)
    if case == "sx_shape":
        sx = sx[0]
    elif case == "sx_dtype":
        sx = sx.bfloat16()
    elif case == "x_dim":
        x = x.reshape(-1)
    elif case == "mix_shape":
        mix = torch.zeros(2, 9)
    with pytest.raises(RuntimeError, match=REJECT[case]):
        fn(x, sx, w, b, mix, False, EPS)


@pytest.mark.parametrize("impl", IMPLS)
def test_maa_mix_rows_rejects_z_of_other_rows(impl, rng):
    xx, sx, z, w2, maa = maa_inputs(3, 8, 5, 4, rng, torch.float32)
    with pytest.raises(RuntimeError, match=r"maa_mix_rows: z must have shape \[B, n\*D\] = \[3, 20\], got \[2, 20\]"):
        implementation("maa_mix_rows", impl, "cpu")(xx, sx, z[:2], w2, maa)
