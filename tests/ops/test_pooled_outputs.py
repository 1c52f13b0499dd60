"""The CPU ops' outputs come from a pool of reused blocks (csrc/cpu/pooled.cpp). A block must
never back two live tensors, a freed block must come back with the right values written, and
the tensors must behave as any CPU tensor (resizable, freed from any thread)."""

import threading

import pytest

import torch
from ops_testlib import compiled_or_skip, uniform

from rwkv.ops import reference as ref


def test_live_outputs_never_share_memory(rng):
    fn = compiled_or_skip("linear_one")
    w = uniform((256, 300), rng).t().contiguous().t()
    xs = [uniform((1, 256), rng) for _ in range(40)]
    kept, expected = [], []
    for i, x in enumerate(xs):
        y = fn(x, w)
        torch.testing.assert_close(y, ref.linear_one(x, w), rtol=1e-5, atol=1e-5)
        if i % 3 == 0:  # some outputs stay alive while others are freed and their blocks reused
            kept.append(y)
            expected.append(y.clone())
    assert len({y.data_ptr() for y in kept}) == len(kept)
    for y, e in zip(kept, expected):
        assert torch.equal(y, e)


def test_reused_blocks_hold_each_calls_values(rng):
    fn = compiled_or_skip("ln_mix")
    C, n = 96, 3
    w, b, mix = uniform((C,), rng), uniform((C,), rng), uniform((n, C), rng, 0, 1)
    for _ in range(30):  # each result is freed before the next call, which takes its blocks
        x, sx = uniform((1, C), rng), uniform((C,), rng)
        xx, mixed = fn(x, sx, w, b, mix, False, 1e-5)
        exx, emixed = ref.ln_mix(x, sx, w, b, mix, False, 1e-5)
        torch.testing.assert_close(xx, exx, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mixed, emixed, rtol=1e-5, atol=1e-5)


def test_outputs_resize_and_free_from_another_thread(rng):
    fn = compiled_or_skip("linear_one")
    w = uniform((128, 64), rng).t().contiguous().t()
    x = uniform((1, 128), rng)
    y = fn(x, w)
    y.resize_(4, 1000)  # the storage grows through the pool's allocator
    y.fill_(2.0)
    assert float(y.sum()) == 8000.0
    outs = [fn(x, w) for _ in range(20)]
    worker = threading.Thread(target=outs.clear)  # the blocks go back to the pool from there
    worker.start()
    worker.join()
    assert not outs
    del y
    for _ in range(5):
        torch.testing.assert_close(fn(x, w), ref.linear_one(x, w), rtol=1e-5, atol=1e-5)


def test_pooled_empty_like_gives_fresh_contiguous_tensors():
    fn = compiled_or_skip("pooled_empty_like")
    for shape, dtype in [((32, 64, 64), torch.float32), ((2, 64, 64), torch.float32),
                         ((7, 3), torch.bfloat16), ((5,), torch.int64), ((0, 4), torch.float32)]:
        t = torch.ones(shape, dtype=dtype)
        before = t.clone()
        out = fn(t)
        want = ref.pooled_empty_like(t)
        assert (out.shape, out.dtype, out.device) == (want.shape, want.dtype, want.device)
        assert out.is_contiguous()
        out.fill_(3)  # its own memory: t is untouched
        assert torch.equal(t, before)
        assert bool((out == 3).all())


def test_pooled_empty_like_of_a_strided_tensor_is_contiguous():
    fn = compiled_or_skip("pooled_empty_like")
    t = torch.zeros(8, 6).t()
    out = fn(t)
    assert out.shape == (6, 8) and out.is_contiguous()


def test_pooled_empty_like_reuses_freed_blocks_and_never_live_ones():
    fn = compiled_or_skip("pooled_empty_like")
    like = torch.zeros(4, 64, 64)
    live = [fn(like) for _ in range(4)]
    assert len({t.data_ptr() for t in live}) == 4
    freed = live.pop().data_ptr()
    again = fn(like)  # the block just freed comes back first
    assert again.data_ptr() == freed
    assert again.data_ptr() not in {t.data_ptr() for t in live}


