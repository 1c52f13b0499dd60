"""The small trained RWKV-7 model shipped in models/rwkv7-tiny/.

Fast checks: the checkpoint file and its v7 key set, the tokenizer, the held-out split, the training
code's hand-written recurrence backward, and -- the point of shipping a trained model -- that our
package predicts held-out text far better than a unigram model, with logits equal to the training
model's (and upstream's, when .upstream/ is installed).
"""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import tiny_model_lib as lib  # noqa: E402

MAX_BYTES = 25 * 1000 * 1000
N_PASSAGES = 6          # held-out passages used for the perplexity checks
MAX_LEN = 128           # tokens per passage


@pytest.fixture(scope="module")
def sd():
    assert os.path.exists(lib.MODEL_PATH), "models/rwkv7-tiny/rwkv7-tiny.pth is missing"
    return torch.load(lib.MODEL_PATH, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def tok():
    return lib.load_tokenizer()


@pytest.fixture(scope="module")
def split():
    return lib.load_split()


@pytest.fixture(scope="module")
def heldout_seqs(tok, split):
    _, held = split
    return [([lib.EOT_ID] + tok.encode(p).ids)[: MAX_LEN + 1] for p in held[:N_PASSAGES]]


@pytest.fixture(scope="module")
def unigram(tok, split, heldout_seqs):
    train, _ = split
    targets = [t for s in heldout_seqs for t in s[1:]]
    return lib.unigram_ppl(lib.encode_passages(tok, train), targets, tok.get_vocab_size())


def ppl_of(logits_list, seqs):
    nll, n = 0.0, 0
    for logits, s in zip(logits_list, seqs):
        lp = torch.log_softmax(logits.float(), -1)
        tgt = torch.tensor(s[1:])
        nll -= lp.gather(-1, tgt[:, None]).sum().item()
        n += len(tgt)
    return math.exp(nll / n)


def test_checkpoint_file_size_and_safe_load(sd):
    assert os.path.getsize(lib.MODEL_PATH) <= MAX_BYTES
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    assert all(v.dtype in (torch.float32, torch.bfloat16) for v in sd.values())
    assert all(torch.isfinite(v.float()).all() for v in sd.values())


def test_checkpoint_has_v7_key_set(sd):
    V, C = sd["emb.weight"].shape
    H, N = sd["blocks.0.att.r_k"].shape
    assert H * N == C and N == 64
    L = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    expected = {"emb.weight": (V, C), "blocks.0.ln0.weight": (C,), "blocks.0.ln0.bias": (C,),
                "ln_out.weight": (C,), "ln_out.bias": (C,), "head.weight": (V, C)}
    for i in range(L):
        b = f"blocks.{i}."
        for n in ("ln1", "ln2", "att.ln_x"):
            expected[b + n + ".weight"] = expected[b + n + ".bias"] = (C,)
        for n in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "v0", "k_k", "k_a"):
            expected[b + "att." + n] = (1, 1, C)
        for n in "wavg":
            d = sd[b + f"att.{n}1"].shape[1]
            expected[b + f"att.{n}1"] = (C, d)
            expected[b + f"att.{n}2"] = (d, C)
        expected[b + "att.r_k"] = (H, N)
        for n in ("receptance", "key", "value", "output"):
            expected[b + f"att.{n}.weight"] = (C, C)
        expected[b + "ffn.x_k"] = (1, 1, C)
        expected[b + "ffn.key.weight"] = (4 * C, C)
        expected[b + "ffn.value.weight"] = (C, 4 * C)
    assert set(sd) == set(expected)
    for k, shape in expected.items():
        assert tuple(sd[k].shape) == shape, k


def test_tokenizer(tok, sd):
    assert tok.get_vocab_size() == sd["emb.weight"].shape[0]
    assert tok.token_to_id(lib.EOT_TOKEN) == 0
    assert tok.decode([0]) == ""
    text = 'He said, "Hello there."\n\nShe smiled.'
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert "".join(tok.decode([i]) for i in ids) == text  # single-token decode keeps the spaces


def test_split_is_deterministic_and_disjoint(split):
    train, held = split
    assert len(held) == round(0.05 * (len(train) + len(held)))
    assert not set(held) & set(train)
    assert (train, held) == lib.split_passages(lib.load_passages())


def test_wkv7_manual_backward_matches_autograd():
    torch.manual_seed(0)
    B, T, C, H = 2, 7, 8, 2
    xs = [torch.randn(B, T, C, dtype=torch.double) for _ in range(6)]
    xs[1] = torch.rand(B, T, C, dtype=torch.double)
    s0 = torch.randn(B, H, 4, 4, dtype=torch.double)
    grads = []
    for f in (lib.wkv7, lib.wkv7_reference):
        ins = [x.clone().requires_grad_() for x in xs] + [s0.clone().requires_grad_()]
        y, s = f(*ins[:6], H, ins[6])
        ((y * y).sum() + (s * s0).sum()).backward()
        grads.append([y.detach(), s.detach()] + [i.grad for i in ins])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def ours_fp32(heldout_seqs):
    from rwkv.model import RWKV

    model = RWKV(lib.MODEL_PATH[:-4], "cpu fp32")
    out = []
    for s in heldout_seqs:
        logits, _ = model.forward(list(s[:-1]), None, full_output=True)
        out.append(logits.float())
    return out


def test_ours_perplexity_far_below_unigram(ours_fp32, heldout_seqs, unigram):
    ppl = ppl_of(ours_fp32, heldout_seqs)
    assert ppl < 0.5 * unigram, (ppl, unigram)


def test_ours_matches_training_model(sd, ours_fp32, heldout_seqs):
    model = lib.TinyRWKV7.from_state_dict(sd).eval()
    with torch.no_grad():
        for logits, s in zip(ours_fp32[:2], heldout_seqs[:2]):
            ref = model(torch.tensor([s[:-1]]))[0][0]
            assert (logits - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_ours_int8_close_to_fp32(ours_fp32, heldout_seqs):
    from rwkv.model import RWKV

    model = RWKV(lib.MODEL_PATH[:-4], "cpu fp32i8")
    seqs = heldout_seqs[:3]
    i8 = [model.forward(list(s[:-1]), None, full_output=True)[0].float() for s in seqs]
    p32, p8 = ppl_of(ours_fp32[:3], seqs), ppl_of(i8, seqs)
    assert abs(p8 - p32) < 0.05 * p32, (p8, p32)


def test_upstream_logits_equal_training_model(sd, heldout_seqs):
    sys.path.insert(0, REPO)
    from tests.upstream import run_upstream, upstream_skip_reason

    reason = upstream_skip_reason()
    if reason:
        pytest.skip(reason)
    s = heldout_seqs[0]
    res = run_upstream(lib.MODEL_PATH, "cpu fp32", [{"tokens": list(s[:-1]), "state": "none",
                                                      "full_output": True}])
    up = res[0]["logits"].float()
    model = lib.TinyRWKV7.from_state_dict(sd).eval()
    with torch.no_grad():
        ref = model(torch.tensor([s[:-1]]))[0][0]
    assert (up - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
