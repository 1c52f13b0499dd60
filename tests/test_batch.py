"""Many sequences at once (rwkv/engine.py): ``forward_batch`` and ``BatchDecoder`` against separate
single-sequence ``forward`` calls, for every version and CPU strategy, and on a CUDA GPU (marked
``cuda``: skipped without one) for the CUDA strategies, a layer on the CPU after CUDA ones and a
streamed layer included.

Tolerances: fp32 within 1e-5 of the logits' scale (the batched products are GEMMs over B rows
where single tokens use matrix-vector kernels: the same sums in another order); CUDA fp32 1e-4,
the CUDA model tests' rule (cuBLAS and the kernels sum in their own orders). bf16 and fp16: 16
ulps of the activation dtype at the logits' scale, the compatibility tests' bf16 rule (several
rows go through a GEMM, one row through a matrix-vector kernel, each rounding its own way). int8:
5% of the model's own int8-vs-fp32 difference, the compatibility tests' rule for the fast int8
path (one row rounds its activation to int16, several rows do not)."""

from __future__ import annotations

import copy

import pytest
import torch

from rwkv.engine import BatchDecoder, EngineFullError, UnknownSequenceError
from rwkv.model import RWKV, StateError, TokenError
from tests.fixtures.make_tiny_models import ensure_checkpoints

VERSIONS = ("4", "5.0", "5.1", "5.2", "6", "7")
CUDA_STRATEGIES = ("cuda fp32", "cuda fp16", "cuda bf16", "cuda fp16i8", "cuda fp16 *1 -> cpu fp32",
                   "cuda fp16i8 *1+")
STRATEGIES = ("cpu fp32", "cpu bf16", "cpu fp32i8", "cpu fp32 *1 -> cpu bf16i8",
              *(pytest.param(s, marks=pytest.mark.cuda) for s in CUDA_STRATEGIES))


@pytest.fixture(scope="module")
def paths():
    return ensure_checkpoints()


_MODELS: dict = {}


def model(paths, version, strategy, **kw) -> RWKV:
    key = (version, strategy, tuple(sorted(kw.items())))
    if key not in _MODELS:
        _MODELS[key] = RWKV(str(paths[f"tiny-v{version}.pth"]), strategy, verbose=False, **kw)
    return _MODELS[key]


def tolerance(paths, version, strategy, ref: torch.Tensor, tokens) -> float:
    """The largest of the rules that apply to the strategy's dtypes (module docstring)."""
    scale = max(float(ref.abs().max()), 1.0)
    tol = (1e-4 if strategy.startswith("cuda fp32") else 1e-5) * scale
    if "i8" in strategy:  # 5% of what int8 itself changes (the fp32 model on the same tokens)
        fp32 = model(paths, version, "cpu fp32")
        want = fp32.forward(tokens, None)[0]
        got = model(paths, version, strategy).forward(tokens, None)[0]
        tol = max(tol, 0.05 * float((want - got.cpu()).abs().max()))
    if "bf16" in strategy:
        tol = max(tol, 16 * 2 ** -8 * scale)
    if "fp16" in strategy:
        tol = max(tol, 16 * 2 ** -10 * scale)
    return tol


def assert_close(a, b, tol, what):
    err = float((a.float() - b.float()).abs().max())
    assert err <= tol, f"{what}: max diff {err:.3g} > {tol:.3g}"


def draw(V, n, seed):
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, V, (n,), generator=g)]


def snapshot(state):
    return [t.clone() for t in state]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("version", VERSIONS)
def test_forward_batch_equals_separate_calls(paths, version, strategy):
    m = model(paths, version, strategy)
    V = m.args.vocab_size
    prompts = [draw(V, n, seed) for seed, n in enumerate((1, 6, 3, 11))]
    given = m.forward(draw(V, 4, 99), None)[1]
    states = [None, None, given, None]
    kept = snapshot(given)
    logits, new_states = m.forward_batch(prompts, states)
    assert logits.shape == (4, V) and logits.dtype == torch.float32
    for b, (tokens, st) in enumerate(zip(prompts, states)):
        want, want_state = m.forward(tokens, None if st is None else snapshot(st))
        tol = tolerance(paths, version, strategy, want, prompts[1])
        assert_close(logits[b], want, tol, f"sequence {b} logits")
        assert len(new_states[b]) == len(want_state)
        for i, (a, w) in enumerate(zip(new_states[b], want_state)):
            assert a.shape == w.shape and a.dtype == w.dtype and a.device == w.device
            assert_close(a, w, tolerance(paths, version, strategy, w, prompts[1]), f"sequence {b} state[{i}]")
    for a, k in zip(given, kept):  # the caller's state is never written
        assert torch.equal(a, k)


@pytest.mark.parametrize("version", VERSIONS)
def test_forward_batch_reference_kernels(paths, version):
    m = model(paths, version, "cpu fp32", kernels="reference")
    V = m.args.vocab_size
    prompts = [draw(V, n, 10 + n) for n in (2, 1, 5)]
    logits, states = m.forward_batch(prompts)
    for b, tokens in enumerate(prompts):
        want, want_state = m.forward(tokens, None)
        assert_close(logits[b], want, 1e-5 * float(want.abs().max()), f"sequence {b}")
        for a, w in zip(states[b], want_state):
            assert_close(a, w, 1e-5 * max(1.0, float(w.abs().max())), f"sequence {b} state")


