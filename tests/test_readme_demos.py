"""Upstream 0.8.32's README Python demos, as a user runs them on our package: the same calls in the same
order, with a local model path (a seeded random RWKV-7 with the World vocabulary's 65536 tokens) and
``cpu fp32`` where no GPU is present. Where the demo only prints, the test checks what it shows:
the README's "same result as above", and that the CUDA-graph loop decodes what the plain loop does
(greedy sampling: TOP_P = 0).

Demo 1: RWKV + PIPELINE + PIPELINE_ARGS, ``pipeline.generate`` with a callback, then ``forward`` in
sequence and RNN mode. Demo 2 ("Faster decoding"): a plain decode loop with ``forward(token,
state)``, then ``forward_one_alt`` over static buffers, captured in a ``torch.cuda.CUDAGraph`` on
``cuda fp16`` (test marked cuda), or called directly on the CPU.
"""

import pytest
import torch

from rwkv.model import RWKV
from rwkv.utils import PIPELINE, PIPELINE_ARGS
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

PROMPT = "User: simulate SpaceX mars landing using python\n\nAssistant: <think"
LENGTH_PER_TRIAL = 64  # the README uses 256; the calls are the same


@pytest.fixture(scope="module")
def model_name(tmp_path_factory):
    path = tmp_path_factory.mktemp("readme") / "rwkv7-demo.pth"
    save_checkpoint(path, make_checkpoint("7", n_layer=2, n_embd=64, vocab=65536, seed=2))
    return str(path)[:-len(".pth")]  # the README passes the name without .pth


@pytest.fixture()
def demo_env(monkeypatch):
    # set before import RWKV, as the README does; accepted and unused here
    monkeypatch.setenv("RWKV_V7_ON", "1")
    monkeypatch.setenv("RWKV_JIT_ON", "1")
    monkeypatch.setenv("RWKV_CUDA_ON", "0")


def test_demo_1(model_name, demo_env, capsys):
    model = RWKV(model=model_name, strategy="cpu fp32")
    pipeline = PIPELINE(model, "rwkv_vocab_v20230424")
    ctx = "User: simulate SpaceX mars landing using python\n\nAssistant: <think"
    print(ctx, end="")
    printed = []

    def my_print(s):
        printed.append(s)
        print(s, end="", flush=True)

    args = PIPELINE_ARGS(temperature=1.0, top_p=0.5, top_k=100, alpha_frequency=0.0, alpha_presence=0.0,
                         alpha_decay=0.997, token_ban=[], token_stop=[], chunk_len=256)
    text = pipeline.generate(ctx, token_count=500, args=args, callback=my_print)
    print("\n")
    assert "".join(printed) == text and text

    out, state = model.forward([187, 510, 1563, 310, 247], None)
    first = out.detach().cpu().numpy()
    out, state = model.forward([187, 510], None)
    out, state = model.forward([1563], state)
    out, state = model.forward([310, 247], state)
    second = out.detach().cpu().numpy()
    print(first, second)
    # "same result as above"
    torch.testing.assert_close(torch.from_numpy(second), torch.from_numpy(first), rtol=1e-5, atol=1e-5)


def _slow_loop(model, pipeline, sync):
    all_tokens = []
    out, state = model.forward(pipeline.encode(PROMPT), None)
    for _ in range(LENGTH_PER_TRIAL):
        token = pipeline.sample_logits(out, temperature=1.0, top_p=0.0)
        all_tokens += [token]
        pipeline.decode(all_tokens)
        sync()
        out, state = model.forward(token, state)
        sync()
    return all_tokens


def test_demo_2_on_cpu(model_name, demo_env):
    # The demo's calls on cpu fp32; forward_one_alt called where the GPU demo replays its graph.
    model = RWKV(model=model_name, strategy="cpu fp32")
    pipeline = PIPELINE(model, "rwkv_vocab_v20230424")
    slow = _slow_loop(model, pipeline, lambda: None)

    all_tokens = []
    state = model.generate_zero_state()
    static_input = torch.empty((model.n_embd), device="cpu", dtype=torch.float32)
    static_state_in = [torch.empty_like(x, device="cpu") for x in state]
    static_output = torch.empty((model.args.vocab_size), device="cpu", dtype=torch.float32)
    out, state = model.forward(pipeline.encode(PROMPT), state)
    for i in range(len(state)):
        static_state_in[i].copy_(state[i])
    static_output.copy_(out)
    for _ in range(LENGTH_PER_TRIAL):
        token = pipeline.sample_logits(static_output, temperature=1.0, top_p=0.0)
        all_tokens += [token]
        static_input.copy_(model.z["emb.weight"][token])
        static_output, static_state_out = model.forward_one_alt(static_input, static_state_in)
        for n in range(len(state)):
            static_state_in[n].copy_(static_state_out[n])
    assert all_tokens == slow


@pytest.mark.cuda
def test_demo_2_cuda_graph(model_name, demo_env):
    # The README's code, line for line (timing and printing left out).
    model = RWKV(model=model_name, strategy="cuda fp16")
    pipeline = PIPELINE(model, "rwkv_vocab_v20230424")
    slow = _slow_loop(model, pipeline, torch.cuda.synchronize)

    all_tokens = []
    state = model.generate_zero_state()
    static_input = torch.empty((model.n_embd), device="cuda", dtype=torch.half)
    static_state_in = [torch.empty_like(x, device="cuda") for x in state]
    static_state_out = [torch.empty_like(x, device="cuda") for x in state]
    static_output = torch.empty((model.args.vocab_size), device="cuda", dtype=torch.half)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_output, static_state_out = model.forward_one_alt(static_input, static_state_in)
    out, state = model.forward(pipeline.encode(PROMPT), state)
    for i in range(len(state)):
        static_state_in[i].copy_(state[i])
    static_output.copy_(out)
    for _ in range(LENGTH_PER_TRIAL):
        token = pipeline.sample_logits(static_output, temperature=1.0, top_p=0.0)
        all_tokens += [token]
        torch.cuda.synchronize()
        static_input.copy_(model.z["emb.weight"][token])
        g.replay()
        for n in range(len(state)):
            static_state_in[n].copy_(static_state_out[n])
        torch.cuda.synchronize()
    assert all_tokens == slow
