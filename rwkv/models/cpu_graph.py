"""One-token decode on CPU as a traced graph (on by default; ``RWKV(..., cpu_graph=False)`` or
``RWKV_CPU_GRAPH=0`` turns it off).

While decoding, Python's own work between the ops is a large share of a token's time: every
weight streamed through the caches pushes the interpreter's code and data out, so each line of
the forward runs cold (around a tenth of a large int8 model's token, a third of a small model's).
So on the model's first one-token call, ``Runtime.run`` is traced once
(torch's tracer, ``torch.jit._get_trace_graph``) into a graph of the same ops with the same arguments, and later one-token
calls run that graph in C++ (its own compilation unit, owned by the model; the weights are
traced as inputs, then bound into the graph as constants that are the model's own tensors, not
copies; deleting the model frees everything). Its results equal the op-by-op path's, bit for bit.

What makes the trace valid (reviewed; keep it so): ``Runtime.run`` for one token on CPU takes no
data-dependent Python branch (only shapes, read through ``rows()``, and the model's fixed
configuration), and every op it calls is a torch op that the trace records: the compiled kernels
(kernels="reference" never traces, since the reference ops decide in Python on values). As a
safety net, the trace is refused when the tracer warns of any Python use of a tensor's value, or
when the graph's first run differs from the traced run in any bit; the model then stays on the
op-by-op path (with a warning when the graph was asked for explicitly).

The graph then runs as a **one-token plan** (``torch.classes.rwkv.OneTokenPlan``,
csrc/cpu/token_plan.cpp; ``encode_plan`` turns the graph into its program): the graph's op calls in
order, each op's CPU kernel called directly with its constant arguments built once, instead of
TorchScript's interpreter and the dispatcher; the product ops keep their checks and layout from
their first call (csrc/cpu/product_step.h) and, with the block and mix ops, write the results that
nothing reads after the token into the same tensors every token (csrc/cpu/into.h). The plan is kept
only when its first two runs (the second one on the planned products) give the traced run's results
bit for bit; otherwise the TorchScript function runs the graph (``plan_failed`` says why).

Supported: every layer and the head on CPU, compiled kernels. ``cpu_graph=True`` on another
strategy raises ``ValueError``; the default (None) quietly uses it where supported. Sequence calls
(more than one token) always take the op-by-op path.
"""

from __future__ import annotations

import warnings

import torch

from .. import settings
from ..strategy import LayerPlacement
from .common import _compiled


def graph_unsupported(plan: list[LayerPlacement], mode: str) -> str | None:
    """Why the CPU graph cannot run this model, or None when it can."""
    if mode == "reference":
        return "kernels='reference' runs the pure-torch reference ops, which decide in Python on values"
    if any(torch.device(dd.device).type != "cpu" for dd in plan):
        return "the strategy puts layers or the head on a device other than the CPU"
    if not _compiled("linear_one_group", "CPU"):
        return "the compiled CPU kernels (rwkv._C) are not available"
    if not hasattr(torch.jit, "_get_trace_graph") or not hasattr(torch._C, "CompilationUnit"):
        return "this torch has no TorchScript tracer"
    return None


def want_graph(requested: bool | None, plan: list[LayerPlacement], mode: str, strategy: str) -> bool:
    """Whether to build a CPUGraphDecoder: ``requested`` True (else ValueError saying why not),
    False, or None (where supported, unless RWKV_CPU_GRAPH=0)."""
    if requested is not None and not isinstance(requested, bool):
        raise TypeError(f"RWKV: cpu_graph must be True, False or None, got {requested!r}")
    why = graph_unsupported(plan, mode)
    if requested:
        if why is not None:
            raise ValueError(f"RWKV: cpu_graph=True cannot be used with strategy {strategy!r}: {why}. "
                             "Pass cpu_graph=None (use it where possible) or False.")
        return True
    if requested is None:
        return why is None and settings.value("RWKV_CPU_GRAPH")
    return False


MAX_CONSTANT_BYTES = 1 << 16  # what a graph may hold itself (scalars, small factory results)


def runtime_tensors(rt) -> list:
    """Every tensor reachable from the runtime's layer objects (weights, side tensors, stacked
    parameters, views of them), each once, in a fixed order."""
    found: dict = {}

    def walk(obj, depth):
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), obj)
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item, depth)
        elif isinstance(obj, dict):
            for item in obj.values():
                walk(item, depth)
        elif depth < 4 and type(obj).__module__.startswith("rwkv.models"):
            for item in vars(obj).values():
                walk(item, depth + 1)

    walk([rt.att, rt.ffn, rt.head, rt.head_norm], 0)
    return list(found.values())


