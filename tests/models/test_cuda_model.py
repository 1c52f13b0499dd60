"""The whole model on CUDA: every version against our CPU fp32 logits, the CUDA strategies (fp32, fp16,
bf16, int8, CPU offload, streaming), the opt-in CUDA-graph decode path against the plain path, state
placement, and compiled vs reference kernels on CUDA. Plus the CPU-side contract of ``cuda_graph``.

Every CUDA test is marked ``cuda`` and skipped (with the reason) without a GPU; the tests at the end
(``test_cpu_*``) run everywhere.

Tolerances (errors are relative: max |a - b| / max(1, max |b|), b being the fp32 result):

* ``cuda fp32`` vs ``cpu fp32``: 1e-4. Both compute in fp32; only summation order differs (cuBLAS vs
  CPU BLAS, the kernels' reduction order), worth a few fp32 ulps per layer (measured on CPU kernels
  vs references: ~1e-6).
* fp16/bf16 activations (flash-attention's rule): the error of our CUDA path against the CPU fp32
  "twin" (the same strategy in fp32: ``cpu fp32``, or ``cpu fp32i8`` for int8 so quantization error
  cancels) must be at most twice the error of the pure-torch reference path run in the same low
  precision on the same device (``kernels="reference"``), plus a floor of 2 ulps of the activation
  dtype (2 * 2^-10 for fp16, 2 * 2^-7 for bf16) for cases where the reference happens to be very
  close. So that both cannot be wrong together, the reference's own error is capped at about 3x what
  the CPU low-precision paths show for these seeded models (measured: cpu fp16 <= 0.0032, cpu bf16
  <= 0.029, cpu fp16i8 vs cpu fp32i8 <= 0.0101, cpu bf16i8 vs cpu fp32i8 <= 0.084): ``REF_CAP``.
* CUDA graph vs the plain CUDA path: the graph replays the same kernels on the same inputs, so the
  results should be bit-identical; the tolerance, 2 ulps of the activation dtype at the logits'
  scale (1e-5 relative for fp32: a reordered fp32 sum of a few hundred terms, over two layers), only
  allows for a cuBLAS algorithm chosen differently under capture. A stale input, a wrong state or a missed copy moves logits by O(1), far beyond it.
"""

from __future__ import annotations

import pytest
import torch

from rwkv.model import RWKV, StateError, _host_copy
from rwkv.models.common import concrete_device
from rwkv.models.cuda_graph import graph_device
from rwkv.strategy import parse_strategy, plan_layers
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

HAS_CUDA = torch.cuda.is_available()

VERSIONS = ("4", "5.0", "5.1", "5.2", "6", "7")
CFG = dict(n_layer=2, n_embd=128, vocab=512, head_size=64, seed=0)
TOKENS = [3, 17, 250, 9, 511, 42, 7, 100]  # 6 prefill tokens, then 2 one-token steps

# Our CUDA strategy -> (activation dtype of the CUDA layers, the CPU fp32 strategy with the same math).
STRATEGIES = {
    "cuda fp32": (torch.float32, "cpu fp32"),
    "cuda fp16": (torch.float16, "cpu fp32"),
    "cuda bf16": (torch.bfloat16, "cpu fp32"),
    "cuda fp16i8": (torch.float16, "cpu fp32i8"),
    "cuda bf16i8": (torch.bfloat16, "cpu fp32i8"),
    "cuda fp16i8 *1 -> cpu fp32": (torch.float16, "cpu fp32i8 *1 -> cpu fp32"),
    "cuda fp16 *1+": (torch.float16, "cpu fp32"),  # layer 0 stored, layer 1 streamed per call
    "cuda fp16i8 *1+": (torch.float16, "cpu fp32i8"),  # int8 streamed from pinned column-major copies
}
GRAPH_STRATEGIES = ("cuda fp32", "cuda fp16", "cuda bf16", "cuda fp16i8", "cuda bf16i8")
EPS = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
REF_CAP = {(torch.float16, False): 0.01, (torch.bfloat16, False): 0.08,
           (torch.float16, True): 0.03, (torch.bfloat16, True): 0.25}
