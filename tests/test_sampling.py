"""sample_logits semantics (upstream's rules; the same-seed comparison with upstream itself is in
test_pipeline_upstream.py), validation errors and seeded repeatability."""

import numpy as np
import pytest
import torch

from rwkv import sampling
from rwkv.sampling import resolve_generator, sample_logits


def _logits(n, seed=0, scale=1.0):
    return torch.tensor(np.random.RandomState(seed).randn(n).astype(np.float32) * scale)


def _kept_set_numpy(logits, temperature, top_p, top_k):
    """Which ids can be drawn: run the CPU rule many times with different seeds."""
    return {sample_logits(logits, temperature, top_p, top_k, generator=s) for s in range(400)}


def test_temperature_zero_is_greedy_and_top_p_one_is_greedy_on_cpu():
    logits = _logits(65536, 1)
    best = int(torch.argmax(logits))
    assert {sample_logits(logits, 0, 0.9, generator=s) for s in range(20)} == {best}
    assert {sample_logits(logits, 1.0, 0.0, generator=s) for s in range(20)} == {best}
    # upstream quirk 13.29: when the float32 cumulative sum of the sorted probabilities ends below
    # 1.0 (it does for some logits, not others), top_p = 1.0 is greedy; otherwise nothing is cut.
    outcomes = set()
    for seed in range(5):
        logits = _logits(65536, seed)
        probs = torch.softmax(logits, -1).numpy()
        short = bool(np.cumsum(np.sort(probs)[::-1])[-1] < 1.0)
        drawn = {sample_logits(logits, 1.0, 1.0, generator=s) for s in range(20)}
        assert (drawn == {int(torch.argmax(logits))}) == short
        assert short or len(drawn) == 20
        outcomes.add(short)
    assert outcomes == {True, False}


def test_top_p_cutoff_keeps_exactly_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert _kept_set_numpy(logits, 1.0, 0.5, 0) == {0}       # 0.5 reaches 0.5 at the first entry
    assert _kept_set_numpy(logits, 1.0, 0.79, 0) == {0, 1}
    assert _kept_set_numpy(logits, 1.0, 0.81, 0) == {0, 1, 2}
    assert _kept_set_numpy(logits, 1.0, 0.81, 2) == {0, 1}   # top_k after top_p
    assert _kept_set_numpy(logits, 1.0, 0.0, 0) == {0}


def test_ties_with_the_cutoff_are_kept():
    logits = torch.zeros(6)
    logits[[1, 4]] = 5.0
    assert _kept_set_numpy(logits, 1.0, 0.1, 0) == {1, 4}


def _full_sort_truncation(probs, temperature, top_p):
    """Upstream's CPU rule with the whole vocabulary sorted (the top_k path's steps)."""
    order = np.argsort(probs)
    descending = probs[order][::-1]
    return sampling._cut(probs, order, descending, np.cumsum(descending), temperature, top_p, 0)


def _vocab_cases():
    rs = np.random.RandomState(7)
    for n in (65536, 50277, 300):
        yield n, "peaked", rs.randn(n) * 3
        yield n, "flat", rs.randn(n) * 0.01
        yield n, "ties", np.round(rs.randn(n) * 2) * 2  # few distinct values, many ties
        masked = rs.randn(n) * 2
        masked[rs.rand(n) < 0.5] = -np.inf
        yield n, "masked", masked
        one_hot = np.full(n, -np.inf)
        one_hot[n // 3] = 0.0
        yield n, "one-hot", one_hot


@pytest.mark.parametrize("n,kind,logits", list(_vocab_cases()), ids=lambda v: str(v)[:12])
def test_nucleus_cutoff_without_full_sort_equals_the_full_sort(n, kind, logits):
    # With top_k off the cutoff is found among the largest few probabilities (np.partition), not
    # by sorting the vocabulary: the truncated probabilities must be the full sort's, bit for bit,
    # and the same numpy seed must draw the same token.
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float32), -1).numpy()
    for top_p in (0.0, 0.3, 0.7, 0.95, 0.999999, 1.0, -0.5, 1.5, float("inf"), float("nan")):
        for temperature in (1.0, 0.7):
            want = _full_sort_truncation(probs.copy(), temperature, top_p)
            got = sampling._truncate_numpy(probs.copy(), temperature, top_p, 0)
            assert np.array_equal(got, want), (kind, top_p, temperature)
            if not 0 <= top_p <= 1:  # the public function refuses what the internal rule tolerates
                with pytest.raises(ValueError, match="top_p must be between 0 and 1"):
                    sample_logits(torch.tensor(logits, dtype=torch.float32), temperature, top_p)
                continue
            token = sample_logits(torch.tensor(logits, dtype=torch.float32), temperature, top_p,
                                  generator=123)
            rs = np.random.RandomState(123)
            total = np.sum(want)
            assert token == int(rs.choice(len(want), p=want / total))


