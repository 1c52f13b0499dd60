"""Decode steps as step plans (rwkv/models/program.py, rwkv/models/step_plan.py,
csrc/cpu/step_plan.cpp): the layers' own lists of steps, run in C++. The one-token plan and the
batched engine's plans give the op-by-op path's bits for every version and strategy; results
stay as returned while later tokens run; the caller's state is never written; the switches;
planned products' guards; and the program format's checks."""

import copy
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from rwkv import ops
from rwkv.engine import BatchDecoder
from rwkv.model import RWKV
from rwkv.models import common, program
from rwkv.ops._testing import force_cpu_isa, supported_cpu_isas
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

CFG = dict(n_layer=2, n_embd=64, vocab=100, head_size=32, seed=7)
VERSIONS = ("4", "5.0", "5.2", "6", "7")
STRATEGIES = ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8", "cpu fp32 *1 -> cpu bf16i8"]

pytestmark = pytest.mark.skipif(not ops.backend_report().splitlines()[0].startswith("compiled"),
                                reason="rwkv._C is not built")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("step_plan")
    out = {v: str(save_checkpoint(d / f"v{v}.pth", make_checkpoint(v, **CFG))) for v in VERSIONS}
    out["7de"] = str(save_checkpoint(d / "v7de.pth", make_checkpoint("7", deep_embed=True, **CFG)))
    return out


def decode(m, state, tokens):
    """Logits and state after each token (states copied: v4-v6 reuse the caller's list)."""
    out = []
    for t in tokens:
        logits, state = m.forward([t], state)
        state = list(state)
        out.append((logits, state))
    return out


def pair(path, strategy, **kw):
    """A model on step plans and the same model op by op, and a state after a short prompt."""
    m = RWKV(path, strategy, verbose=False, **kw)
    plain = RWKV(path, strategy, verbose=False, cpu_plan=False, **kw)
    _, s = plain.forward([1, 2, 3], None)
    return m, plain, s


def same(a, b) -> bool:
    return all(torch.equal(la, lb) and len(sa) == len(sb) and all(torch.equal(x, y) for x, y in zip(sa, sb))
               for (la, sa), (lb, sb) in zip(a, b))


def steps(m, B, tokens_per_step):
    """step_rows from fresh stacked states: the logits of each step, then the final states."""
    state = m._rt.zero_batch(B)
    out = [m._rt.step_rows(torch.tensor(t), state).clone() for t in tokens_per_step]
    return out, state


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("v", VERSIONS + ("7de",))
def test_one_token_plan_equals_op_by_op_and_keeps_every_result(paths, v, strategy):
    """The one-token plan is built and used, with planned steps; each token's logits and state
    equal the op-by-op ones, and stay as they were while later tokens run (the intermediates
    reused from token to token are never among them)."""
    m, plain, s = pair(paths[v], strategy)
    tokens = [5, 7, 11, 13, 17]
    got = decode(m, [t.clone() for t in s], tokens)
    want = decode(plain, [t.clone() for t in s], tokens)
    plan = m._rt.plans.get(1, False)
    assert plan is not None and m._rt.plans.failed is None and plain._rt.plans is None
    assert plan.planned_steps() > 0 and plan.typed_steps() > 0
    assert same(got, want)  # every result as it was returned, after all five tokens


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("v", VERSIONS + ("7de",))
def test_batched_plans_equal_op_by_op(paths, v, strategy):
    """step_rows on plans of B = 1, 3 and 8 rows: the op-by-op batched step's logits and states,
    bit for bit, step after step."""
    m, plain, _ = pair(paths[v], strategy)
    gen = torch.Generator().manual_seed(3)
    for B in (1, 3, 8):
        toks = torch.randint(0, CFG["vocab"], (3, B), generator=gen).tolist()
        got, got_state = steps(m, B, toks)
        want, want_state = steps(plain, B, toks)
        assert m._rt.plans.get(B, True) is not None
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert all(torch.equal(a, b) for a, b in zip(got_state, want_state))


