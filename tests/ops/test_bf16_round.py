"""The one-token ops' narrowing of fp32 results to bf16 (kernels/convert.h, used by
cpu/float_io.h's narrowed_values; tested through the ``_bf16_round`` test hook): every CPU ISA gives
torch's c10::BFloat16 bits, bit for bit: to nearest even, a carry past the largest finite value to
inf, subnormals kept, every NaN as 0x7FC0; at lengths around each vector width (the vector part
and the scalar tail). Non-NaN values also match torch's own ``.to(torch.bfloat16)``."""

import numpy as np
import pytest
import torch

from rwkv.ops import _backend, _testing

# fp32 bit patterns where rounding to bf16 has a rule to get right.
SPECIAL = np.array([
    0x00000000, 0x80000000,              # +-0
    0x3F800000, 0xC0490FDB,              # 1, -pi
    0x3F808000, 0x3F818000,              # ties: to the even neighbour (down, then up)
    0x3F807FFF, 0x3F808001,              # just below and above a tie
    0x7F7FFFFF, 0xFF7FFFFF,              # the largest finite fp32: carries to +-inf
    0x7F7F7FFF,                          # the largest value that stays finite
    0x7F800000, 0xFF800000,              # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001,  # NaNs: quiet, negative, signalling
    0x7FBFFFFF, 0xFFFFFFFF,              # NaNs whose low bits would carry
    0x00000001, 0x807FFFFF, 0x00800000,  # subnormals, the smallest normal
    0x00008000, 0x00018000,              # subnormal ties
], dtype=np.uint32)


def c10_bits(u: np.ndarray) -> np.ndarray:
    """c10::BFloat16(float)'s bits for fp32 bit patterns u: round to nearest even, NaN as 0x7FC0."""
    w = u.astype(np.uint64)
    rounded = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded).astype(np.uint16)


def bf16_round():
    _backend._load()
    if not _backend.has_kernel("_bf16_round", "CPU"):
        pytest.skip("the compiled CPU kernels (rwkv._C) are not available")
    return torch.ops.rwkv._bf16_round


def patterns(n: int, rng) -> np.ndarray:
    """n fp32 bit patterns: the special ones first (as many as fit), then random ones."""
    rand = torch.randint(0, 2 ** 32, (n,), generator=rng, dtype=torch.int64).numpy().astype(np.uint32)
    k = min(n, len(SPECIAL))
    return np.concatenate([SPECIAL[:k], rand[k:]])


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 23, 31, 33, 1027])
def test_bf16_round_is_torchs_rounding(cpu_isa, n, rng):
    fn = bf16_round()
    for offset in (0, len(SPECIAL) // 2):  # the special values in the vector part and in the tail
        bits = np.roll(patterns(n, rng), offset % n)
        x = torch.from_numpy(bits.view(np.float32).copy())
        with _testing.force_cpu_isa(cpu_isa):
            got = fn(x)
        assert got.dtype == torch.bfloat16 and got.shape == x.shape
        got_bits = got.view(torch.int16).numpy().view(np.uint16)
        want = c10_bits(bits)
        bad = np.nonzero(got_bits != want)[0]
        assert bad.size == 0, [(hex(bits[i]), hex(got_bits[i]), hex(want[i])) for i in bad[:8]]
        torchs = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        finite_or_inf = ~np.isnan(x.numpy())
        assert np.array_equal(got_bits[finite_or_inf], torchs[finite_or_inf])


def test_bf16_round_every_special_value_in_every_lane(cpu_isa):
    """Each special pattern at every position of a 16-lane register and of the tail."""
    fn = bf16_round()
    base = np.full(40, 0x3F800000, dtype=np.uint32)
    for value in SPECIAL:
        for pos in range(len(base)):
            bits = base.copy()
            bits[pos] = value
            with _testing.force_cpu_isa(cpu_isa):
                got = fn(torch.from_numpy(bits.view(np.float32).copy()))
            assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), c10_bits(bits)), \
                (hex(value), pos)


@pytest.mark.parametrize("x", [torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.bfloat16),
                               torch.zeros(4, 2)[:, 0]], ids=["float64", "bfloat16", "strided"])
def test_bf16_round_rejects(x):
    fn = bf16_round()
    with pytest.raises(RuntimeError, match="contiguous float32 CPU tensor"):
        fn(x)