def test_nucleus_cutoff_is_found_among_the_largest_entries():
    # The partial search answers for a peaked distribution (else the test above would only have
    # compared the full sort with itself) and leaves the rest to the full sort.
    probs = torch.softmax(torch.tensor(np.random.RandomState(3).randn(65536) * 3,
                                       dtype=torch.float32), -1).numpy()
    descending = np.sort(probs)[::-1]
    want = float(descending[int(np.argmax(np.cumsum(descending) >= 0.7))])
    assert sampling._cutoff_among_largest(probs, 0.7) == want
    assert sampling._cutoff_among_largest(probs, 1.0) is None  # float32 sums end below 1
    assert sampling._nucleus_cutoff(probs, 1.0) == float(descending[0])  # then greedy, as upstream
    flat = np.full(65536, 1 / 65536, dtype=np.float32)
    assert sampling._cutoff_among_largest(flat, 0.5) is None  # more than an eighth of them


def test_temperature_applies_to_truncated_probabilities():
    logits = torch.log(torch.tensor([0.6, 0.4]))
    rs = np.random.RandomState(0)
    draws = [sample_logits(logits, 0.25, 1.0, generator=rs) for _ in range(2000)]
    # p^(1/T) normalised: 0.6^4 / (0.6^4 + 0.4^4) = 0.835
    assert 0.80 < draws.count(0) / len(draws) < 0.87


def test_torch_path_applies_the_same_rule_as_numpy_path():
    # top_p = 1.0 is left out: there the outcome turns on the last bit of the float32 running sum,
    # which torch and numpy may round differently (test_torch_path_top_p_one_follows_its_own_sum).
    cases = [(1.0, 0.7, 0), (0.8, 0.95, 10), (1.5, 0.5, 3), (0.5, 0.99, 100)]
    for k, (temp, top_p, top_k) in enumerate(cases):
        probs = torch.softmax(_logits(300, k), -1)
        want = sampling._truncate_numpy(probs.clone().numpy(), temp, top_p, top_k)
        got = sampling._truncate_torch(probs.clone(), temp, top_p, top_k).numpy()
        assert np.array_equal(want > 0, got > 0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)
        assert (want > 0).sum() > 1
        g = torch.Generator().manual_seed(0)
        drawn = {sampling._sample_torch(probs.clone(), temp, top_p, top_k, g) for _ in range(50)}
        assert drawn <= set(np.flatnonzero(want > 0).tolist())


def test_torch_path_top_p_one_follows_its_own_sum():
    """Upstream's torch path cuts at top_p = 1.0 with torch's own float32 running sum: when it ends
    below 1.0 the draw is greedy, otherwise nothing is cut. torch's CPU cumsum rounds differently
    from numpy's on some CPUs (an AMD EPYC: 0.99999994 against numpy's 1.0000005 for seed 3), so
    the rule is checked against torch's sum, and both outcomes must occur over the seeds."""
    outcomes = set()
    for seed in range(12):
        probs = torch.softmax(_logits(300, seed), -1)
        descending = torch.sort(probs, descending=True).values
        greedy = bool(torch.cumsum(descending, -1)[-1] < 1.0)
        got = sampling._truncate_torch(probs.clone(), 1.0, 1.0, 0)
        if greedy:
            assert torch.equal(got > 0, probs == probs.max())
        else:
            assert torch.equal(got, probs)
        outcomes.add(greedy)
    assert outcomes == {True, False}


def test_seeded_sampling_is_repeatable_for_every_generator_kind():
    logits = _logits(1000, 2, scale=2.0)
    kinds = [lambda: 7, lambda: np.random.RandomState(7), lambda: np.random.default_rng(7),
             lambda: torch.Generator().manual_seed(7)]
    for make in kinds:
        g1, g2 = make(), make()
        a = [sample_logits(logits, 1.0, 0.95, generator=g1) for _ in range(30)]
        b = [sample_logits(logits, 1.0, 0.95, generator=g2) for _ in range(30)]
        assert a == b
        if not isinstance(g1, int):
            assert len(set(a)) > 3  # a stateful generator advances
    np.random.seed(7)
    assert sample_logits(logits, 1.0, 0.95) == sample_logits(logits, 1.0, 0.95, generator=7)