@pytest.mark.parametrize("kw", [dict(exact_int8=True), dict(rescale_layer=1)], ids=["exact_int8", "rescale"])
@pytest.mark.parametrize("v", ("4", "6", "7"))
def test_plans_follow_the_model_options(paths, v, kw):
    for strategy in ("cpu fp32i8", "cpu bf16"):
        m, plain, s = pair(paths[v], strategy, **kw)
        assert same(decode(m, [t.clone() for t in s], [5, 7]), decode(plain, [t.clone() for t in s], [5, 7]))
        toks = [[5, 9, 11], [6, 2, 4]]
        got, _ = steps(m, 3, toks)
        want, _ = steps(plain, 3, toks)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("strategy", ["cpu fp32i8", "cpu bf16"])
@pytest.mark.parametrize("v", ("4", "7"))
def test_row_slabs_have_plans_too(tmp_path, v, strategy, monkeypatch):
    """Matrices stored as row slabs (rwkv/slabs.py): one-token and batched plans, the op-by-op
    bits."""
    from rwkv import slabs
    path = str(save_checkpoint(tmp_path / "m.pth", make_checkpoint(v, n_layer=2, n_embd=128, vocab=100,
                                                                   head_size=64, seed=11)))
    monkeypatch.setattr(slabs, "SLAB_BYTES", 128 if "i8" in strategy else 256)
    m, plain, s = pair(path, strategy)
    assert m.w["blocks.1.ffn.value.weight"].dim() == 3
    assert same(decode(m, [t.clone() for t in s], [5, 7]), decode(plain, [t.clone() for t in s], [5, 7]))
    got, _ = steps(m, 4, [[1, 2, 3, 4], [5, 6, 7, 8]])
    want, _ = steps(plain, 4, [[1, 2, 3, 4], [5, 6, 7, 8]])
    assert m._rt.plans.get(4, True) is not None and all(torch.equal(a, b) for a, b in zip(got, want))


def test_engine_steps_run_on_plans(paths):
    """A BatchDecoder whose sequences join and leave runs its steps on the plans of each batch
    size, with the op-by-op engine's bits; more rows than ROWS_MAX run op by op."""
    m, plain, _ = pair(paths["7"], "cpu fp32")
    outs = []
    for model in (m, plain):
        eng = BatchDecoder(model, max_batch=4)
        hs = [eng.add([1 + i, 2, 3]) for i in range(3)]
        got = [eng.step().logits.clone() for _ in range(3)]  # prefill, then the first logits
        feed = {h: 5 + i for i, h in enumerate(hs)}
        got += [eng.step(feed).logits.clone()]
        eng.remove(hs[1])
        got += [eng.step({hs[0]: 7, hs[2]: 8}).logits.clone()]
        outs.append((got, [t.clone() for t in eng.export(hs[0])]))
    (a, sa), (b, sb) = outs
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and all(torch.equal(x, y) for x, y in zip(sa, sb))
    assert {k for k, p in m._rt.plans._plans.items() if p is not None} >= {(3, True), (2, True)}
    assert m._rt.plans.step_rows(torch.zeros(common.ROWS_MAX + 1, dtype=torch.long), None) is None


def test_batched_plans_kept_are_bounded(paths, monkeypatch):
    """A model keeps the MAX_BATCH_PLANS most recently used batched plans (each holds parameters
    tiled for its rows); a batch size whose plan was dropped gets a new one, with the same
    results, and the one-token plan is never dropped."""
    from rwkv.models import step_plan
    monkeypatch.setattr(step_plan, "MAX_BATCH_PLANS", 3)
    m, plain, s = pair(paths["7"], "cpu fp32")
    decode(m, [t.clone() for t in s], [4])
    first, _ = steps(m, 2, [[5, 6]])
    for B in (3, 4, 2, 5):  # 2 used again before 5 comes: 3 is the least recently used
        steps(m, B, [list(range(B))])
    kept = [k for k, p in m._rt.plans._plans.items() if p is not None]
    assert kept == [(1, False), (4, True), (2, True), (5, True)]
    steps(m, 3, [[1, 2, 3]])  # rebuilt; 4 goes
    assert (4, True) not in m._rt.plans._plans and (3, True) in m._rt.plans._plans
    again, _ = steps(m, 2, [[5, 6]])
    want, _ = steps(plain, 2, [[5, 6]])
    assert torch.equal(first[0], again[0]) and torch.equal(again[0], want[0])