FP32_TOL = 1e-4


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_model")
    return {v: str(save_checkpoint(d / f"v{v}.pth", make_checkpoint(v, **CFG))) for v in VERSIONS}


def run_cases(model) -> dict:
    """Sequence, one token chained twice, and full_output: every result the tests compare."""
    seq, st = model.forward(TOKENS[:6], None)
    one1, st = model.forward([TOKENS[6]], st)
    one2, st = model.forward([TOKENS[7]], st)
    full, _ = model.forward(TOKENS[:6], None, full_output=True)
    return {"seq": seq, "one1": one1, "one2": one2, "full": full, "state": st}


_cpu_cache: dict = {}


def cpu_results(paths, version, strategy) -> dict:
    key = (version, strategy)
    if key not in _cpu_cache:
        _cpu_cache[key] = run_cases(RWKV(paths[version], strategy, verbose=False))
    return _cpu_cache[key]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert a.shape == b.shape
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


LOGITS = ("seq", "one1", "one2", "full")


# ------------------------------------------------------------------------ CUDA vs CPU fp32

@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("v", VERSIONS)
def test_cuda_matches_cpu_fp32(paths, v, strategy):
    atype, twin = STRATEGIES[strategy]
    want = cpu_results(paths, v, twin)
    ours = run_cases(RWKV(paths[v], strategy, verbose=False))
    for case in LOGITS:
        assert ours[case].dtype == torch.float32, case
        assert ours[case].shape == want[case].shape, case
    if atype == torch.float32:
        for case in LOGITS:
            assert rel_err(ours[case], want[case]) <= FP32_TOL, case
        for a, b in zip(ours["state"], want["state"]):
            assert rel_err(a, b) <= FP32_TOL
        return
    ref = run_cases(RWKV(paths[v], strategy, verbose=False, kernels="reference"))
    cap = REF_CAP[(atype, "i8" in strategy)]
    for case in LOGITS:
        e_ref = rel_err(ref[case], want[case])
        e_ours = rel_err(ours[case], want[case])
        assert e_ref <= cap, f"{case}: the {atype} reference path itself is off by {e_ref:.4f} > {cap}"
        assert e_ours <= 2 * e_ref + 2 * EPS[atype], \
            f"{case}: error {e_ours:.5f} vs fp32, reference path in {atype}: {e_ref:.5f}"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("strategy", ["cuda fp16", "cuda bf16i8", "cuda fp16i8 *1 -> cpu fp32",
                                      "cuda fp16 *1+"])
