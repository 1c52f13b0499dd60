"""Beyond-upstream generation: streaming, stop strings, final state, seeds, and the prefix cache
(deep copies, LRU/byte limits, longest prefix, only new tokens processed), with a fake model."""

import numpy as np
import pytest
import torch

from _fake_model import FakeModel
from rwkv.generation import GenerationResult, PrefixCache
from rwkv.utils import PIPELINE, PIPELINE_ARGS



def _not_utf8_ids():
    from rwkv.rwkv_tokenizer import WORLD_VOCAB_FILE, load_vocab
    bad = [0]
    for i, b in load_vocab(WORLD_VOCAB_FILE):
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return bad


# Ban end-of-text and the tokens that are not valid UTF-8 on their own: drawn at random they would
# soon make the decoded tail invalid for good and stop the text output (upstream's U+FFFD gating).
ARGS = dict(temperature=1.0, top_p=0.9, token_ban=_not_utf8_ids())
FREQUENT = dict(temperature=1.0, top_p=0.1, token_ban=[0])  # with boost=...: the boosted ids dominate


@pytest.fixture(scope="module")
def world():
    return PIPELINE(None, "rwkv_vocab_v20230424")


def _pipe(world, **kw):
    world.model = FakeModel(65536, **kw)
    return world


def test_stream_pieces_equal_generate_text(world):
    pipe = _pipe(world)
    np.random.seed(1)
    pieces_cb = []
    want = pipe.generate("User: hi\n\nAssistant:", 60, PIPELINE_ARGS(**ARGS), callback=pieces_cb.append)
    pipe = _pipe(world)
    np.random.seed(1)
    stream = pipe.generate_stream("User: hi\n\nAssistant:", 60, PIPELINE_ARGS(**ARGS))
    pieces = list(stream)
    assert pieces == pieces_cb and "".join(pieces) == want and len(pieces) > 30
    res = stream.result
    assert isinstance(res, GenerationResult) and res.text == want and len(res.tokens) == 60
    assert res.stop_reason == "length"


def test_final_state_covers_prompt_and_every_generated_token(world):
    pipe = _pipe(world)
    res = pipe.generate_stream("abc", 25, PIPELINE_ARGS(**ARGS), generator=5).run()
    fresh = FakeModel(65536)
    logits, state = fresh.forward(pipe.encode("abc") + res.tokens, None)
    assert torch.equal(state[0], res.state[0]) and torch.equal(logits, res.logits)
    assert res.forward_tokens == len(pipe.encode("abc")) + 25
    # return_state on generate gives the same, and the text equals the stream's for the same seed
    pipe = _pipe(world)
    text, state2 = pipe.generate("abc", 25, PIPELINE_ARGS(**ARGS), generator=5, return_state=True)
    assert text == res.text and torch.equal(state2[0], res.state[0])


def test_seeded_generation_is_repeatable_and_leaves_global_rng_alone(world):
    outs = []
    for _ in range(2):
        pipe = _pipe(world)
        np.random.seed(0)
        before = np.random.get_state()[1].copy()
        outs.append(pipe.generate("seed", 30, PIPELINE_ARGS(**ARGS), generator=1234))
        assert np.array_equal(np.random.get_state()[1], before)
    assert outs[0] == outs[1] and outs[0]
    pipe = _pipe(world)
    assert pipe.generate("seed", 30, PIPELINE_ARGS(**ARGS), generator=99) != outs[0]


def test_stop_strings_cut_output_and_hold_back_partial_matches(world):
    pipe = _pipe(world, boost=[11, 98])  # '\n' and 'a' are frequent
    np.random.seed(3)
    full = pipe.generate("x", 80, PIPELINE_ARGS(**FREQUENT))
    assert "\na" in full
    for stop in (["\na"], ["zzz", "\na"], "\na"):
        pipe = _pipe(world, boost=[11, 98])
        np.random.seed(3)
        stream = pipe.generate_stream("x", 80, PIPELINE_ARGS(**FREQUENT), stop=stop)
        pieces = list(stream)
        assert "".join(pieces) == full[:full.index("\na")]
        assert all(not p.endswith("\n") for p in pieces)  # a lone '\n' may start '\na': held back
        assert stream.result.stop_reason == "stop_string"
        assert pipe.decode(stream.result.tokens).startswith(full[:full.index("\na") + 2])
    pipe = _pipe(world, boost=[11, 98])
    np.random.seed(3)
    assert pipe.generate("x", 80, PIPELINE_ARGS(**FREQUENT), stop=["never-occurs"]) == full
    with pytest.raises(TypeError):
        pipe.generate("x", 3, stop=[3])


def test_token_stop_reason_and_state(world):
    pipe = _pipe(world, boost=[11])
    np.random.seed(0)
    res = pipe.generate_stream("x", 200, PIPELINE_ARGS(token_stop=[11], **ARGS)).run()
    assert res.stop_reason == "token_stop" and 11 not in res.tokens
    _, state = FakeModel(65536, boost=[11]).forward(pipe.encode("x") + res.tokens, None)
    assert torch.equal(state[0], res.state[0])


# ------------------------------------------------------------------------------------------ cache
def _state(v, n=4):
    return [torch.full((n,), float(v)), torch.full((2, 2), float(v))]


