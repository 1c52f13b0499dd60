"""The CPU ops' outputs come from a pool of reused blocks (csrc/cpu/pooled.cpp). A block must
never back two live tensors, a freed block must come back with the right values written, and
the tensors must behave as any CPU tensor (resizable, freed from any thread)."""

import threading

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


def test_pooled_empty_like_wrapper_in_every_mode():
    from rwkv import ops
    compiled_or_skip("pooled_empty_like")
    t = torch.ones(3, 5, dtype=torch.bfloat16)
    for mode in ("auto", "compiled", "reference"):
        out = ops.pooled_empty_like(t, mode=mode)
        assert (out.shape, out.dtype, out.is_contiguous()) == (t.shape, t.dtype, True)
        assert out.data_ptr() != t.data_ptr()
