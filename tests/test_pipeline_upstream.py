"""PIPELINE vs upstream 0.8.32 in one subprocess batch: sample_logits with the same numpy seeds,
generate with a deterministic fake model (all penalty bookkeeping, bans, stops, U+FFFD gating),
refine_context, and the 20B (HF tokenizers) encode/decode path."""

import os
import random

import numpy as np
import pytest
import torch

from _fake_model import FAKE_MODEL_SRC, FakeModel
from _upstream_subprocess import run_upstream
from rwkv.utils import PIPELINE, PIPELINE_ARGS

TOKENIZER_20B = "/work/shared/data/20B_tokenizer.json"


SAMPLE_CASES = [  # (vocab, logit scale, temperature, top_p, top_k)
    (65536, 1.0, 1.0, 0.85, 0), (65536, 1.0, 1.0, 1.0, 0), (65536, 3.0, 0.7, 0.5, 0),
    (65536, 3.0, 1.3, 0.9, 40),
    (65536, 3.0, 0, 0.9, 0), (50277, 2.0, 1.0, 0.0, 0), (50277, 5.0, 2.0, 0.99, 5), (50, 1.0, 1.0, 1.0, 0),
    (50, 1.0, 0.5, 0.3, 3), (50, 2.0, 1.0, 0.95, 100), (7, 0.5, 1.5, 0.8, 2), (7, 0.1, 1.0, 1.0, 0),
]

# ' ', '1', '2', '\t', '\n', 'a' (World ids are byte + 1; 20B ids from its tokenizer)
BOOST = {"world": [33, 50, 51, 10, 11, 98], "20B": [209, 18, 19, 186, 187, 66]}

GEN_CASES = [  # (tokenizer, prompt, token_count, args kwargs); "+boost" uses FakeModel(boost=BOOST[...])
    ("world", "User: hi\n\nAssistant:", 60, dict()),
    ("world", "你好", 80, dict(temperature=1.3, top_p=0.95, alpha_frequency=0.5, alpha_presence=0.7)),
    ("world", "\n", 50, dict(temperature=0.8, top_p=0.5, top_k=20, token_ban=[0, 11], token_stop=[261])),
    ("world", "x" * 700, 30, dict(chunk_len=128, alpha_decay=0.9)),
    ("world", "Q: 1+1=", 40, dict(temperature=0, token_stop=[33, 34, 35])),
    ("20B", "Bob: hello\n\nAlice:", 60, dict(top_p=0.9, token_ban=[0])),
    ("20B", "12 34 56", 50, dict(temperature=1.0, top_p=1.0, alpha_presence=2.0)),
    ("20B", "The", 40, dict(temperature=2.0, top_p=0.99, top_k=50, token_stop=[187, 535])),
    ("world+boost", "1", 80, dict(temperature=1.0, top_p=0.99, alpha_presence=0.3, alpha_frequency=1.5)),
    ("20B+boost", "1", 80, dict(temperature=1.0, top_p=0.99, alpha_presence=0.3, alpha_frequency=1.5)),
]

REFINE_CASES = ["", "  ", "\n\n a \n\u3000b\u3000\r\n\n c", "x", "\r\n\r\n", " 全角\u3000\u3000 "]

_SNIPPET = FAKE_MODEL_SRC + r'''
import numpy as np
from rwkv.utils import PIPELINE, PIPELINE_ARGS
world = PIPELINE(None, 'rwkv_vocab_v20230424')
neox = PIPELINE(None, PAYLOAD['tok20b'])
samples = []
for k, (vocab, scale, temp, top_p, top_k) in enumerate(PAYLOAD['sample_cases']):
    logits = torch.tensor(np.random.RandomState(k).randn(vocab).astype(np.float32) * scale)
    row = []
    for seed in range(PAYLOAD['seeds']):
        np.random.seed(seed)
        row.append(world.sample_logits(logits, temperature=temp, top_p=top_p, top_k=top_k))
    samples.append(row)
gens = []
for name, prompt, count, kw in PAYLOAD['gen_cases']:
    tok = name.split('+')[0]
    pipe = world if tok == 'world' else neox
    vocab = 65536 if tok == 'world' else 50277
    pipe.model = FakeModel(vocab, boost=PAYLOAD['boost'][tok] if '+boost' in name else ())
    np.random.seed(123)
    pieces = []
    text = pipe.generate(prompt, token_count=count, args=PIPELINE_ARGS(**kw), callback=pieces.append)
    gens.append([text, pieces, pipe.model.fed])
RESULT = {
    'samples': samples, 'gens': gens,
    'refine': [world.refine_context(c) for c in PAYLOAD['refine']],
    'enc20b': [neox.encode(s) for s in PAYLOAD['strings']],
    'dec20b': [neox.decode(ids) for ids in PAYLOAD['ids']],
}
'''