def test_cache_longest_prefix_and_deep_copies():
    cache = PrefixCache(max_entries=4, max_bytes=1 << 20)
    assert cache.lookup([1, 2, 3]) is None
    st = _state(1)
    cache.put([1, 2], st, torch.tensor([0.5]))
    cache.put([1, 2, 3, 4], _state(2), torch.tensor([0.7]))
    st[0].fill_(99)  # the caller's later edits do not reach the cache
    hit = cache.lookup([1, 2, 3, 9])
    assert hit.n_tokens == 2 and float(hit.state[0][0]) == 1.0 and float(hit.logits[0]) == 0.5
    hit.state[0].fill_(-1)  # nor do edits of a returned copy
    assert float(cache.lookup([1, 2, 3, 4, 5]).state[0][0]) == 2.0
    assert float(cache.lookup([1, 2, 7]).state[0][0]) == 1.0
    assert cache.lookup([1, 2, 3, 4], max_len=3).n_tokens == 2
    assert cache.lookup([2, 1]) is None
    assert cache.hits == 4 and cache.misses == 2


def test_cache_lru_and_byte_limits():
    one = sum(t.nelement() * t.element_size() for t in _state(0))
    cache = PrefixCache(max_entries=2, max_bytes=10 * one)
    cache.put([1], _state(1))
    cache.put([2], _state(2))
    cache.lookup([1])            # [1] is now the most recently used
    cache.put([3], _state(3))    # evicts [2]
    assert cache.lookup([2]) is None and cache.lookup([1]) and cache.lookup([3]) and len(cache) == 2
    small = PrefixCache(max_entries=10, max_bytes=2 * one)
    for k in range(5):
        assert small.put([k], _state(k))
    assert len(small) == 2 and small.nbytes <= 2 * one
    assert not small.put([9], _state(9, n=10_000))  # larger than the whole budget: not stored
    assert not small.put([], _state(1))
    with pytest.raises(ValueError):
        PrefixCache(max_entries=0)


def test_cache_cached_logits_equal_uncached_and_second_turn_feeds_only_new_tokens(world):
    pipe = _pipe(world)
    cache = PrefixCache(max_entries=8, max_bytes=1 << 28)
    args = PIPELINE_ARGS(**ARGS)
    turn1 = pipe.encode("User: hello\n\nAssistant:")
    res1 = pipe.generate_stream(turn1, 20, args, stop=["\n\n"], cache=cache, generator=1).run()
    assert res1.cached_tokens == 0 and res1.forward_tokens == len(turn1) + len(res1.tokens)
    history = turn1 + res1.tokens
    turn2 = history + pipe.encode("User: more\n\nAssistant:")
    fed_before = pipe.model.fed
    res2 = pipe.generate_stream(turn2, 20, args, cache=cache, generator=2).run()
    assert res2.cached_tokens == len(history)
    new_prompt = len(turn2) - len(history)
    assert pipe.model.fed - fed_before == new_prompt + len(res2.tokens) == res2.forward_tokens
    # the same turn without a cache: identical text, tokens, state and logits
    nocache = _pipe(world)
    res2b = nocache.generate_stream(turn2, 20, args, generator=2).run()
    assert (res2b.text, res2b.tokens) == (res2.text, res2.tokens)
    assert torch.equal(res2b.state[0], res2.state[0]) and torch.equal(res2b.logits, res2.logits)
    # regenerate: the whole prompt is cached, so only the new reply's tokens are fed
    fed_before = pipe.model.fed
    res3 = pipe.generate_stream(turn2, 20, args, cache=cache, generator=2).run()
    assert res3.cached_tokens == len(turn2) and res3.text == res2.text
    assert pipe.model.fed - fed_before == len(res3.tokens)


def test_cache_is_bypassed_when_the_caller_passes_a_state(world):
    pipe = _pipe(world)
    cache = PrefixCache()
    _, st = pipe.model.forward([5, 6], None)
    res = pipe.generate_stream("abc", 5, PIPELINE_ARGS(**ARGS), state=st, cache=cache, generator=0).run()
    assert res.cached_tokens == 0 and len(cache) == 0
    with pytest.raises(TypeError, match="PrefixCache"):
        pipe.generate_stream("abc", 5, cache={}).run()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_penalties_in_one_update_equal_upstreams_per_token_subtraction(dtype):
    # generate subtracts every seen token's penalty from fp32/fp64 logits with one indexed update;
    # upstream subtracts a Python float from each logit in turn. Decayed counts make penalties
    # that are not exact in fp32: each logit must still come out the same, bit for bit.
    from rwkv.generation import apply_penalties
    rs = np.random.RandomState(0)
    args = PIPELINE_ARGS(alpha_frequency=0.21, alpha_presence=0.37, alpha_decay=0.996)
    logits = torch.tensor(rs.randn(5000) * 7, dtype=dtype)
    occurrence = {}
    for step in range(300):
        for n in occurrence:
            occurrence[n] *= args.alpha_decay
        token = int(rs.randint(5000))
        occurrence[token] = occurrence.get(token, 0) + 1
    want = logits.clone()
    for n in occurrence:
        want[n] -= args.alpha_presence + occurrence[n] * args.alpha_frequency
    got = logits.clone()
    apply_penalties(got, occurrence, args)
    assert got.dtype == dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(got, logits)