def constant_bytes(graph) -> int:
    """Bytes of the tensors a traced graph holds as constants."""
    total = 0
    for node in graph.nodes():
        if node.kind() == "prim::Constant" and node.hasAttribute("value") and node.kindOf("value") == "t":
            t = node.t("value")
            total += t.numel() * t.element_size()
    return total


def bind_params(graph, first: int, params: list) -> None:
    """Turns the graph's inputs from index ``first`` on (``params``, in order) into constants that
    refer to those same tensors (no copies). Passed as inputs, the runtime's ~1300 tensors (a
    24-layer RWKV-7) would be converted from Python objects on every call."""
    inputs = list(graph.inputs())
    start = next(iter(graph.nodes()))
    for i in reversed(range(first, len(inputs))):
        c = graph.insertConstant(params[i - first])
        c.node().moveBefore(start)
        start = c.node()
        inputs[i].replaceAllUsesWith(c)
        graph.eraseInput(i)


def list_output(graph) -> None:
    """Makes the traced graph return its results as one list of tensors, not a tuple. A tuple's
    conversion to Python computes the tuple's type, a TensorType of every element's sizes and
    strides (~10 allocations each: ~750 per 24-layer token, for the logits and the 72 state
    tensors); a list of tensors has its type already."""
    ret = graph.return_node()
    tup = ret.inputsAt(0).node()
    if tup.kind() != "prim::TupleConstruct":
        raise RuntimeError(f"the traced graph returns {tup.kind()}, not a tuple")
    lst = graph.create("prim::ListConstruct", list(tup.inputs()))
    lst.output().setType(torch._C.ListType.ofTensors())
    lst.insertBefore(ret)
    ret.replaceInput(0, lst.output())
    tup.destroy()


class UnsupportedGraph(RuntimeError):
    """The traced graph has a node the one-token plan cannot express (the graph then runs as a
    TorchScript function)."""


# Argument tags of the plan's program (csrc/cpu/token_plan.cpp).
_TENSOR, _TENSOR_LIST, _INT, _INT_LIST, _FLOAT, _BOOL, _NONE = range(7)


