"""The one-token CPU graph (rwkv/models/cpu_graph.py): the same logits and states as the op-by-op
path bit for bit, the caller's state untouched, the switches, and the safety nets that keep a
wrong trace from being used."""

import copy
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from rwkv import ops
from rwkv.model import RWKV
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

CFG = dict(n_layer=2, n_embd=64, vocab=100, head_size=32, seed=5)
VERSIONS = ("4", "5.2", "6", "7")


def compiled() -> bool:
    return ops.backend_report().splitlines()[0].startswith("compiled")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu_graph")
    return {v: str(save_checkpoint(d / f"v{v}.pth", make_checkpoint(v, **CFG))) for v in VERSIONS}


def decode(m, state, tokens):
    """Logits and state after each token (states copied: v4-v6 reuse the caller's list)."""
    out = []
    for t in tokens:
        logits, state = m.forward([t], state)
        state = list(state)
        out.append((logits, state))
    return out


@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
@pytest.mark.parametrize("v", VERSIONS)
def test_graph_equals_op_by_op(paths, v, strategy):
    if not compiled():
        pytest.skip("rwkv._C is not built")
    graph = RWKV(paths[v], strategy, verbose=False)
    plain = RWKV(paths[v], strategy, verbose=False, cpu_graph=False)
    assert graph._graph is not None and plain._graph is None
    _, s = plain.forward([1, 2, 3], None)
    tokens = [5, 7, 11, 13, 17, 19]  # past the executor's first (profiling) runs
    a = decode(graph, [t.clone() for t in s], tokens)
    b = decode(plain, [t.clone() for t in s], tokens)
    assert graph._graph.fn is not None and graph._graph.failed is None
    for (la, sa), (lb, sb) in zip(a, b):
        assert torch.equal(la, lb)
        assert len(sa) == len(sb) and all(torch.equal(x, y) for x, y in zip(sa, sb))
    # Sequences take the op-by-op path.
    la, _ = graph.forward([3, 4, 5], None)
    lb, _ = plain.forward([3, 4, 5], None)
    assert torch.equal(la, lb)


@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu bf16"])
@pytest.mark.parametrize("v", VERSIONS)
def test_graph_never_writes_the_callers_state(paths, v, strategy):
    if not compiled():
        pytest.skip("rwkv._C is not built")
    m = RWKV(paths[v], strategy, verbose=False)
    _, s = m.forward([1, 2], None)
    for t in (3, 4, 5):
        before = [x.clone() for x in s]
        _, new = m.forward([t], list(s))
        assert all(torch.equal(x, y) for x, y in zip(s, before))
        assert not any(x.data_ptr() == y.data_ptr() for x, y in zip(new, s))
        s = list(new)
    assert m._graph.fn is not None


@pytest.mark.parametrize("v", VERSIONS)
def test_every_form_of_one_token_decodes_alike_and_the_embedding_stays(paths, v):
    """An int and a list of one int take a path without an ids tensor (the embedding row as a
    view); a tensor and an array the general one: the same bits as the op-by-op model, and the
    embedding the rows are views of is never written."""
    if not compiled():
        pytest.skip("rwkv._C is not built")
    graph = RWKV(paths[v], "cpu fp32", verbose=False)
    plain = RWKV(paths[v], "cpu fp32", verbose=False, cpu_graph=False)
    emb = graph._rt.emb.clone()
    _, s = plain.forward([1, 2], None)
    want_logits, want_state = plain.forward([7], [t.clone() for t in s])
    for tok in (7, [7], (7,), torch.tensor([7]), np.array([7]), [np.int64(7)]):
        for _ in range(2):  # the first one-token call traces the graph, the second runs it
            logits, new = graph.forward(tok, [t.clone() for t in s])
            assert torch.equal(logits, want_logits)
            assert all(torch.equal(a, b) for a, b in zip(new, want_state))
    assert graph._graph.fn is not None
    assert torch.equal(graph._rt.emb, emb)


def test_deepcopy_of_a_model_traces_its_own_graph(paths):
    if not compiled():
        pytest.skip("rwkv._C is not built")
    m = RWKV(paths["7"], "cpu fp32", verbose=False)
    _, s = m.forward([1, 2], None)
    a, _ = m.forward([3], s)
    twin = copy.deepcopy(m)
    assert twin._graph.fn is None and twin._graph.rt is twin._rt
    with torch.no_grad():
        for t in twin.w.values():  # the copy's own weights: changing them changes only its results
            t.mul_(0.5)
    b, _ = twin.forward([3], s)
    c, _ = m.forward([3], s)
    assert twin._graph.fn is not None and torch.equal(a, c) and not torch.equal(a, b)