@pytest.mark.parametrize("v", VERSIONS)
def test_plans_never_write_the_callers_state(paths, v):
    m, _, s = pair(paths[v], "cpu fp32")
    kept = [t.clone() for t in s]
    for _ in range(2):
        m.forward([4], list(s))
    assert all(torch.equal(a, b) for a, b in zip(s, kept))


@pytest.mark.parametrize("v", ("4", "7"))
def test_every_form_of_one_token_decodes_alike_and_the_embedding_stays(paths, v):
    """An int and a list of one int take a path without an ids tensor (the embedding row as a
    view); a tensor and an array the general one: the same bits as the op-by-op model, and the
    embedding the rows are views of is never written."""
    m, plain, s = pair(paths[v], "cpu fp32")
    emb = m._rt.emb.clone()
    want_logits, want_state = plain.forward([7], [t.clone() for t in s])
    for tok in (7, [7], (7,), torch.tensor([7]), np.array([7]), [np.int64(7)]):
        logits, new = m.forward(tok, [t.clone() for t in s])
        assert torch.equal(logits, want_logits)
        assert all(torch.equal(a, b) for a, b in zip(new, want_state))
    assert torch.equal(m._rt.emb, emb)


def test_one_token_program_is_the_layers_list(paths):
    """The RWKV-7 one-token program, as the layer files list it: each layer's new matrix state
    allocated at the start, then per layer the layer norm and mixes, the products (one chain
    call), the recurrence, the output product with its residual, and the channel mix's layer
    norm and products; then the head's layer norm, product and row."""
    m = RWKV(paths["7"], "cpu fp32", verbose=False)
    ops_ = m._rt.plans.get(1, False).step_ops()
    L = CFG["n_layer"]
    layer = ["rwkv::ln_mix_split", "rwkv::linear_one_chain", "rwkv::wkv7_block", "rwkv::linear_one_residual",
             "rwkv::ln_mix_split", "rwkv::linear_one_ffn"]
    assert ops_ == (["rwkv::pooled_empty_like"] * L + layer * L
                    + ["rwkv::ln_mix_split", "rwkv::linear_one", "aten::select.int"])


def test_deepcopy_of_a_model_builds_its_own_plans(paths):
    m = RWKV(paths["7"], "cpu fp32", verbose=False)
    _, s = m.forward([1, 2], None)
    a, _ = m.forward([3], s)
    twin = copy.deepcopy(m)
    assert not twin._rt.plans._plans and twin._rt.plans.rt is twin._rt
    with torch.no_grad():
        for t in twin.w.values():  # the copy's own weights: changing them changes only its results
            t.mul_(0.5)
    b, _ = twin.forward([3], s)
    c, _ = m.forward([3], s)
    assert twin._rt.plans.get(1, False) is not None and torch.equal(a, c) and not torch.equal(a, b)


def test_plan_switches(paths, monkeypatch):
    assert RWKV(paths["7"], "cpu fp32", verbose=False, cpu_plan=True)._rt.plans is not None
    assert RWKV(paths["7"], "cpu fp32", verbose=False, kernels="reference")._rt.plans is None
    monkeypatch.setenv("RWKV_CPU_PLAN", "0")
    assert RWKV(paths["7"], "cpu fp32", verbose=False)._rt.plans is None
    assert RWKV(paths["7"], "cpu fp32", verbose=False, cpu_plan=True)._rt.plans is not None