def encode_plan(graph) -> tuple:
    """The traced graph (after bind_params and list_output) as the program of a
    ``torch.classes.rwkv.OneTokenPlan``: (constants, program, floats, op names); the format is in
    csrc/cpu/token_plan.cpp. Its nodes must be constants, list constructions, unpackings of an
    op's list result, and op calls; anything else raises UnsupportedGraph."""
    inputs = list(graph.inputs())
    slot = {v.unique(): i for i, v in enumerate(inputs)}  # values of the call -> slots
    known: dict = {}  # constants and constructed lists, by value
    consts: list = []
    const_index: dict = {}  # id(tensor) -> its index in consts
    floats: list = []
    names: list = []
    steps: list = []
    pending: dict = {}  # an op's Tensor[] result -> its step's outs, filled by the unpacking

    def tensor_ref(v) -> int:
        u = v.unique()
        if u in slot:
            return slot[u]
        value = known.get(u)
        if isinstance(value, torch.Tensor):
            if id(value) not in const_index:
                const_index[id(value)] = len(consts)
                consts.append(value)
            return -1 - const_index[id(value)]
        raise UnsupportedGraph(f"value %{v.debugName()} is not a tensor the plan holds")

    def scalar(value) -> list:
        if value is None:
            return [_NONE]
        if isinstance(value, bool):
            return [_BOOL, int(value)]
        if isinstance(value, int):
            return [_INT, value]
        if isinstance(value, float):
            floats.append(value)
            return [_FLOAT, len(floats) - 1]
        if isinstance(value, (list, tuple)) and all(type(i) is int for i in value):
            return [_INT_LIST, len(value), *value]
        raise UnsupportedGraph(f"constant {value!r} of type {type(value).__name__}")

    def argument(v) -> list:
        u = v.unique()
        if u in slot or isinstance(known.get(u), torch.Tensor):
            return [_TENSOR, tensor_ref(v)]
        if u in known and isinstance(known[u], _Listed):
            items = known[u].items
            if v.type().isSubtypeOf(torch._C.ListType.ofTensors()):
                return [_TENSOR_LIST, len(items), *(tensor_ref(i) for i in items)]
            values = [known.get(i.unique(), _MISSING) for i in items]
            return scalar(values)
        if u in known:
            return scalar(known[u])
        raise UnsupportedGraph(f"argument %{v.debugName()} ({v.type()}) is not known")

    def new_slot(v) -> int:
        slot[v.unique()] = len(slot)
        return slot[v.unique()]

    for node in graph.nodes():
        kind = node.kind()
        if kind == "prim::Constant":
            known[node.output().unique()] = node.output().toIValue()
        elif kind == "prim::ListConstruct":
            known[node.output().unique()] = _Listed(list(node.inputs()))
        elif kind == "prim::ListUnpack":
            outs = pending.pop(node.input().unique(), None)
            if outs is None or outs:
                raise UnsupportedGraph("an unpacking of a list that is no op's result")
            outs.extend(new_slot(o) for o in node.outputs())
        elif "::" in kind and not kind.startswith("prim::"):
            name = node.schema().split("(", 1)[0]
            if name not in names:
                names.append(name)
            args = [a for v in node.inputs() for a in argument(v)]
            outs: list = []
            results = list(node.outputs())
            if len(results) == 1 and results[0].type().isSubtypeOf(torch._C.ListType.ofTensors()):
                pending[results[0].unique()] = outs
            else:
                outs.extend(new_slot(o) for o in results)
            steps.append((names.index(name), node.inputsSize(), args, outs))
        else:
            raise UnsupportedGraph(f"node {kind}")
    ret = graph.return_node().input().unique()
    if not isinstance(known.get(ret), _Listed):
        raise UnsupportedGraph("the graph does not return a list")
    results = [tensor_ref(v) for v in known[ret].items]
    steps = _allocations_first(steps, names, len(inputs))
    code = [len(inputs), len(slot), len(steps)]
    for op, n_args, args, outs in steps:
        code += [op, n_args, *args, len(outs), *outs]
    code += [len(results), *results]
    return consts, code, floats, names


def _allocations_first(steps: list, names: list, n_inputs: int) -> list:
    """steps with every ``pooled_empty_like`` of a graph input or constant (a layer's new matrix
    state, shaped like its old one) moved to the front, in order. Each slot is written once, and
    these steps read nothing any step writes, so they may run first. Run among the layers, right
    after a product has streamed its weights through the caches, each allocation finds its code
    and pool data cold; run together at the start, they run warm, several times faster. (Results
    made inside an op, like ln_mix_split's new shift state, are made at the
    plan's start by the plan itself: Reusing's fresh results, csrc/cpu/token_plan.cpp.)"""
    def early(step) -> bool:
        op, _, args, _ = step
        return names[op] == "rwkv::pooled_empty_like" and args[0] == _TENSOR and args[1] < n_inputs
    return [s for s in steps if early(s)] + [s for s in steps if not early(s)]


class _Listed:
    """A list the graph constructs (its values)."""

    def __init__(self, items: list):
        self.items = items


_MISSING = object()  # a list element that is no constant (an int list needs all of them)


def build_plan(graph):
    """The graph as a ``torch.classes.rwkv.OneTokenPlan`` (csrc/cpu/token_plan.cpp)."""
    return torch.classes.rwkv.OneTokenPlan(*encode_plan(graph))


