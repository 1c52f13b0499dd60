"""A decode step as an explicit list of op calls: the program the compiled step plan runs.

Each layer object writes its own steps (``steps(p, ...)`` beside its ``__call__`` and ``rows``):
the layer norm and mixes, the products, the recurrence, the channel mix and the residuals, as
calls of the compiled ops on values of the program. ``Runtime.program`` strings the layers and
the head together, for a batch of B rows, and ``StepPlan`` (csrc/cpu/step_plan.cpp) runs the
list in C++, each op's CPU kernel called directly, with no Python between the ops. Nothing is
recovered by tracing: what a step does is what the layer files say.

Two kinds of program:
- ``inplace=False`` (B = 1): one token of one sequence. The caller's state is read, never
  written; the program's results are the logits and the new state (``RWKV.forward``'s one-token
  calls).
- ``inplace=True`` (any B up to ROWS_MAX): one token of each of B sequences, whose stacked
  states are updated in place; the only result is the logits [B, V] (the batched engine's step).

A layer whose configuration has no compiled steps raises ``Unsupported``; the model then runs
that call op by op (the reference path the programs are tested against).
"""

from __future__ import annotations

import torch

#: Argument tags of the program's format (csrc/cpu/step_plan.cpp).
_TENSOR, _TENSOR_LIST, _INT, _INT_LIST, _FLOAT, _BOOL, _NONE = range(7)

#: c10::ScalarType codes of the dtypes a program converts to.
_DTYPE_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}

aten = torch.ops.aten


class Unsupported(RuntimeError):
    """A layer configuration without compiled steps (reference kernels, another device, an op
    that is not compiled): that call runs op by op instead."""


class Val:
    """A value of the program: the slot that holds it while the plan runs, and its dtype."""

    __slots__ = ("slot", "dtype")

    def __init__(self, slot: int, dtype):
        self.slot, self.dtype = slot, dtype


def op_name(op) -> str:
    """The qualified name of an op overload as the dispatcher knows it ("rwkv::linear_one",
    "aten::add.Tensor")."""
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


