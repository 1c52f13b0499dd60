"""DeepEmbed RWKV-7 checkpoints (rwkv/deep_embed.py) in our package: detection and validation, every
CPU strategy, sequence vs one-token mode (the one-token step plan included), the gate's per-row
interface (rwkv/models/ffn.py), forward_one_alt, state tuning, conversion, PIPELINE and the CLI.
Upstream's numbers are compared in tests/test_compat_v7_extras.py."""

import os
import subprocess
import sys

import pytest
import torch

from rwkv import deep_embed
from rwkv.loading import CheckpointError, inspect_checkpoint
from rwkv.model import RWKV, TokenError, convert_checkpoint
from rwkv.utils import PIPELINE, PIPELINE_ARGS
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "models", "rwkv7-tiny", "tokenizer.json")  # 2048 tokens
CFG = dict(n_layer=2, n_embd=128, vocab=2048, seed=5)
TOKENS = [17, 3, 250, 2047, 0, 42, 7, 7, 1200, 5]


def _sd():
    return make_checkpoint("7", deep_embed=True, **CFG)


@pytest.fixture(scope="module")
def de_path(tmp_path_factory):
    return str(save_checkpoint(tmp_path_factory.mktemp("de") / "de.pth", _sd()))


@pytest.fixture(scope="module")
def fp32(de_path):
    return RWKV(de_path, "cpu fp32", verbose=False)


def _err(a, b):
    return float((a.float() - b.float()).abs().max())


def _token_by_token(model, tokens, state=None):
    outs = []
    for t in tokens:
        out, state = model.forward([t], state)
        outs.append(out)
    return torch.stack(outs), state


# ------------------------------------------------------------------------------ detection, keys
def test_detected_from_keys_without_environment(de_path, fp32, monkeypatch):
    monkeypatch.delenv("RWKV_DE_VERSION", raising=False)
    sd = torch.load(de_path, weights_only=True)
    assert inspect_checkpoint(sd).deep_embed and fp32.info.deep_embed
    plain = make_checkpoint("7", **CFG)
    assert not deep_embed.is_deep_embed(plain) and not inspect_checkpoint(plain).deep_embed


def test_plain_v7_with_the_variable_set_loads_normally(tmp_path, monkeypatch):
    path = str(save_checkpoint(tmp_path / "plain.pth", make_checkpoint("7", **CFG)))
    monkeypatch.delenv("RWKV_DE_VERSION", raising=False)
    want, _ = RWKV(path, "cpu fp32", verbose=False).forward(TOKENS, None)
    monkeypatch.setenv("RWKV_DE_VERSION", "1")
    m = RWKV(path, "cpu fp32", verbose=False)
    got, _ = m.forward(TOKENS, None)
    assert not m.info.deep_embed and torch.equal(got, want)


def test_merged_table_is_upstreams_formula(fp32):
    # s_emb + LN0(emb) @ s_emb_x^T, with emb already LN0-folded (model.z["emb.weight"]).
    sd = _sd()
    for i in range(CFG["n_layer"]):
        want = sd[f"blocks.{i}.ffn.s_emb.weight"] + fp32.z["emb.weight"] @ sd[f"blocks.{i}.ffn.s_emb_x.weight"].t()
        torch.testing.assert_close(fp32.w[f"blocks.{i}.ffn.s_emb.weight"], want, rtol=1e-5, atol=1e-5)
        assert f"blocks.{i}.ffn.s_emb_x.weight" not in fp32.w  # merged, then unused


@pytest.mark.parametrize("missing", [f"blocks.1.{k}" for k in deep_embed.RAW_KEYS]
                         + ["blocks.0.ffn.s_emb_x.weight"])
def test_incomplete_deep_embed_keys_are_named(missing):
    sd = _sd()
    del sd[missing]
    with pytest.raises(CheckpointError, match=missing.replace(".", r"\.")):
        inspect_checkpoint(sd)


def test_misshaped_table_is_named():
    sd = _sd()
    sd["blocks.0.ffn.s_emb.weight"] = sd["blocks.0.ffn.s_emb.weight"][:, :512]
    with pytest.raises(CheckpointError, match=r"blocks\.0\.ffn\.s_emb\.weight has shape \[2048, 512\], expected \[2048, 1024\]"):
        inspect_checkpoint(sd)


def test_deep_embed_keys_in_another_version_are_refused():
    sd = make_checkpoint("6", n_layer=2, n_embd=64, vocab=100)
    sd["blocks.0.ffn.s_emb.weight"] = torch.zeros(100, 1024)
    with pytest.raises(CheckpointError, match="DeepEmbed exists only for RWKV-7"):
        inspect_checkpoint(sd)