@pytest.mark.parametrize("strategy,kernels,match", [
    ("cpu fp32", "reference", "kernels='reference' runs the pure-torch reference ops"),
    ("cuda fp16", None, "puts layers or the head on a device other than the CPU"),
])
def test_plan_required_but_unsupported(paths, strategy, kernels, match):
    with pytest.raises(ValueError, match=f"cpu_plan=True cannot be used with strategy .*{match}"):
        RWKV(paths["4"], strategy, verbose=False, kernels=kernels, cpu_plan=True)
    with pytest.raises(TypeError, match="cpu_plan must be True, False or None, got 'yes'"):
        RWKV(paths["4"], "cpu fp32", verbose=False, cpu_plan="yes")


def test_a_layer_without_compiled_steps_runs_op_by_op(paths, monkeypatch):
    """A layer whose op has no compiled kernel here raises Unsupported while its program is
    built: the call runs op by op with the same results (cpu_plan=True: a ValueError naming it)."""
    m, plain, s = pair(paths["6"], "cpu fp32")
    for tm in m._rt.att:
        tm.block = None
    with pytest.raises(program.Unsupported, match="wkv6_block has no compiled CPU op here"):
        m._rt.program(1, False)
    got = decode(m, [t.clone() for t in s], [5, 7])
    assert m._rt.plans.get(1, False) is None and "wkv6_block" in m._rt.plans.failed
    m2 = RWKV(paths["6"], "cpu fp32", verbose=False, cpu_plan=True)
    for tm in m2._rt.att:
        tm.block = None
    m2._rt.plans._plans.clear()
    with pytest.raises(ValueError, match="cpu_plan=True, but this model's decode step has no compiled steps"):
        m2.forward([5], None)
    plain_tm = plain._rt.att
    assert all(t.block is not None for t in plain_tm)
    assert len(got) == 2


def test_a_program_that_cannot_be_built_leaves_the_op_by_op_path(paths, monkeypatch):
    """Any failure while a program is built (not only a known gap) leaves that kind of call on the
    op-by-op path, with a RuntimeWarning naming it, and the same results."""
    from rwkv.models.v7 import TimeMixV7

    def broken(self, p, *args):
        raise TypeError("an argument of the wrong kind")

    monkeypatch.setattr(TimeMixV7, "steps", broken)
    m, plain, s = pair(paths["7"], "cpu fp32")
    with pytest.warns(RuntimeWarning, match=r"step plan of 1 row\(s\) could not be built \(TypeError: an "
                                             r"argument of the wrong kind\)"):
        got = decode(m, [t.clone() for t in s], [5])
    assert same(got, decode(plain, [t.clone() for t in s], [5]))
    assert m._rt.plans.get(1, False) is None and "TypeError" in m._rt.plans.failed


@pytest.mark.parametrize("v", VERSIONS)
def test_isa_change_between_tokens_relays_the_products(paths, v):
    """Planned products laid out for one instruction set (bf16 weights read with bf16 dots where
    the ISA has them) are laid out again when another one is forced."""
    isas = supported_cpu_isas()
    if len(isas) < 2:
        pytest.skip("one instruction set only")
    m, plain, s = pair(paths[v], "cpu bf16")
    a = decode(m, [t.clone() for t in s], [5, 7])
    b = decode(plain, [t.clone() for t in s], [5, 7])
    for isa in (isas[0], isas[-1]):
        with force_cpu_isa(isa):
            a += decode(m, a[-1][1], [9, 10])
            b += decode(plain, b[-1][1], [9, 10])
    assert m._rt.plans.get(1, False) is not None and same(a, b)


def test_weights_given_new_storage_are_read_there(paths):
    """A weight whose storage is replaced after the plan was laid out (set_) is read from its new
    memory, not from where the layout found it."""
    m, plain, s = pair(paths["6"], "cpu fp32i8")
    a = decode(m, [t.clone() for t in s], [5, 7])
    b = decode(plain, [t.clone() for t in s], [5, 7])
    st = a[-1][1]
    unchanged = decode(plain, [t.clone() for t in st], [9])[0][0]
    with torch.no_grad():
        for model in (m, plain):
            for name, t in model.w.items():
                if name.endswith(("ffn.key.weight", "att.key.weight")):
                    fresh = t.clone()  # the same strides, new memory
                    fresh.copy_(255 - t)
                    t.set_(fresh)
    a = decode(m, [t.clone() for t in st], [9, 10])
    b = decode(plain, [t.clone() for t in st], [9, 10])
    assert same(a, b)
    assert not torch.equal(a[0][0], unchanged)


