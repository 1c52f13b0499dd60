"""RWKV-7 beyond the common case on CUDA: DeepEmbed checkpoints in every CUDA strategy (their tables
in CPU memory by default, on the GPU with ``cuda_graph=True``), the CUDA-graph decode of a DeepEmbed
model, ``forward_one_alt`` of a DeepEmbed model captured in a user's CUDA graph, and head sizes 32,
128 and 256. Every test is marked ``cuda`` (skipped without a GPU).

Tolerances and the rule for fp16/bf16 are tests/models/test_cuda_model.py's (its docstring says
why): fp32 1e-4 of the logits' scale against ``cpu fp32``; low precision at most twice the error
of the pure-torch reference path run in the same precision on the same device, plus 2 ulps; the
CUDA graph against the plain path 2 ulps of the activation dtype.
"""

from __future__ import annotations

import pytest
import torch

from rwkv.model import RWKV
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint
from tests.models.test_cuda_model import EPS, FP32_TOL, LOGITS, REF_CAP, STRATEGIES, TOKENS, _graph_tol, \
    rel_err, run_cases

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]

CFG = dict(n_layer=2, n_embd=128, vocab=512, seed=4)
HEAD_SIZES = (32, 128, 256)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_v7")
    out = {"de": str(save_checkpoint(d / "de.pth", make_checkpoint("7", deep_embed=True, **CFG)))}
    for n in HEAD_SIZES:
        out[n] = str(save_checkpoint(d / f"hs{n}.pth", make_checkpoint(
            "7", n_layer=2, n_embd=max(256, 2 * n), vocab=512, head_size=n, seed=n)))
    return out


def _check_strategy(path, strategy):
    atype, twin = STRATEGIES[strategy]
    want = run_cases(RWKV(path, twin, verbose=False))
    ours = run_cases(RWKV(path, strategy, verbose=False))
    if atype == torch.float32:
        for case in LOGITS:
            assert rel_err(ours[case], want[case]) <= FP32_TOL, case
        for a, b in zip(ours["state"], want["state"]):
            assert rel_err(a, b) <= FP32_TOL
        return
    ref = run_cases(RWKV(path, strategy, verbose=False, kernels="reference"))
    cap = REF_CAP[(atype, "i8" in strategy)]
    for case in LOGITS:
        e_ref, e_ours = rel_err(ref[case], want[case]), rel_err(ours[case], want[case])
        assert e_ref <= cap, f"{case}: the {atype} reference path itself is off by {e_ref:.4f} > {cap}"
        assert e_ours <= 2 * e_ref + 2 * EPS[atype], f"{case}: {e_ours:.5f} vs reference {e_ref:.5f}"


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_deep_embed_matches_cpu_fp32(paths, strategy):
    _check_strategy(paths["de"], strategy)


def test_deep_embed_tables_stay_in_cpu_memory(paths):
    m = RWKV(paths["de"], "cuda fp16", verbose=False)
    assert m.w["blocks.0.ffn.s_emb.weight"].device.type == "cpu"
    assert m.w["blocks.0.ffn.s1"].device.type == "cuda"
    g = RWKV(paths["de"], "cuda fp16", verbose=False, cuda_graph=True)
    assert g.w["blocks.0.ffn.s_emb.weight"].device.type == "cuda"


@pytest.mark.parametrize("strategy", ["cuda fp32", "cuda fp16", "cuda bf16i8"])
def test_deep_embed_cuda_graph_equals_plain_path(paths, strategy):
    plain = RWKV(paths["de"], strategy, verbose=False)
    graph = RWKV(paths["de"], strategy, verbose=False, cuda_graph=True)
    tol = _graph_tol(strategy)
    _, sp = plain.forward(TOKENS[:4], None)
    _, sg = graph.forward(TOKENS[:4], None)
    for tok in TOKENS[4:] + TOKENS[:3]:  # different tokens through one captured graph
        lp, sp = plain.forward([tok], sp)
        lg, sg = graph.forward([tok], sg)
        assert graph._graph.captured and rel_err(lg, lp) <= tol, tok
        for a, b in zip(sg, sp):
            assert rel_err(a, b) <= tol


def test_deep_embed_forward_one_alt_in_a_users_graph(paths):
    # Upstream's README capture, with the token id DeepEmbed needs as a device tensor.
    model = RWKV(paths["de"], "cuda fp16", verbose=False, cuda_graph=True)
    state = model.generate_zero_state()
    static_input = torch.empty((model.n_embd), device="cuda", dtype=torch.half)
    static_token = torch.zeros(1, dtype=torch.long, device="cuda")
    static_state_in = [torch.empty_like(x, device="cuda") for x in state]
    model.forward_one_alt(static_input, static_state_in, token=static_token)  # warm-up
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_output, static_state_out = model.forward_one_alt(static_input, static_state_in, token=static_token)
    plain = RWKV(paths["de"], "cuda fp16", verbose=False)
    want_state = plain.generate_zero_state()
    for n in range(len(state)):
        static_state_in[n].copy_(state[n])
    for tok in TOKENS:
        static_input.copy_(model.z["emb.weight"][tok])
        static_token.fill_(tok)
        g.replay()
        for n in range(len(state)):
            static_state_in[n].copy_(static_state_out[n])
        want, want_state = plain.forward([tok], want_state)
        assert rel_err(static_output, want) <= _graph_tol("cuda fp16"), tok


@pytest.mark.parametrize("strategy", ["cuda fp32", "cuda fp16", "cuda bf16i8", "cuda fp16 *1+"])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_head_size_matches_cpu_fp32(paths, head_size, strategy):
    _check_strategy(paths[head_size], strategy)


@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_head_size_cuda_graph_equals_plain_path(paths, head_size):
    plain = RWKV(paths[head_size], "cuda fp16", verbose=False)
    graph = RWKV(paths[head_size], "cuda fp16", verbose=False, cuda_graph=True)
    sp = sg = None
    for tok in TOKENS:
        lp, sp = plain.forward([tok], sp)
        lg, sg = graph.forward([tok], sg)
        assert rel_err(lg, lp) <= _graph_tol("cuda fp16"), tok