class Program:
    """The steps of one decode step for B rows. ``input`` declares the inputs in order, ``call``
    appends a step and returns its result values, ``results`` names what the plan returns."""

    def __init__(self, B: int, inplace: bool):
        self.B, self.inplace = B, inplace
        self.n_inputs = 0
        self.n_slots = 0
        self.consts: list = []
        self._const_index: dict = {}
        self.floats: list = []
        self.names: list = []
        self.steps: list = []
        self.results: list = []
        self._inputs_closed = False

    def input(self, dtype) -> Val:
        if self._inputs_closed:
            raise RuntimeError("Program.input: every input must be declared before the first step")
        self.n_inputs += 1
        return self._new(dtype)

    def _new(self, dtype) -> Val:
        self.n_slots += 1
        return Val(self.n_slots - 1, dtype)

    def _ref(self, t) -> int:
        if isinstance(t, Val):
            return t.slot
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Program: expected a value or a tensor, got {type(t).__name__}")
        k = self._const_index.get(id(t))
        if k is None:
            k = self._const_index[id(t)] = len(self.consts)
            self.consts.append(t)
        return -1 - k

    def _arg(self, value, kind: str) -> list:
        if isinstance(value, (Val, torch.Tensor)):
            return [_TENSOR, self._ref(value)]
        if value is None:
            return [_NONE]
        if isinstance(value, (list, tuple)):
            if "Tensor" in kind:
                return [_TENSOR_LIST, len(value), *(self._ref(v) for v in value)]
            if not all(type(v) is int for v in value):
                raise TypeError(f"Program: an int list holds {value!r}")
            return [_INT_LIST, len(value), *value]
        if isinstance(value, bool):
            return [_BOOL, int(value)]
        if isinstance(value, torch.dtype):
            return [_INT, _DTYPE_CODES[value]]
        if isinstance(value, int):
            return [_INT, value]
        if isinstance(value, float):
            self.floats.append(value)
            return [_FLOAT, len(self.floats) - 1]
        raise TypeError(f"Program: an argument of type {type(value).__name__}")

    def call(self, op, *args, n: int | None = None, dtype=None):
        """Appends the call ``op(*args)`` (arguments left out take the schema's defaults) and
        returns its result: one Val, or a list of n Vals for an op that returns Tensor[] or
        several tensors. ``dtype``: the results' dtype, or a list of one per result (default: the
        first tensor argument's)."""
        self._inputs_closed = True
        name = op_name(op)
        schema = op._schema
        params = schema.arguments
        if len(args) > len(params):
            raise TypeError(f"Program: {name} takes {len(params)} arguments, got {len(args)}")
        full = list(args) + [p.default_value for p in params[len(args):]]
        code: list = []
        for value, p in zip(full, params):
            code += self._arg(value, str(p.type))
        if name not in self.names:
            self.names.append(name)
        if dtype is None:  # the first tensor's (in a list: its first element's)
            firsts = [a[0] if isinstance(a, (list, tuple)) and a else a for a in args]
            dtype = next((a.dtype for a in firsts if isinstance(a, (Val, torch.Tensor))), None)
        rets = schema.returns
        listed = len(rets) == 1 and str(rets[0].type).startswith("List")
        count = n if listed else len(rets)
        if listed and n is None:
            raise TypeError(f"Program: {name} returns a list; say how many results (n=)")
        dtypes = dtype if isinstance(dtype, list) else [dtype] * count
        outs = [self._new(dt) for dt in dtypes]
        self.steps.append((self.names.index(name), len(params), code, [o.slot for o in outs]))
        return outs if (listed or count > 1) else outs[0]

    def update(self, dst: Val, src: Val) -> Val:
        """A state entry's new value: written into dst (``inplace``), else src itself."""
        if self.inplace:
            self.call(aten.copy_.default, dst, src)
            return dst
        return src

    def to(self, x: Val, dtype) -> Val:
        """x in dtype (x itself when it is)."""
        return x if x.dtype == dtype else self.call(aten.to.dtype, x, dtype, dtype=dtype)

    def view(self, x: Val, *shape: int) -> Val:
        return self.call(aten.view.default, x, list(shape))

    def encode(self) -> tuple:
        """(constants, program, floats, op names): the arguments of a StepPlan."""
        steps = _allocations_first(self.steps, self.names, self.n_inputs)
        code = [self.n_inputs, self.n_slots, len(steps)]
        for op, n_args, args, outs in steps:
            code += [op, n_args, *args, len(outs), *outs]
        code += [len(self.results), *(self._ref(r) for r in self.results)]
        return self.consts, code, self.floats, self.names

    def build(self):
        """The program as a ``torch.classes.rwkv.StepPlan``."""
        return torch.classes.rwkv.StepPlan(*self.encode())


def _allocations_first(steps: list, names: list, n_inputs: int) -> list:
    """steps with every ``pooled_empty_like`` of an input or constant (a layer's new matrix state,
    shaped like its old one) moved to the front, in order. They read nothing any step writes, so
    they may run first; run among the layers, right after a product has streamed its weights
    through the caches, each allocation finds its code and the pool's data cold, several times
    slower than together at the start."""
    def early(step) -> bool:
        op, _, args, _ = step
        return names[op] == "rwkv::pooled_empty_like" and args[0] == _TENSOR and args[1] < n_inputs
    return [s for s in steps if early(s)] + [s for s in steps if not early(s)]


def activation_steps(p: Program, y: Val, act: int) -> Val:
    """The activation code ``act`` (ops._checks.ACTIVATIONS) applied to a product's fresh result y
    in place, with the ops ``reference.activate_`` calls (the same bits)."""
    if act == 0:
        return y
    if act == 1:
        return p.call(aten.sigmoid_.default, y)
    if act == 2:
        y = p.call(aten.relu_.default, y)
        return p.call(aten.mul_.Tensor, y, y)
    if act == 3:
        return p.call(aten.tanh_.default, y)
    if act == 4:
        return p.call(aten.silu_.default, y)
    raise Unsupported(f"activation code {act}")


def need(op, what: str):
    """op, or Unsupported saying that ``what`` has no compiled op here."""
    if op is None or not hasattr(op, "_schema"):
        raise Unsupported(f"{what} has no compiled CPU op here")
    return op