# ------------------------------------------------------------------------------ modes, strategies
def test_sequence_equals_token_by_token(fp32):
    seq, _ = fp32.forward(TOKENS, None, full_output=True)
    one, _ = _token_by_token(fp32, TOKENS)
    torch.testing.assert_close(one, seq, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu bf16", "cpu fp32i8"])
def test_one_token_plan_serves_every_token(de_path, strategy):
    # The one-token step plan takes the token id as an input (its tables' rows are gathered in
    # the plan): bit for bit the op-by-op results over many different tokens and states.
    graph = RWKV(de_path, strategy, verbose=False)
    plain = RWKV(de_path, strategy, verbose=False, cpu_plan=False)
    a, sa = _token_by_token(graph, TOKENS)
    b, sb = _token_by_token(plain, TOKENS)
    assert graph._rt.plans.get(1, False) is not None and graph._rt.plans.failed is None
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(sa, sb))


@pytest.mark.parametrize("strategy", ["cpu fp32i8", "cpu fp32 *1 -> cpu bf16", "cpu bf16i8 *1 -> cpu fp32",
                                      "cpu fp32 *1+ -> cpu fp32"])
def test_other_strategies_close_to_fp32(de_path, fp32, strategy):
    # int8 weights carry ~0.4% relative error per matrix, bf16 ~0.4% per rounding (the DeepEmbed
    # tables and gate factors stay in the activation dtype).
    ref, _ = fp32.forward(TOKENS, None, full_output=True)
    m = RWKV(de_path, strategy, verbose=False)
    seq, _ = m.forward(TOKENS, None, full_output=True)
    one, _ = _token_by_token(m, TOKENS)
    for got in (seq, one):
        assert _err(got, ref) <= 0.05 * float(ref.abs().max()), strategy
        assert torch.corrcoef(torch.stack([got.flatten(), ref.flatten()]))[0, 1] > 0.999


def test_reference_kernels_match_compiled(de_path, fp32):
    ref = RWKV(de_path, "cpu fp32", verbose=False, kernels="reference")
    a, _ = ref.forward(TOKENS, None, full_output=True)
    b, _ = fp32.forward(TOKENS, None, full_output=True)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------ the gate's interface
def test_gate_is_row_independent(fp32):
    # What a batched engine relies on: rows of any origin in one call give each row's own gate.
    ffn = fp32._rt.ffn[1]
    g = torch.Generator().manual_seed(0)
    xf = torch.randn(6, CFG["n_embd"], generator=g)
    ids = torch.tensor([3, 2047, 3, 0, 99, 1500])
    both = ffn.deep_embed_gate(xf, ids)
    assert both.shape == (6, 4 * CFG["n_embd"]) and both.dtype == torch.float32
    for t in range(6):
        torch.testing.assert_close(both[t:t + 1], ffn.deep_embed_gate(xf[t:t + 1], ids[t:t + 1]),
                                   rtol=1e-5, atol=1e-5)
    # and it is upstream's formula: ((xf @ s1) @ E_t) @ s2 + s0
    sd, i = _sd(), 1
    E = fp32.w[f"blocks.{i}.ffn.s_emb.weight"][ids].view(6, 32, 32)
    want = ((xf @ sd[f"blocks.{i}.ffn.s1"]).unsqueeze(1) @ E).squeeze(1) @ sd[f"blocks.{i}.ffn.s2"] \
        + sd[f"blocks.{i}.ffn.s0"]
    torch.testing.assert_close(both, want, rtol=1e-5, atol=1e-5)


def test_channel_mix_needs_the_token_ids(fp32):
    ffn = fp32._rt.ffn[0]
    x, sx = torch.zeros(1, CFG["n_embd"]), torch.zeros(CFG["n_embd"])
    with pytest.raises(ValueError, match="DeepEmbed channel mix, which needs the token ids"):
        ffn(x, sx)
    with pytest.raises(ValueError, match="pass the ids of x's rows"):
        fp32._rt.run(x, fp32.generate_zero_state(), False)


@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu bf16"])
def test_batched_decoding_equals_separate_calls(de_path, strategy):
    # forward_batch and BatchDecoder (rwkv/engine.py) run the channel mix on rows of different
    # sequences: each row's gate from its own token. Tolerances as tests/test_batch.py's.
    from rwkv.engine import BatchDecoder

    m = RWKV(de_path, strategy, verbose=False)
    prompts = [TOKENS[:3], TOKENS[3:9], [1999], TOKENS[::-1]]
    logits, states = m.forward_batch(prompts)
    eng = BatchDecoder(m, max_batch=4, prefill_chunk=4)
    handles = [eng.add(p) for p in prompts]
    steps = [dict(zip(handles, feed)) for feed in ([5, 6, 7, 8], [100, 2000, 5, 5])]
    rows = {}
    while len(rows) < len(prompts):  # prefill until every sequence has its first logits
        rows.update(dict(eng.step({})))
    decoded = [[rows[h]] for h in handles]
    for feed in steps:
        for h, row in eng.step(feed):
            decoded[handles.index(h)].append(row.clone())
    for b, p in enumerate(prompts):
        want, st = m.forward(p, None)
        scale = max(float(want.abs().max()), 1.0)
        tol = 16 * 2 ** -8 * scale if "bf16" in strategy else 1e-5 * scale
        assert _err(logits[b], want) <= tol, f"forward_batch sequence {b}"
        assert all(_err(a, w) <= max(tol, 1e-5 * max(1.0, float(w.abs().max()))) for a, w in zip(states[b], st))
        for n, feed in enumerate([None] + steps):
            if feed is not None:
                want, st = m.forward([feed[handles[b]]], st)
            assert _err(decoded[b][n], want) <= tol, f"engine sequence {b} step {n}"