def test_graph_switches(paths, monkeypatch):
    if not compiled():
        pytest.skip("rwkv._C is not built")
    assert RWKV(paths["7"], "cpu fp32", verbose=False, cpu_graph=True)._graph is not None
    assert RWKV(paths["7"], "cpu fp32", verbose=False, kernels="reference")._graph is None
    monkeypatch.setenv("RWKV_CPU_GRAPH", "0")
    assert RWKV(paths["7"], "cpu fp32", verbose=False)._graph is None
    assert RWKV(paths["7"], "cpu fp32", verbose=False, cpu_graph=True)._graph is not None


@pytest.mark.parametrize("strategy,kernels,match", [
    ("cpu fp32", "reference", "kernels='reference' runs the pure-torch reference ops"),
    ("cuda fp16", None, "puts layers or the head on a device other than the CPU"),
])
def test_graph_required_but_unsupported(paths, strategy, kernels, match):
    with pytest.raises(ValueError, match=f"cpu_graph=True cannot be used with strategy .*{match}"):
        RWKV(paths["4"], strategy, verbose=False, kernels=kernels, cpu_graph=True)
    with pytest.raises(TypeError, match="cpu_graph must be True, False or None, got 'yes'"):
        RWKV(paths["4"], "cpu fp32", verbose=False, cpu_graph="yes")


def _patched(m, change):
    """m's runtime with ``change(x)`` applied to the embedding rows before the layers."""
    run = m._rt.run

    def patched(x, state, full_output, tokens=None):
        return run(change(x), state, full_output, tokens)

    m._rt.run = patched


@pytest.mark.parametrize("explicit", [True, None])
@pytest.mark.parametrize("case", ["value_in_python", "graph_differs"])
def test_a_wrong_trace_is_refused(paths, case, explicit):
    """A Python branch on a value (the tracer warns) or a graph whose first run differs from the
    op-by-op run leaves the model on the op-by-op path, with the right results; a warning says so
    when the graph was asked for."""
    if not compiled():
        pytest.skip("rwkv._C is not built")
    m = RWKV(paths["5.2"], "cpu fp32", verbose=False, cpu_graph=explicit)
    plain = RWKV(paths["5.2"], "cpu fp32", verbose=False, cpu_graph=False)
    if case == "value_in_python":
        def change(x):
            return x * 2 if bool(x.sum() > 1e30) else x
    else:
        def change(x):  # a trace-only difference: the graph would double x
            return x * 2 if torch.jit.is_tracing() else x
    _patched(m, change)
    _, s = plain.forward([1, 2], None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = decode(m, [t.clone() for t in s], [3, 4])
    b = decode(plain, [t.clone() for t in s], [3, 4])
    assert m._graph.fn is None and m._graph.failed
    assert ("differs" in m._graph.failed) == (case == "graph_differs")
    for (la, sa), (lb, sb) in zip(a, b):
        assert torch.equal(la, lb) and all(torch.equal(x, y) for x, y in zip(sa, sb))
    said = [w for w in caught if "one-token CPU graph could not be built" in str(w.message)]
    assert len(said) == (1 if explicit else 0)


_LEAK_CHILD = """
import gc, sys
from rwkv.model import RWKV, release_freed_memory
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096
def once():
    m = RWKV(sys.argv[1], 'cpu fp32', verbose=False)
    _, s = m.forward([1, 2], None)
    for t in (3, 4, 5):
        _, s = m.forward([t], s)
    assert m._graph.fn is not None, m._graph.failed
for _ in range(3):
    once()
gc.collect(); release_freed_memory(); before = rss()
for _ in range(20):
    once()
gc.collect(); release_freed_memory()
print(rss() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
def test_deleted_models_leave_no_graph_behind(paths):
    """A traced graph lives as long as its model: torch.jit.trace keeps every traced function
    (and any tensor constant in it) for the life of the process, ~4 MB per model here; ours
    lives in the decoder's own compilation unit, with the model's own weight tensors (not
    copies) as its constants."""
    if not compiled():
        pytest.skip("rwkv._C is not built")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _LEAK_CHILD, paths["7"]], capture_output=True, text=True,
                         check=True, cwd=repo)
    grown = int(out.stdout.split()[-1])
    assert grown < (8 << 20), grown