@pytest.mark.parametrize("version", ("4", "6", "7"))
def test_forward_batch_full_output(paths, version):
    m = model(paths, version, "cpu fp32")
    prompts = [draw(m.args.vocab_size, n, n) for n in (3, 1, 7)]
    logits, states = m.forward_batch(prompts, full_output=True)
    assert [tuple(x.shape) for x in logits] == [(n, m.args.vocab_size) for n in (3, 1, 7)]
    for b, tokens in enumerate(prompts):
        want, _ = m.forward(tokens, None, full_output=True)
        assert_close(logits[b], want.reshape(len(tokens), -1), 1e-6, f"sequence {b}")


def test_forward_batch_state_tuned_start(paths):
    m = RWKV(str(paths["tiny-v7.pth"]), "cpu fp32", verbose=False)
    H, N = m.n_head, m.head_size
    g = torch.Generator().manual_seed(5)
    m.load_state_tuning({f"blocks.{i}.att.time_state": torch.randn(H, N, N, generator=g) * 0.1
                         for i in range(m.n_layer)})
    logits, _ = m.forward_batch([[5, 6], [7]], [None, None])
    assert_close(logits[0], m.forward([5, 6], None)[0], 1e-5 * 10, "state-tuned start")
    plain = RWKV(str(paths["tiny-v7.pth"]), "cpu fp32", verbose=False)
    assert float((plain.forward([7], None)[0] - logits[1]).abs().max()) > 1e-3  # the tuned start counts


def test_forward_batch_rejects_bad_input(paths):
    m = model(paths, "7", "cpu fp32")
    st = m.forward([1, 2], None)[1]
    kept = snapshot(st)
    cases = [
        (TokenError, "non-empty list", lambda: m.forward_batch([])),
        (TokenError, "tokens\\[1\\].*out of range", lambda: m.forward_batch([[1], [10 ** 6]])),
        (TokenError, "tokens\\[0\\].*empty", lambda: m.forward_batch([[], [1]])),
        (StateError, "list of 2 states", lambda: m.forward_batch([[1], [2]], [st])),
        (StateError, "states\\[1\\]", lambda: m.forward_batch([[1], [2]], [st, st[:-1]])),
    ]
    for err, msg, call in cases:
        with pytest.raises(err, match=msg):
            call()
    for a, k in zip(st, kept):
        assert torch.equal(a, k)


def decode_alone(m, prompt, fed, state=None):
    """Logits of a sequence decoded on its own: the prompt, then each fed token."""
    out, st = m.forward(prompt, None if state is None else snapshot(state))
    logits = [out]
    for t in fed:
        out, st = m.forward([t], st)
        logits.append(out)
    return logits, st


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("version", VERSIONS)
def test_engine_equals_separate_decoding(paths, version, strategy):
    """Sequences join and leave mid-stream, prompts of several lengths are prefilled in chunks
    between decode steps, and a state is exported and re-imported; every logit equals decoding
    that sequence alone."""
    m = model(paths, version, strategy)
    V = m.args.vocab_size
    eng = BatchDecoder(m, max_batch=4, prefill_chunk=5)
    prompts = {k: draw(V, n, 100 + k) for k, n in enumerate((3, 12, 1, 7, 4))}
    feeds = {k: draw(V, 6, 200 + k) for k in prompts}
    got = {k: [] for k in prompts}
    handle, key_of = {}, {}

    def join(k, state=None, tokens=None):
        h = eng.add(prompts[k] if tokens is None else tokens, state)
        handle[k], key_of[h] = h, k

    join(0)
    join(1)
    join(2)
    exported = None
    for step in range(40):
        feed = {}
        for h in eng.ready:
            k = key_of[h]
            n = len(got[k]) - 1  # tokens fed so far
            if 0 <= n < len(feeds[k]):
                feed[h] = feeds[k][n]
        out = eng.step(feed)
        for h, row in out:
            got[key_of[h]].append(row.clone())
        if step == 2:
            join(3)
        for h in list(eng.ready):
            k = key_of[h]
            if len(got[k]) == len(feeds[k]) + 1:  # done: sequence 1 leaves through export/import
                if k == 1 and exported is None:
                    exported = eng.export(h)
                eng.remove(h)
                if k == 0:
                    join(4)
        if not len(eng):
            break
    assert all(len(got[k]) == len(feeds[k]) + 1 for k in prompts), {k: len(v) for k, v in got.items()}
    for k in prompts:
        want, final = decode_alone(m, prompts[k], feeds[k])
        tol = tolerance(paths, version, strategy, want[-1], prompts[1])
        for n, (a, w) in enumerate(zip(got[k], want)):
            assert_close(a, w, tol, f"sequence {k} token {n}")
        if k == 1:
            for i, (a, w) in enumerate(zip(exported, final)):
                assert a.shape == w.shape and a.dtype == w.dtype
    # The exported state continues exactly like the single-sequence state it equals.
    eng2 = BatchDecoder(m, max_batch=2)
    h = eng2.add([5, 6], exported)
    while h not in eng2.ready:
        out = eng2.step()
    want = m.forward([5, 6], snapshot(exported))[0]
    assert_close(out.logits[0], want, 1e-6 * max(1.0, float(want.abs().max())), "re-imported state")