class CPUGraphDecoder:
    """Runs one-token ``runtime.run`` calls as a graph traced on the first one (module docstring)."""

    def __init__(self, runtime, explicit: bool):
        self.rt = runtime
        self.explicit = explicit  # asked for with cpu_graph=True: say so when it cannot be used
        self.fn = None
        self.failed: str | None = None  # why the trace was refused (then the op-by-op path runs)
        self.plan = None  # the graph as a OneTokenPlan, which runs it when it could be built
        self.plan_failed: str | None = None  # why not (then the TorchScript function runs)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the graph out (a traced function cannot be pickled, and it
        holds the original's weights); they trace their own on their first one-token call."""
        return {**self.__dict__, "fn": None, "plan": None}

    def forward_one(self, token: int, state: list):
        """token: a range-checked id; state: a validated state list (never written). Returns
        (logits [V] fp32, new state list), those of ``Runtime.forward``. x is the embedding's row
        as a view (no op writes its input x); the plan takes that row itself (run_row).

        A DeepEmbed model's graph has one more input after x, the token id as a [1] int64 tensor
        (its channel mixes gather their table rows with it: the gather is an op of the graph, so
        the graph serves every token); the plan takes it as the first of its state inputs."""
        if self.rt.info.deep_embed:
            return self._forward_ids(token, state)
        if self.plan is not None:
            out = self.plan.run_row(self.rt.emb, token, state)  # [logits, *new state]
            return out[0], out[1:]
        x = self.rt.emb.narrow(0, token, 1)
        if self.fn is None and self.failed is None:
            return self._trace(x, state)
        if self.fn is None:
            return self.rt.run(x, state, False)
        out = self.fn(x, *state)
        return out[0], out[1:]

    def _forward_ids(self, token: int, state: list):
        """forward_one with the token id as a graph input (DeepEmbed models)."""
        x = self.rt.emb.narrow(0, token, 1)
        ids = torch.tensor([token], dtype=torch.long)
        if self.plan is not None:
            out = self.plan.run(x, [ids, *state])
        elif self.fn is not None:
            out = self.fn(x, ids, *state)
        elif self.failed is None:
            return self._trace(x, state, ids)
        else:
            return self.rt.run(x, state, False, ids)
        return out[0], out[1:]

    def _trace(self, x: torch.Tensor, state: list, ids: torch.Tensor | None = None):
        """Traces, checks and keeps the graph (and its plan); returns the op-by-op run's results.
        ids: the token id of x ([1] int64), a graph input after x, for DeepEmbed models only."""
        rt = self.rt
        n_state = len(state)
        extra = [] if ids is None else [ids]
        # Every tensor the runtime holds is an input of the traced graph, so that the trace
        # cannot copy one into a constant of its own (checked below); they are then bound into
        # the graph as constants that are those very tensors (bind_params).
        params = runtime_tensors(rt)

        def step(x, *args):
            tokens = args[0] if extra else None
            st = list(args[len(extra):len(extra) + n_state])
            logits, new_state = rt.run(x, st, False, tokens)
            return (logits, *new_state)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", torch.jit.TracerWarning)  # a value used in Python
                warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's own notice
                graph, _ = torch.jit._get_trace_graph(step, (x, *extra, *state, *params))
            # The graph becomes a function of our own compilation unit, which goes when this
            # decoder goes (torch.jit.trace would register it for the life of the process).
            held = constant_bytes(graph)
            if held > MAX_CONSTANT_BYTES:
                raise RuntimeError(f"the graph would hold {held} bytes of tensors as constants")
            bind_params(graph, 1 + len(extra) + n_state, params)
            list_output(graph)
            fn = torch._C.CompilationUnit().create_function("rwkv_one_token", graph)
            traced = step(x, *extra, *state)  # op by op: the reference for the graph's first run
            again = fn(x, *extra, *state)
            if len(again) != len(traced) or not all(torch.equal(a, b) for a, b in zip(again, traced)):
                raise RuntimeError("the graph's first run differs from the op-by-op run")
        except Exception as e:  # any failure leaves the op-by-op path, which is always valid
            self.failed = f"{type(e).__name__}: {e}"
            if self.explicit:
                warnings.warn(f"RWKV: the one-token CPU graph could not be built ({self.failed}); "
                              "decoding runs op by op", RuntimeWarning, stacklevel=4)
            return rt.run(x, state, False, ids)
        self.fn = fn
        self._plan(graph, x, extra + list(state), traced)
        return traced[0], list(traced[1:])

    def _plan(self, graph, x: torch.Tensor, state: list, traced: tuple) -> None:
        """Builds the OneTokenPlan of the graph and keeps it when its first run gives the traced
        run's results, bit for bit; otherwise the TorchScript function stays (plan_failed says
        why)."""
        try:
            plan = build_plan(graph)
            # Twice: its planned steps run the ops themselves the first time, and from then on
            # their laid-out products (csrc/cpu/product_step.h).
            for run in ("first", "second"):
                again = plan.run(x, state)
                if len(again) != len(traced) or not all(torch.equal(a, b) for a, b in zip(again, traced)):
                    raise RuntimeError(f"the plan's {run} run differs from the op-by-op run")
        except Exception as e:  # the TorchScript function is as valid
            self.plan_failed = f"{type(e).__name__}: {e}"
            return
        self.plan = plan
