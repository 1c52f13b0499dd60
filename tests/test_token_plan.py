"""The one-token plan (csrc/cpu/token_plan.cpp, rwkv/models/cpu_graph.py): the traced graph run
as a list of op calls, with planned products and reused intermediate results. The same bits as
the op-by-op path, results that later tokens never overwrite, the program's checks, the planned
products' guards, and the fallback to the TorchScript function."""

import threading

import pytest
import torch

from rwkv import ops
from rwkv.model import RWKV
from rwkv.models import cpu_graph
from rwkv.ops._testing import force_cpu_isa, supported_cpu_isas
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint
from tests.test_cpu_graph import decode

CFG = dict(n_layer=2, n_embd=64, vocab=100, head_size=32, seed=7)
VERSIONS = ("4", "5.2", "6", "7")

pytestmark = pytest.mark.skipif(not ops.backend_report().splitlines()[0].startswith("compiled"),
                                reason="rwkv._C is not built")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("token_plan")
    return {v: str(save_checkpoint(d / f"v{v}.pth", make_checkpoint(v, **CFG))) for v in VERSIONS}


def pair(path, strategy):
    """A model on the plan and the same model op by op, and a state after a short prompt."""
    m = RWKV(path, strategy, verbose=False)
    plain = RWKV(path, strategy, verbose=False, cpu_graph=False)
    _, s = plain.forward([1, 2, 3], None)
    return m, plain, s


def same(a, b) -> bool:
    return all(torch.equal(la, lb) and len(sa) == len(sb) and all(torch.equal(x, y) for x, y in zip(sa, sb))
               for (la, sa), (lb, sb) in zip(a, b))


@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
@pytest.mark.parametrize("v", VERSIONS)
def test_plan_runs_and_keeps_every_result(paths, v, strategy):
    """The plan is built and used, with planned steps; each token's logits and state equal the
    op-by-op ones, and stay as they were while later tokens run (the intermediates reused from
    token to token are never among them)."""
    m, plain, s = pair(paths[v], strategy)
    tokens = [5, 7, 11, 13, 17]
    got = decode(m, [t.clone() for t in s], tokens)
    want = decode(plain, [t.clone() for t in s], tokens)
    g = m._graph
    assert g.plan is not None and g.plan_failed is None
    assert g.plan.planned_steps() > 0 and g.plan.typed_steps() > 0
    assert same(got, want)  # every result as it was returned, after all five tokens


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
    assert m._graph.plan is not None and same(a, b)


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
    assert m._graph.plan is not None and same(a, b)
    assert not torch.equal(a[0][0], unchanged)


def test_threads_sharing_a_model_get_their_own_results(paths):
    """Calls from several threads at once run one at a time on the plan: each gets the results
    it would get alone."""
    m, plain, s = pair(paths["7"], "cpu fp32i8")
    decode(m, [t.clone() for t in s], [4])  # trace and plan
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
    decode(m, [t.clone() for t in s], [4, 5])  # trace and plan
    plan = m._graph.plan
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


@pytest.mark.parametrize("case", ["build_fails", "runs_differ"])
def test_a_plan_that_fails_leaves_the_torchscript_function(paths, monkeypatch, case):
    m, plain, s = pair(paths["6"], "cpu fp32")
    real = cpu_graph.build_plan

    class Wrong:
        def __init__(self, plan):
            self.plan, self.calls = plan, 0

        def run(self, x, state):
            out = self.plan.run(x, state)
            self.calls += 1
            if self.calls == 2:  # the second (planned) run gives other logits
                out[0] = out[0] + 1
            return out

    def fake(graph):
        if case == "build_fails":
            raise cpu_graph.UnsupportedGraph("node prim::Something")
        return Wrong(real(graph))

    monkeypatch.setattr(cpu_graph, "build_plan", fake)
    a = decode(m, [t.clone() for t in s], [5, 7, 9])
    b = decode(plain, [t.clone() for t in s], [5, 7, 9])
    g = m._graph
    assert g.fn is not None and g.plan is None
    assert ("prim::Something" if case == "build_fails" else "second run differs") in g.plan_failed
    assert same(a, b)