@pytest.mark.parametrize("version", ("5.2", "7"))
def test_engine_subset_feed_and_state_only_start(paths, version):
    """Feeding only some ready sequences (gathered and written back) and adding a sequence from a
    state with no prompt (ready at once)."""
    m = model(paths, version, "cpu fp32")
    V = m.args.vocab_size
    eng = BatchDecoder(m, max_batch=3)
    st = m.forward([1, 2, 3], None)[1]
    kept = snapshot(st)
    a = eng.add(state=st)
    b = eng.add(state=st)
    c = eng.add([4])
    assert eng.ready == [a, b] and eng.prefilling == [c]
    out = eng.step({b: 9})  # b alone, then c's prompt
    assert out.handles == [b, c]
    want_b = m.forward([9], snapshot(st))[0]
    assert_close(out.logits[0], want_b, 1e-5 * float(want_b.abs().max()), "b")
    out = eng.step({a: 9, c: 8})
    assert out.handles == [a, c]
    assert_close(out.logits[0], want_b, 1e-5 * float(want_b.abs().max()), "a (untouched by b's step)")
    want_c = m.forward([8], m.forward([4], None)[1])[0]
    assert_close(out.logits[1], want_c, 1e-5 * float(want_c.abs().max()), "c")
    for x, k in zip(st, kept):
        assert torch.equal(x, k)
    assert V == out.logits.shape[1]


def test_engine_rejects_bad_calls_and_changes_nothing(paths):
    m = model(paths, "7", "cpu fp32")
    eng = BatchDecoder(m, max_batch=2)
    a = eng.add([1, 2])
    eng.step()
    b = eng.add([3])
    before = eng.export(a)
    cases = [
        (UnknownSequenceError, "still prefilling", lambda: eng.step({b: 1})),
        (UnknownSequenceError, "not held", lambda: eng.step({a: 1, 77: 1})),
        (TokenError, "out of range", lambda: eng.step({a: m.args.vocab_size})),
        (TokenError, "must be an int", lambda: eng.step({a: 1.5})),
        (TypeError, "mapping", lambda: eng.step([a])),
        (EngineFullError, "slots are taken", lambda: eng.add([1])),
        (UnknownSequenceError, "not held", lambda: eng.remove(12345)),
        (TokenError, "out of range", lambda: BatchDecoder(m, 1).add([-1])),
        (ValueError, "max_batch", lambda: BatchDecoder(m, 0)),
    ]
    for err, msg, call in cases:
        with pytest.raises(err, match=msg):
            call()
    assert isinstance(UnknownSequenceError("x"), KeyError) and str(UnknownSequenceError("x")) == "x"
    for x, y in zip(before, eng.export(a)):
        assert torch.equal(x, y)
    assert eng.prefilling == [b] and eng.ready == [a]
    out = eng.step({a: 1})
    assert out.handles == [a, b]


def test_engine_states_deepcopy_small(paths):
    """Exported states are their own tensors, not views of the slots (a deepcopy copies one
    sequence, not the batch)."""
    m = model(paths, "7", "cpu fp32")
    eng = BatchDecoder(m, max_batch=8)
    h = eng.add(state=None)
    st = eng.export(h)
    dup = copy.deepcopy(st)
    assert sum(t.untyped_storage().nbytes() for t in dup) == sum(t.numel() * t.element_size() for t in st)


def test_engine_snapshots_are_prompt_prefix_states(paths):
    """States reported at the asked prompt positions (and at the prompt's end) equal forward over
    that prefix, and stay as they were while the sequence decodes on."""
    m = model(paths, "6", "cpu fp32")
    prompt = draw(m.args.vocab_size, 9, 7)
    eng = BatchDecoder(m, max_batch=2, prefill_chunk=4)
    h = eng.add(prompt, snapshots=(2, 5))
    snaps = []
    while h not in eng.ready:
        snaps += eng.step().snapshots
    assert [s.n_tokens for s in snaps] == [2, 5, 9] and {s.handle for s in snaps} == {h}
    kept = [snapshot(s.state) for s in snaps]
    for _ in range(3):
        eng.step({h: 1})
    for s, k in zip(snaps, kept):
        want_logits, want = m.forward(prompt[:s.n_tokens], None)
        assert_close(s.logits, want_logits, 1e-5 * float(want_logits.abs().max()), f"logits at {s.n_tokens}")
        for a, w, b in zip(s.state, want, k):
            assert torch.equal(a, b)  # not written by the later steps
            assert_close(a, w, 1e-5 * max(1.0, float(w.abs().max())), f"state at {s.n_tokens}")
    with pytest.raises(ValueError, match="snapshot positions"):
        eng.add([1, 2], snapshots=(2,))