STRINGS = ["", "Hello world", "\n\n", "你好 😀", "  spaces  ", "Bob: hi\n\nAlice:", "\x00\x01", "<|endoftext|>"]


@pytest.fixture(scope="module")
def upstream():
    if not os.path.exists(TOKENIZER_20B):
        pytest.skip("shared 20B_tokenizer.json missing")
    rng = random.Random(5)
    ids = [[rng.randrange(0, 50277) for _ in range(rng.randint(0, 6))] for _ in range(300)] + [[0], [535]]
    payload = {"sample_cases": SAMPLE_CASES, "seeds": 25, "gen_cases": GEN_CASES, "boost": BOOST,
               "refine": REFINE_CASES,
               "tok20b": TOKENIZER_20B, "strings": STRINGS, "ids": ids}
    return payload, run_upstream(_SNIPPET, payload)


@pytest.fixture(scope="module")
def pipes():
    return {"world": PIPELINE(None, "rwkv_vocab_v20230424"), "20B": PIPELINE(None, TOKENIZER_20B)}


def test_sample_logits_same_tokens_for_same_numpy_seed(upstream, pipes):
    payload, up = upstream
    pipe = pipes["world"]
    distinct = set()
    for k, (vocab, scale, temp, top_p, top_k) in enumerate(SAMPLE_CASES):
        logits = torch.tensor(np.random.RandomState(k).randn(vocab).astype(np.float32) * scale)
        before = logits.clone()
        ours = []
        for seed in range(payload["seeds"]):
            np.random.seed(seed)
            ours.append(pipe.sample_logits(logits, temperature=temp, top_p=top_p, top_k=top_k))
        assert ours == up["samples"][k], (vocab, temp, top_p, top_k)
        assert torch.equal(logits, before)  # the input is not modified
        distinct.add(len(set(ours)))
    assert max(distinct) > 5 and min(distinct) == 1  # both random and greedy cases were exercised


def test_generic_seed_equals_global_seed(pipes):
    pipe = pipes["world"]
    logits = torch.tensor(np.random.RandomState(3).randn(65536).astype(np.float32))
    for seed in range(10):
        np.random.seed(seed)
        want = pipe.sample_logits(logits, top_p=0.95)
        state = np.random.get_state()
        assert pipe.sample_logits(logits, top_p=0.95, generator=seed) == want
        assert np.array_equal(np.random.get_state()[1], state[1])  # the global RNG was not consumed


def test_generate_matches_upstream(upstream, pipes):
    payload, up = upstream
    for (name, prompt, count, kw), (want_text, want_pieces, want_fed) in zip(GEN_CASES, up["gens"]):
        tok = name.split("+")[0]
        pipe = pipes[tok]
        boost = BOOST[tok] if "+boost" in name else ()
        pipe.model = FakeModel(65536 if tok == "world" else 50277, boost=boost)
        np.random.seed(123)
        pieces = []
        text = pipe.generate(prompt, token_count=count, args=PIPELINE_ARGS(**kw), callback=pieces.append)
        assert (text, pieces, pipe.model.fed) == (want_text, want_pieces, want_fed), (name, prompt, kw)
    assert any(len(t) > 20 for t, _, _ in up["gens"])


def test_refine_context_matches_upstream(upstream, pipes):
    _, up = upstream
    assert [pipes["world"].refine_context(c) for c in REFINE_CASES] == up["refine"]


def test_20b_encode_decode_match_upstream(upstream, pipes):
    payload, up = upstream
    pipe = pipes["20B"]
    assert [pipe.encode(s) for s in STRINGS] == up["enc20b"]
    assert [pipe.decode(ids) for ids in payload["ids"]] == up["dec20b"]
    assert pipe.encode("") == []