def test_threads_sharing_a_model_get_their_own_results(paths):
    """Calls from several threads at once run one at a time on the plan: each gets the results
    it would get alone."""
    m, plain, s = pair(paths["7"], "cpu fp32i8")
    decode(m, [t.clone() for t in s], [4])
    starts = {i: [t.clone() for t in decode(plain, [t.clone() for t in s], [20 + i])[0][1]] for i in range(4)}
    want = {i: decode(plain, [t.clone() for t in starts[i]], [30, 31, 32]) for i in range(4)}
    got, errors = {}, []

    def work(i):
        try:
            got[i] = decode(m, [t.clone() for t in starts[i]], [30, 31, 32])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(same(got[i], want[i]) for i in range(4))


@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8"])
@pytest.mark.parametrize("v", ("4", "7"))
def test_step_profile_times_the_runs_it_was_on_for(paths, v, strategy):
    """The step profile (benchmarks/profile_cpu.py) is off until asked for; on, it sums each
    step's time over the runs from zero and counts them; off again, it keeps its sums. The
    results are the same bits with it on. Each step's weight bytes are those of its constant
    tensors: the head's step reads the head's (and, int8, its scales and offsets), and every
    weight but the embedding (whose one row run_row takes) is read by some step."""
    m, plain, s = pair(paths[v], strategy)
    decode(m, [t.clone() for t in s], [4, 5])
    plan = m._rt.plans.get(1, False)
    n = plan.steps()
    assert plan.profiled_runs() == 0 and plan.step_ns() == [0] * n
    plan.set_profiling(True)
    got = decode(m, [t.clone() for t in s], [6, 7, 8])
    assert same(got, decode(plain, [t.clone() for t in s], [6, 7, 8]))
    ns = plan.step_ns()
    assert plan.profiled_runs() == 3 and len(ns) == n == len(plan.step_ops())
    assert all(t >= 0 for t in ns) and sum(ns) > 0
    plan.set_profiling(False)
    decode(m, got[-1][1], [9])
    assert plan.profiled_runs() == 3 and plan.step_ns() == ns
    plan.set_profiling(True)
    assert plan.profiled_runs() == 0 and plan.step_ns() == [0] * n
    plan.set_profiling(False)

    ops_, wb = plan.step_ops(), plan.step_weight_bytes()
    assert len(wb) == n and all(b >= 0 for b in wb)
    head = sum(t.nbytes for k, t in m.w.items() if k.startswith("head."))
    head_step = max(i for i, op in enumerate(ops_) if op in ("rwkv::linear_one", "rwkv::mm8_one_i16"))
    assert wb[head_step] == head
    assert sum(wb) >= sum(t.nbytes for k, t in m.w.items() if k != "emb.weight")


def test_a_plans_inputs_keep_their_first_layout(paths):
    """A plan's planned steps keep what they checked on the first call: a later call whose inputs
    differ in sizes, strides or dtype is refused before any step runs."""
    m, _, s = pair(paths["7"], "cpu fp32")
    plan = m._rt.plans.get(1, False)
    emb = m._rt.emb
    plan.run_row(emb, 3, list(s))
    bad = list(s)
    bad[1] = torch.zeros(s[1].shape[0] + 1, *s[1].shape[1:])
    with pytest.raises(ValueError, match="input 2 has sizes"):
        plan.run_row(emb, 3, bad)
    bad[1] = s[1].double()
    with pytest.raises(ValueError, match="input 2 has sizes"):
        plan.run_row(emb, 3, bad)
    with pytest.raises(ValueError, match="input 0 has sizes"):
        plan.run(torch.zeros(1, CFG["n_embd"] * 2)[:, ::2], list(s))


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
    assert m._rt.plans.get(1, False) is not None, m._rt.plans.failed