def program_ops(code, names):
    """The op names of an encoded program's steps, in order (the format: csrc/cpu/token_plan.cpp)."""
    arg_len = {T: 2, TL: None, I: 2, IL: None, F: 2, B: 2, N: 1}
    pos, ops_ = 3, []
    for _ in range(code[2]):
        op, n_args = code[pos], code[pos + 1]
        pos += 2
        for _ in range(n_args):
            tag = code[pos]
            pos += arg_len[tag] if arg_len[tag] is not None else 2 + code[pos + 1]
        pos += 1 + code[pos]  # the outs
        ops_.append(names[op])
    assert pos + 1 + code[pos] == len(code)  # then the results, and nothing else
    return ops_


@pytest.mark.parametrize("v", ["6", "7"])  # the versions with block ops (RWKV-5's state is updated by wkv5_forward)
def test_new_states_are_allocated_before_the_layers_run(paths, v, monkeypatch):
    """The plan allocates every layer's new matrix state at its start, not between the layers'
    products (cpu_graph._allocations_first), and gives the op-by-op results."""
    programs = []
    real = cpu_graph.encode_plan

    def recording(graph):
        enc = real(graph)
        programs.append(enc)
        return enc

    monkeypatch.setattr(cpu_graph, "encode_plan", recording)
    m, plain, s = pair(paths[v], "cpu fp32")
    assert same(decode(m, [t.clone() for t in s], [5, 7]), decode(plain, [t.clone() for t in s], [5, 7]))
    assert m._graph.plan is not None and len(programs) == 1
    _, code, _, names = programs[0]
    ops_ = program_ops(code, names)
    n = ops_.count("rwkv::pooled_empty_like")
    assert n == CFG["n_layer"]
    assert ops_[:n] == ["rwkv::pooled_empty_like"] * n


def test_encode_refuses_a_graph_that_returns_no_list():
    def f(x):
        return x * 2, x + 1

    graph, _ = torch.jit._get_trace_graph(f, (torch.ones(3),))
    with pytest.raises(cpu_graph.UnsupportedGraph, match="node prim::TupleConstruct"):
        cpu_graph.encode_plan(graph)


# Hand-written programs (the format: csrc/cpu/token_plan.cpp).
T, TL, I, IL, F, B, N = range(7)


def group_program(n_state=0):
    """x (slot 0) through linear_one_group with the constant weight 0: result slot 1+n_state."""
    out = 1 + n_state
    step = [0, 4, TL, 1, 0, TL, 1, -1, TL, 0, IL, 1, 0, 1, out]
    return [1 + n_state, 2 + n_state, 1, *step, 1, out]


def make_plan(code, consts=None, floats=(), names=("rwkv::linear_one_group",)):
    w = torch.randn(24, 48).t()  # column-major [48, 24], as the products take them
    return torch.classes.rwkv.OneTokenPlan(consts if consts is not None else [w], list(code), list(floats),
                                           list(names)), w


def test_planned_products_equal_the_op_and_guard_their_shapes():
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
    with pytest.raises(RuntimeError, match=r"x\[0\] must keep its first call's dtype and shape"):
        plan.run(torch.randn(48), [])
    with pytest.raises(RuntimeError, match="must keep its first call's dtype and shape"):
        plan.run(torch.randn(1, 48, dtype=torch.float64), [])
    (y,) = plan.run(x, [])
    assert torch.equal(y, want)


def tail_program(index):
    """x (slot 0) through aten::to(x, float32) and aten::select(_, 0, index): the steps a graph
    ends with (its logits in fp32, then their one row)."""
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
def test_the_graph_tail_equals_aten(x, index):
    """The graph's last steps (aten::to to fp32, aten::select of the row), which the plan runs
    itself for a contiguous bf16 one-row result: the values, dtype and shape of aten's."""
    plan, _ = make_plan(tail_program(index), names=("aten::to.dtype", "aten::select.int"))
    want = x.to(torch.float32).select(0, index)
    for _ in range(2):
        (y,) = plan.run(x, [])
        assert y.dtype == torch.float32 and y.shape == want.shape and torch.equal(y, want)


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