# ------------------------------------------------------------------------------ forward_one_alt
def test_forward_one_alt_chain_equals_forward(fp32):
    # Upstream's README loop (16 tokens from generate_zero_state), with the token id DeepEmbed needs.
    tokens = (TOKENS * 2)[:16]
    want, want_state = _token_by_token(fp32, tokens)
    state = fp32.generate_zero_state()
    outs = []
    for t in tokens:
        out, state = fp32.forward_one_alt(fp32.z["emb.weight"][t], state, token=t)
        outs.append(out)
    assert torch.equal(torch.stack(outs), want)
    assert all(torch.equal(a, b) for a, b in zip(state, want_state))


def test_forward_one_alt_errors(fp32):
    state = fp32.generate_zero_state()
    x = fp32.z["emb.weight"][3]
    with pytest.raises(ValueError, match="DeepEmbed model.*pass token=<id>"):
        fp32.forward_one_alt(x, state)
    with pytest.raises(TokenError, match="out of range"):
        fp32.forward_one_alt(x, state, token=CFG["vocab"])
    with pytest.raises(ValueError, match=r"x must be one embedding row.*\[128\]"):
        fp32.forward_one_alt(x[:5], state, token=3)
    with pytest.raises(ValueError, match="token must be an int"):
        fp32.forward_one_alt(x, state, token=3.0)


# ------------------------------------------------------------------------------ everything else
def test_state_tuning(de_path, fp32, tmp_path):
    m = RWKV(de_path, "cpu fp32", verbose=False)
    H, N = m.n_head, m.head_size
    g = torch.Generator().manual_seed(1)
    tuned = {f"blocks.{i}.att.time_state": torch.randn(H, N, N, generator=g) for i in range(m.n_layer)}
    torch.save(tuned, tmp_path / "state.pth")
    m.load_state_tuning(str(tmp_path / "state.pth"))
    zero = fp32.generate_zero_state()
    start = m.generate_zero_state()
    for i in range(m.n_layer):
        start[3 * i + 1] = tuned[f"blocks.{i}.att.time_state"].clone()
    want, _ = fp32.forward(TOKENS, start)
    got, _ = m.forward(TOKENS, None)
    assert torch.equal(got, want) and not torch.equal(got, fp32.forward(TOKENS, zero)[0])


def test_converted_file_loads_with_the_same_results(de_path, tmp_path):
    strategy = "cpu fp32 *1 -> cpu bf16i8"
    out = convert_checkpoint(de_path, strategy, str(tmp_path / "conv"))
    a, _ = RWKV(out, strategy, verbose=False).forward(TOKENS, None)
    b, _ = RWKV(de_path, strategy, verbose=False).forward(TOKENS, None)
    assert torch.equal(a, b)


def test_pipeline_generate_decodes_with_the_model(fp32):
    # Greedy (top_p=0, no penalties): PIPELINE.generate is the argmax loop over model.forward.
    pipeline = PIPELINE(fp32, TOKENIZER)
    args = PIPELINE_ARGS(temperature=1.0, top_p=0.0, alpha_frequency=0.0, alpha_presence=0.0, token_ban=[])
    text, final = pipeline.generate("Once upon a time", token_count=12, args=args, return_state=True)
    out, state = fp32.forward(pipeline.encode("Once upon a time"), None)
    tokens = []
    for _ in range(12):
        tokens.append(int(out.argmax()))
        out, state = fp32.forward([tokens[-1]], state)
    # (generate's text stops before tokens that do not decode to whole characters)
    assert text and pipeline.decode(tokens).startswith(text)
    assert all(torch.equal(a, b) for a, b in zip(final, state))


def test_cli_generate(de_path):
    cmd = [sys.executable, "-m", "rwkv", "generate", "--model", de_path, "--vocab", TOKENIZER,
           "--prompt", "Hello", "--tokens", "8", "--seed", "1"]
    runs = [subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                           timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.strip()
