"""The server's sampler (rwkv/serve/sampler.py): greedy, truncation, bias and penalties as OpenAI
defines them, seeded draws that do not depend on the other rows of the batch, and text output
held until it is whole UTF-8 and cut at stop strings."""

import torch

from rwkv.serve.sampler import Sampler, SamplingParams, TextOutput, sample_rows

V = 300


def sampler(**kw):
    return Sampler(SamplingParams(max_tokens=10, **kw), V)


def nucleus(logits, temperature, top_p=1.0, top_k=0):
    p = torch.softmax(logits.double() / temperature, -1)
    v, o = p.sort(descending=True)
    keep = int(((v.cumsum(0) - v) < top_p).sum()) if top_p < 1 else V
    if 0 < top_k < V:
        keep = min(keep, top_k)
    return set(o[:max(1, keep)].tolist())


def test_greedy_is_the_first_largest_logit():
    logits = torch.randn(4, V)
    logits[2, 7] = logits[2, 9] = 50.0
    out = sample_rows([sampler(temperature=0) for _ in range(4)], logits)
    assert out == [int(r.argmax()) for r in logits] and out[2] == 7


def test_draws_stay_inside_top_p_and_top_k_and_cover_them():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(V, generator=gen) * 3
    for kw in (dict(top_p=0.5), dict(top_p=0.9), dict(top_k=5), dict(top_k=100, top_p=0.95), dict(top_p=0.999)):
        s = sampler(temperature=0.8, seed=1, **kw)
        want = nucleus(logits, 0.8, kw.get("top_p", 1.0), kw.get("top_k", 0))
        draws = {sample_rows([s], logits.reshape(1, -1))[0] for _ in range(400)}
        assert draws <= want, kw
        if len(want) <= 5:
            assert draws == want, kw


def test_draw_frequencies_follow_the_probabilities():
    logits = torch.tensor([0.0, 1.0, 2.0] + [-1e9] * (V - 3))
    s = sampler(temperature=1.0, seed=3)
    n = 6000
    counts = torch.bincount(torch.tensor([sample_rows([s], logits.reshape(1, -1))[0] for _ in range(n)]), minlength=3)
    want = torch.softmax(logits[:3], 0) * n
    assert torch.allclose(counts[:3].double(), want.double(), rtol=0.1)


def test_seeded_draws_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, V, generator=gen)
    alone = sampler(temperature=1.0, top_p=0.9, seed=42)
    batched = sampler(temperature=1.0, top_p=0.9, seed=42)
    others = [sampler(temperature=t, top_k=k, seed=i) for i, (t, k) in enumerate([(0, 0), (0.7, 3), (1.2, 0), (1.0, 0), (0.5, 9)])]
    a = [sample_rows([alone], logits[:1])[0] for _ in range(20)]
    b = [sample_rows(others[:2] + [batched] + others[2:], torch.cat([logits[1:3], logits[:1], logits[3:]]))[2]
         for _ in range(20)]
    assert a == b
    c = sampler(temperature=1.0, top_p=0.9, seed=43)
    assert [sample_rows([c], logits[:1])[0] for _ in range(20)] != a


def test_logit_bias_and_penalties():
    logits = torch.zeros(1, V)
    logits[0, 5] = 3.0
    assert sample_rows([sampler(temperature=0, logit_bias={5: -100, 8: 2.0})], logits) == [8]
    s = sampler(temperature=0, frequency_penalty=1.0, presence_penalty=1.5)
    first = sample_rows([s], logits)[0]  # 5 (3.0); then 5 has 3 - 1 - 1.5 = 0.5: still first
    second = sample_rows([s], logits)[0]
    third = sample_rows([s], logits)[0]  # 5 at 3 - 2 - 1.5 < 0: another token
    assert (first, second) == (5, 5) and third != 5
    assert int(s.counts[5]) == 2 and int(s.counts.sum()) == 3


def test_nothing_to_draw_from_falls_back_to_greedy():
    logits = torch.full((1, V), float("-inf"))
    logits[0, 4] = float("inf")
    assert sample_rows([sampler(temperature=1.0, seed=0)], logits) == [4]
    assert sample_rows([sampler(temperature=1.0, top_p=0.5, seed=0)], logits) == [4]


def test_text_output_holds_partial_characters_and_cuts_stop_strings():
    # token 2 ends with the first byte of the euro sign, token 3 holds the rest
    table = {1: b"Hi", 2: b" \xe2", 3: b"\x82\xac", 4: b" ok", 5: b"\n\nUs", 6: b"er:", 7: b" more"}

    def decode(ids):
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    out = TextOutput(decode, ("\n\nUser:",))
    pieces = [out.add(t) for t in (1, 2, 3, 4, 5, 6)]
    assert pieces[:2] == [["Hi"], []] and pieces[2] == [" \u20ac"]  # the euro sign once whole
    assert out.stopped and out.text == "Hi \u20ac ok" and out.flush() == []
    lead = TextOutput(decode, (), strip_leading=True)
    assert lead.add(4) == ["ok"] and lead.add(7) == [" more"]


def test_only_ids_below_the_limit_are_chosen():
    logits = torch.zeros(2, V)
    logits[:, V - 1] = 100.0  # the likeliest id, which the tokenizer cannot decode
    out = sample_rows([sampler(temperature=0), sampler(temperature=1.0, seed=0)], logits, limit=V - 10)
    assert all(t < V - 10 for t in out)