def test_a_prompts_large_blocks_never_crowd_out_a_tokens_small_ones():
    # A long prompt's [T, C] results (4 MiB at T = 512, C = 2048) fill the pool's budget for large
    # blocks; blocks of a decoded token's sizes must still be kept (they have their own budget).
    from rwkv.ops import _backend
    fn = compiled_or_skip("pooled_empty_like")
    large = [fn(torch.empty(1024, 1024)) for _ in range(20)]  # 80 MiB of 4 MiB blocks
    del large
    large_kept = _backend.pooled_kept()[1]
    assert 0 < large_kept <= 64 << 20
    small = [fn(torch.empty(3, 1001)) for _ in range(5)]  # 12012 bytes each: 12032 per block
    small_live = _backend.pooled_kept()[0]  # (the pool may have had blocks of that size)
    del small
    assert _backend.pooled_kept() == [small_live + 5 * 12032, large_kept]


def test_pooled_empty_like_wrapper_in_every_mode():
    from rwkv import ops
    compiled_or_skip("pooled_empty_like")
    t = torch.ones(3, 5, dtype=torch.bfloat16)
    for mode in ("auto", "compiled", "reference"):
        out = ops.pooled_empty_like(t, mode=mode)
        assert (out.shape, out.dtype, out.is_contiguous()) == (t.shape, t.dtype, True)
        assert out.data_ptr() != t.data_ptr()


# One token with bf16 activations: each op computes its fp32 result in the calling thread's
# buffer, then rounds it into the one tensor it returns (csrc/cpu/float_io.h, Fp32Result).
def _widened(args):
    """args with every bf16 tensor (also inside lists) widened to fp32 (exact)."""
    def widen(a):
        if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16:
            return a.float()
        if isinstance(a, list):
            return [widen(t) for t in a]
        return a
    return [widen(a) for a in args]


def _bf16_one_token_args(op, rng):
    """One-token arguments of op with bf16 activations (and bf16 int8 side tensors), fresh values
    on every call; the ops' own test modules make them."""
    import test_linear_one_group
    import test_maa_mix
    import test_wkv6_block
    import test_wkv7_block
    from rwkv.models.common import GROUP_NORM_EPS

    bf16 = torch.bfloat16
    if op == "ln_mix":
        C, n = 96, 5
        return [uniform((1, C), rng, dtype=bf16), uniform((C,), rng, dtype=bf16), uniform((C,), rng),
                uniform((C,), rng), uniform((n, C), rng, 0, 1), False, 1e-5]
    if op == "maa_mix":
        return list(test_maa_mix.make_inputs(1, 96, 5, 8, rng, dtype=bf16))
    if op == "wkv6_block":
        return [*test_wkv6_block.make_inputs(1, 2, 64, rng, dtype=bf16), GROUP_NORM_EPS]
    if op == "wkv7_block":
        return [*test_wkv7_block.make_inputs(1, 2, 64, rng, dtype=bf16), GROUP_NORM_EPS]
    # Two int8 products of different sizes: each has its own part of the buffer.
    args, _ = test_linear_one_group.make_group([("int8", bf16, 200, 70, 1), ("int8", bf16, 96, 33, 0)], rng)
    return list(args)


def _outputs(op, args):
    """The op's results as a flat list (the block ops update args[0], the state, in place: they
    get a copy)."""
    fn = compiled_or_skip(op)
    if op.endswith("_block"):
        args = [args[0].clone(), *args[1:]]
    out = fn(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.mark.parametrize("op", ["ln_mix", "maa_mix", "wkv6_block", "wkv7_block", "linear_one_group"])
def test_bf16_one_token_results_are_the_fp32_results_rounded_and_stay(op, rng):
    args = _bf16_one_token_args(op, rng)
    got = _outputs(op, args)
    want = [y.to(torch.bfloat16) for y in _outputs(op, _widened(args))]  # the same values in fp32
    kept = [y.clone() for y in got]
    assert [y.dtype for y in got] == [torch.bfloat16] * len(got)
    for y, w in zip(got, want):
        assert torch.equal(y, w)
    for _ in range(3):  # later calls reuse the buffer: the results are tensors of their own
        _outputs(op, _bf16_one_token_args(op, rng))
    for y, k in zip(got, kept):
        assert torch.equal(y, k)