def test_input_logits_untouched_and_numpy_accepted():
    logits = _logits(100)
    before = logits.clone()
    sample_logits(logits, 0.7, 0.9, 5, generator=0)
    assert torch.equal(before, logits)
    assert sample_logits(logits.numpy(), 0, 0.9) == int(torch.argmax(logits))
    assert sample_logits(logits.half(), 0, 0.9) == int(torch.argmax(logits.half().float()))


@pytest.mark.parametrize("bad,kwargs,match", [
    (torch.zeros(2, 5), {}, r"1-D tensor .* got shape \(2, 5\)"),
    (torch.zeros(()), {}, r"1-D tensor .* got shape \(\)"),
    (torch.zeros(5), {"vocab_size": 6}, r"logits have 5 entries but the vocabulary has 6"),
    (torch.tensor([0.0, float("nan"), 1.0]), {}, "NaN"),
    (torch.full((4,), -float("inf")), {}, "no token has a usable probability"),
    (torch.zeros(0), {}, "empty"),
    (torch.zeros(4), {"temperature": -1.0}, "temperature must be a finite number >= 0"),
    (torch.zeros(4), {"temperature": float("inf")}, r"temperature must be a finite number >= 0 .* got inf"),
    (torch.zeros(4), {"temperature": float("nan")}, r"temperature must be a finite number >= 0 .* got nan"),
    (torch.zeros(4), {"top_p": -0.1}, r"top_p must be between 0 and 1 .* got -0.1"),
    (torch.zeros(4), {"top_p": 1.5}, r"top_p must be between 0 and 1 .* got 1.5"),
    (torch.zeros(4), {"top_p": float("nan")}, r"top_p must be between 0 and 1 .* got nan"),
    (torch.zeros(4), {"top_p": float("inf")}, r"top_p must be between 0 and 1 .* got inf"),
    (torch.zeros(4), {"top_k": -1}, r"top_k must be a whole number >= 0 .* got -1"),
    (torch.zeros(4), {"top_k": 2.5}, r"top_k must be a whole number >= 0 .* got 2.5"),
    (torch.zeros(4), {"top_k": float("inf")}, r"top_k must be a whole number >= 0 .* got inf"),
])
def test_bad_inputs_raise_value_error(bad, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_logits(bad, **kwargs)


def test_whole_float_top_k_and_numpy_numbers_are_accepted():
    logits = _logits(100)
    want = sample_logits(logits, 0.7, 0.9, 5, generator=0)
    assert sample_logits(logits, np.float32(0.7), np.float64(0.9), 5.0, generator=0) == want
    assert sample_logits(logits, 0.7, 0.9, np.int64(5), generator=0) == want


@pytest.mark.parametrize("kwargs", [{"temperature": "1"}, {"top_p": None}, {"top_k": True}])
def test_sampling_arguments_that_are_not_numbers_are_a_type_error(kwargs):
    with pytest.raises(TypeError, match=f"{next(iter(kwargs))} must be a number"):
        sample_logits(torch.zeros(4), **kwargs)


def test_underflowing_temperature_is_a_clear_error():
    logits = torch.zeros(2)  # both kept at p = 0.5; 0.5 ** 1000 underflows float32
    with pytest.raises(ValueError, match="underflow"):
        sample_logits(logits, temperature=1e-3, top_p=0.9)


def test_resolve_generator():
    assert isinstance(resolve_generator(3, "cpu"), np.random.RandomState)
    assert resolve_generator(None, "cpu") is None
    with pytest.raises(TypeError):
        resolve_generator("seed", "cpu")
    with pytest.raises(TypeError):
        resolve_generator(True, "cpu")
    with pytest.raises(TypeError, match="torch.Tensor"):
        sample_logits([1.0, 2.0])


def test_legacy_choice_on_the_kept_entries_equals_numpy_choice():
    # sample_logits draws as RandomState.choice(len(p), p=p) does, from the nonzero entries only
    # (or all of them for a wide nucleus): the same token and the same use of the RNG (the next
    # draw after it is the same), over sparse, dense, one-entry and tiny vocabularies.
    r = np.random.RandomState(1)
    for trial in range(600):
        n = int(r.choice([1, 5, 300, 65536]))
        p = r.rand(n).astype(np.float32) ** int(r.choice([1, 8, 40]))
        p[r.rand(n) < r.rand()] = 0
        if not p.any():
            p[r.randint(n)] = 1
        p = p / np.sum(p)
        seed = int(r.randint(1 << 31))
        theirs, ours = np.random.RandomState(seed), np.random.RandomState(seed)
        want = int(theirs.choice(a=len(p), p=p))
        assert sampling._legacy_choice(p, ours.random_sample) == want, trial
        assert ours.random_sample() == theirs.random_sample()