for _ in range(3):
    once()
gc.collect(); release_freed_memory(); before = rss()
for _ in range(20):
    once()
gc.collect(); release_freed_memory()
print(rss() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
@pytest.mark.skipif(bool(os.environ.get("RWKV_TEST_EXTENSION_DIR")),
                    reason="a sanitizer's allocator holds freed memory back (make sanitize)")
def test_deleted_models_leave_no_plan_behind(paths):
    """A plan lives as long as its model: its constants are the model's own tensors (not copies),
    and nothing outlives the model."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _LEAK_CHILD, paths["7"]], capture_output=True, text=True,
                         check=True, cwd=repo)
    grown = int(out.stdout.split()[-1])
    assert grown < (8 << 20), grown


# Hand-written programs (the format: csrc/cpu/step_plan.cpp).
T, TL, I, IL, F, B, N = range(7)


def group_program(n_state=0):
    """x (slot 0) through linear_one_group with the constant weight 0: result slot 1+n_state."""
    out = 1 + n_state
    step = [0, 4, TL, 1, 0, TL, 1, -1, TL, 0, IL, 1, 0, 1, out]
    return [1 + n_state, 2 + n_state, 1, *step, 1, out]


def make_plan(code, consts=None, floats=(), names=("rwkv::linear_one_group",)):
    w = torch.randn(24, 48).t()  # column-major [48, 24], as the products take them
    return torch.classes.rwkv.StepPlan(consts if consts is not None else [w], list(code), list(floats),
                                           list(names)), w


def test_planned_products_equal_the_op_and_inputs_keep_their_layout():
    plan, w = make_plan(group_program())
    x = torch.randn(1, 48)
    want = torch.ops.rwkv.linear_one_group([x], [w], [], [0])[0]
    kept = []
    for _ in range(3):  # the op's own call, then the laid-out products
        (y,) = plan.run(x, [])
        assert torch.equal(y, want)
        kept.append(y)
    assert plan.planned_steps() == 1
    (other,) = plan.run(torch.randn(1, 48), [])
    assert not torch.equal(other, want)
    assert all(torch.equal(y, want) for y in kept)  # a result of the plan: never reused
    with pytest.raises(ValueError, match=r"input 0 has sizes \[48\], strides \[1\] and dtype Float; "
                                         r"this plan takes sizes \[1, 48\]"):
        plan.run(torch.randn(48), [])
    with pytest.raises(ValueError, match="input 0 has sizes .* dtype Double"):
        plan.run(torch.randn(1, 48, dtype=torch.float64), [])
    (y,) = plan.run(x, [])
    assert torch.equal(y, want)


def tail_program(index):
    """x (slot 0) through aten::to(x, float32) and aten::select(_, 0, index): the steps a one-token
    program ends with (its logits in fp32, then their one row)."""
    to = [0, 5, T, 0, I, int(6), B, 0, B, 0, N, 1, 1]  # 6: c10::ScalarType::Float
    select = [1, 3, T, 1, I, 0, I, index, 1, 2]
    return [1, 3, 2, *to, *select, 1, 2]


@pytest.mark.parametrize("x", [
    torch.randn(1, 37).bfloat16(),                    # run in the plan: widened, then aliased
    torch.randn(1, 74).bfloat16()[:, ::2],             # not contiguous: aten's to
    torch.randn(1, 37),                                # already fp32: aten's to (x itself)
    torch.randn(3, 37).bfloat16(),                     # several rows: aten's select
], ids=["bf16", "strided", "fp32", "rows"])
@pytest.mark.parametrize("index", [0, -1])
def test_the_program_tail_equals_aten(x, index):
    """A one-token program's last steps (aten::to to fp32, aten::select of the row), which the plan runs
    itself for a contiguous bf16 one-row result: the values, dtype and shape of aten's."""
    plan, _ = make_plan(tail_program(index), names=("aten::to.dtype", "aten::select.int"))
    want = x.to(torch.float32).select(0, index)
    for _ in range(2):
        (y,) = plan.run(x, [])
        assert y.dtype == torch.float32 and y.shape == want.shape and torch.equal(y, want)


@pytest.mark.parametrize("src", [
    torch.randn(37),                      # contiguous, one dtype and size: copied in the plan
    torch.randn(74)[::2],                 # strided: aten's copy_
    torch.randn(37).bfloat16(),           # another dtype: aten's copy_ (converts)
], ids=["plain", "strided", "bf16"])
def test_a_state_update_equals_aten_copy(src):
    """aten::copy_(dst, src), an in-place program's state update, which the plan runs itself for
    contiguous tensors of one dtype and size: dst holds src's values (as aten's copy_ leaves it),
    and the step's result is dst itself."""
    copy = [0, 3, T, 1, T, 0, B, 0, 1, 2]  # copy_(slot 1, slot 0, False) -> slot 2
    plan, _ = make_plan([2, 3, 1, *copy, 1, 2], consts=[], names=("aten::copy_",))
    for _ in range(2):
        dst = torch.zeros(37)
        (out,) = plan.run(src, [dst])
        assert torch.equal(dst, torch.zeros(37).copy_(src)) and out.data_ptr() == dst.data_ptr()


def test_run_row_takes_the_embedding_row_itself():
    """run_row(emb, token, state) is run(emb[token:token + 1], state), the row taken in the plan
    (an alias, no copy), for an embedding that is itself a view at an offset; ids outside
    [0, V) and embeddings that are not 2-D are refused."""
    plan, _ = make_plan(group_program())
    emb = torch.randn(9, 48)[2:7]  # [5, 48] at a storage offset
    for token in (0, 3, 4):
        (want,) = plan.run(emb.narrow(0, token, 1), [])
        (got,) = plan.run_row(emb, token, [])
        assert torch.equal(got, want)
    with pytest.raises(IndexError, match=r"token 5 is out of range \[0, 5\)"):
        plan.run_row(emb, 5, [])
    with pytest.raises(IndexError, match="token -1 is out of range"):
        plan.run_row(emb, -1, [])
    with pytest.raises(ValueError, match="emb must be a 2-D CPU tensor"):
        plan.run_row(emb[0], 0, [])


@pytest.mark.parametrize("code,match", [
    ([], "the program ends early"),
    ([0, 1, 0, 0], "n_inputs must be at least 1"),
    ([1, 2, 1, 0, 1, T, 1, 0, 0], "reads slot 1 before any step writes it"),
    ([1, 2, 1, 0, 1, 9, 0, 0], "unknown argument tag 9"),
    ([1, 2, 1, 5, 0, 0, 0], "op index 5 out of range"),
    ([1, 2, 1, 0, 4, TL, 1, 0, TL, 1, -3, TL, 0, IL, 1, 0, 1, 1, 1, 1], "list element -3 names no slot"),
    ([1, 2, 1, 0, 4, TL, 1, 0, TL, 1, -1, TL, 0, IL, 1, 0, 1, 0, 1, 1], "writes slot 0, which is an input"),
    (group_program() + [7], "1 integers after the program's end"),
    ([1, 1, 0, 1, 1], "result 0 is slot 1|names no slot"),
])
def test_malformed_programs_are_refused(code, match):
    with pytest.raises(ValueError, match=match):
        make_plan(code)


def test_unknown_ops_and_wrong_arguments_are_refused():
    with pytest.raises(ValueError, match="no op named aten::no_such_op"):
        make_plan([1, 2, 1, 0, 0, 1, 1, 1, 1], names=("aten::no_such_op",))
    with pytest.raises(RuntimeError, match="linear_one_group takes 4 arguments, the program gives 1"):
        make_plan([1, 2, 1, 0, 1, T, 0, 1, 1, 1, 1])
    plan, _ = make_plan(group_program())
    with pytest.raises(ValueError, match="the state must hold 0 tensors, got 1"):
        plan.run(torch.randn(1, 48), [torch.zeros(1)])