@pytest.mark.parametrize("v", ["4", "5.2", "7"])
def test_state_stays_on_its_devices(paths, v, strategy):
    m = RWKV(paths[v], strategy, verbose=False)
    per = 5 if v == "4" else 3
    logits, st = m.forward(TOKENS[:3], None)
    logits, st = m.forward([TOKENS[3]], st)
    head = torch.device(m.strategy[-1].device)
    assert logits.device.type == head.type and logits.dtype == torch.float32
    current = torch.cuda.current_device()
    for idx, t in enumerate(st):
        dd = m.strategy[idx // per]
        want = torch.device(dd.device)
        if want.type == "cuda" and want.index is None:  # 'cuda' is the device current at load
            want = torch.device("cuda", current)
        assert t.device == want, (idx, t.device, dd.device)
        shift = idx % per in (0, per - 1)
        assert t.dtype == (dd.atype if shift else torch.float32), idx
    # 'cuda' and 'cuda:N' name the same device: a state moved to the explicit index is accepted.
    moved = [t.to(f"cuda:{current}") if t.is_cuda else t for t in st]
    m.forward([TOKENS[4]], moved)
    if any(t.is_cuda for t in st):  # a CUDA layer's state on the CPU is refused, and says where
        wrong = [t.cpu() for t in st]
        with pytest.raises(StateError, match="expected cuda"):
            m.forward([TOKENS[4]], wrong)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("strategy", ["cuda fp32", "cuda bf16", "cuda fp16i8"])
@pytest.mark.parametrize("v", VERSIONS)
def test_compiled_and_reference_kernels_agree_on_cuda(paths, v, strategy):
    """kernels="compiled" raises (failing the test) when the CUDA build lacks a kernel: on a GPU
    machine that means the build is broken, not that the test does not apply."""
    atype, twin = STRATEGIES[strategy]
    comp = run_cases(RWKV(paths[v], strategy, verbose=False, kernels="compiled"))
    ref = run_cases(RWKV(paths[v], strategy, verbose=False, kernels="reference"))
    want = cpu_results(paths, v, twin)
    for case in LOGITS:
        if atype == torch.float32:
            assert rel_err(comp[case], ref[case]) <= FP32_TOL, case
        else:  # they may differ by their rounding: bounded by the low-precision error itself
            bound = 2 * rel_err(ref[case], want[case]) + 2 * EPS[atype]
            assert rel_err(comp[case], ref[case]) <= bound, case


# --------------------------------------------------------------------------- CUDA graphs

def _graph_tol(strategy) -> float:
    atype = STRATEGIES[strategy][0]
    return 1e-5 if atype == torch.float32 else 2 * EPS[atype]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("strategy", GRAPH_STRATEGIES)
@pytest.mark.parametrize("v", VERSIONS)
def test_cuda_graph_equals_plain_path(paths, v, strategy):
    plain = RWKV(paths[v], strategy, verbose=False)
    graph = RWKV(paths[v], strategy, verbose=False, cuda_graph=True)
    assert graph.cuda_graph is True and plain.cuda_graph is False
    tol = _graph_tol(strategy)
    # Prefill (sequence calls take the plain path in both models: identical kernels and inputs).
    lp, sp = plain.forward(TOKENS[:4], None)
    lg, sg = graph.forward(TOKENS[:4], None)
    assert not graph._graph.captured, "a sequence call must not capture the graph"
    assert rel_err(lg, lp) <= tol
    # Decode token by token: the first call captures, the rest replay the same graph.
    captured = None
    for tok in TOKENS[4:] + TOKENS[:3]:
        orig, before = list(sg), [t.clone() for t in sg]
        lp, sp = plain.forward([tok], sp)
        lg2, sg2 = graph.forward([tok], sg)
        assert graph._graph.captured
        captured = captured or graph._graph.graph
        assert graph._graph.graph is captured, "the graph must be captured once, then replayed"
        for a, b in zip(orig, before):  # the caller's tensors are never written
            assert torch.equal(a, b)
        assert rel_err(lg2, lp) <= tol, tok
        assert lg2.dtype == torch.float32 and lg2.shape == lp.shape
        for a, b in zip(sg2, sp):
            assert a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
            assert rel_err(a, b) <= tol
        if v != "7":  # classic versions return the caller's list (upstream), filled with new tensors
            assert sg2 is sg
        sg = list(sg2)
        lg = lg2
    # Results returned earlier are not overwritten by later replays (they are clones).
    keep = lg.clone()
    graph.forward([TOKENS[0]], sg)
    assert torch.equal(lg, keep)
    # One token with full_output, a fresh state (None), and a sequence after the graph ran.
    for tokens, state, full in (([TOKENS[1]], sp, True), ([TOKENS[2]], None, False),
                                (TOKENS[:5], sp, False), (TOKENS[:5], sp, True)):
        a, _ = plain.forward(tokens, list(state) if state is not None else None, full_output=full)
        b, _ = graph.forward(tokens, list(state) if state is not None else None, full_output=full)
        assert a.shape == b.shape and rel_err(b, a) <= tol


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("v", ["5.2", "7"])
def test_cuda_graph_snapshots_and_two_models(paths, v):
    """Two graph models (each with its own static buffers) interleaved, and one state replayed twice
    (a snapshot) gives the same result twice."""
    a = RWKV(paths[v], "cuda fp16", verbose=False, cuda_graph=True)
    b = RWKV(paths[v], "cuda fp16i8", verbose=False, cuda_graph=True)
    _, sa = a.forward(TOKENS[:3], None)
    _, sb = b.forward(TOKENS[:3], None)
    snap = list(sa)
    la1, _ = a.forward([5], list(snap))
    lb1, _ = b.forward([5], list(sb))
    la2, _ = a.forward([5], list(snap))
    lb2, _ = b.forward([5], list(sb))
    assert torch.equal(la1, la2) and torch.equal(lb1, lb2)
    assert not torch.equal(la1, lb1)  # int8 vs dense: different models, different numbers
    lc, _ = a.forward([6], list(snap))
    assert not torch.equal(lc, la1)  # the token reaches the graph


# ------------------------------------------------------------------- CPU-side contract

@pytest.fixture(scope="module")
def v7_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_graph_cpu")
    return str(save_checkpoint(d / "v7.pth", make_checkpoint("7", n_layer=2, n_embd=64, vocab=50,
                                                             head_size=32, seed=1)))


@pytest.mark.parametrize("strategy, why", [
    ("cpu fp32", r"puts layer 0 on 'cpu'"),
    ("cuda fp16 *2 -> cpu fp32", r"puts the head on 'cpu'"),
    ("cuda fp16 *1 -> cpu fp32 *1", r"puts layer 1 on 'cpu'"),
    ("cuda fp16 *1+", r"layer 1 is streamed \('\*N\+'\)"),
    ("cuda:0 fp16 *1 -> cuda:1 fp16", r"uses several \(cuda:0, cuda:1\)"),
])
def test_cpu_cuda_graph_rejects_unsupported_strategies(v7_path, strategy, why):
    """Documented choice: cuda_graph=True with a strategy it cannot capture raises ValueError (saying
    why) when the model is built, before any weight is placed, so it runs without a GPU too."""
    with pytest.raises(ValueError, match=r"cuda_graph=True .*" + why):
        RWKV(v7_path, strategy, verbose=False, cuda_graph=True)


@pytest.mark.parametrize("strategy, n_layer", [
    ("cuda fp16", 2), ("cuda:0 bf16i8", 3), ("cuda fp16 *1 -> cuda:0 fp16", 2),
    ("cuda fp16 *2+", 2),  # every layer stored; the head slot's stream flag never applies to the head
])
def test_cuda_graph_device_accepts_one_device_without_streaming(strategy, n_layer):
    plan = plan_layers(parse_strategy(strategy), n_layer)
    assert graph_device(plan, strategy).type == "cuda"


def test_cpu_cuda_graph_default_off_and_type_checked(v7_path):
    m = RWKV(v7_path, "cpu fp32", verbose=False)
    assert m.cuda_graph is False
    a, s = m.forward([1, 2], None)
    b, _ = m.forward([3], s)
    assert b.shape == (50,)
    off = RWKV(v7_path, "cpu fp32", verbose=False, cuda_graph=False)
    torch.testing.assert_close(off.forward([1, 2], None)[0], a, rtol=0, atol=0)
    with pytest.raises(TypeError, match="cuda_graph must be True or False"):
        RWKV(v7_path, "cpu fp32", verbose=False, cuda_graph="yes")
    with pytest.raises(TypeError):
        RWKV(v7_path, "cpu fp32", False, None, None, None, True)  # keyword-only


def test_cpu_streamed_host_copy_keeps_column_major():
    """Streamed matrices keep the model's column-major (in, out) layout in host memory, so the
    per-call device copy is what mm8/gemm_fp16 read in place (no per-call relayout on the GPU)."""
    base = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    col = base.t()  # (in=3, out=4) view, column-major like the converted weights
    out = _host_copy(col, pin=False)
    assert out.stride() == col.stride() and torch.equal(out, col)
    row = _host_copy(base, pin=False)
    assert row.is_contiguous() and torch.equal(row, base)
    odd = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]  # neither layout: made dense
    assert _host_copy(odd, pin=False).is_contiguous()
    assert concrete_device("cpu") == torch.device("cpu")
