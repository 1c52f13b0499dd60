"""Decode steps on CPU run as compiled step plans (on by default; ``RWKV(..., cpu_plan=False)`` or
``RWKV_CPU_PLAN=0`` turns them off).

While decoding, Python's own work between the ops is a large share of a token's time: every
weight streamed through the caches pushes the interpreter's code and data out, so each line of
the forward runs cold (around a tenth of a large int8 model's token, a third of a small model's).
So each decode step runs as a program (rwkv/models/program.py: the layers' own list of steps,
for B rows) inside one ``torch.classes.rwkv.StepPlan`` call (csrc/cpu/step_plan.cpp), which
calls each op's CPU kernel directly. Plans are built on first use and kept:
- the one-token call of ``RWKV.forward`` (B = 1; the caller's state read, a new state returned);
- the batched engine's step over B sequences (``Runtime.step_rows``; B = 1 .. ROWS_MAX, the
  stacked states updated in place): one plan per B, the MAX_BATCH_PLANS most recently used.

The plans run the same kernels on the same values as the op-by-op path (tests check them bit for
bit). A model whose layers have no compiled steps (kernels="reference", a layer off the CPU, a
product without a compiled kernel) runs op by op, as does a call whose program fails to build for
any other reason (with a RuntimeWarning); ``cpu_plan=True`` then raises ``ValueError``.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

import torch

from .. import settings
from ..strategy import LayerPlacement
from .common import ROWS_MAX, _compiled
from .program import Unsupported


def plan_unsupported(plan: list[LayerPlacement], mode: str) -> str | None:
    """Why no step plan can run this model, or None when one may (its layers have the last word:
    Runtime.program raises Unsupported)."""
    if mode == "reference":
        return "kernels='reference' runs the pure-torch reference ops"
    if any(torch.device(dd.device).type != "cpu" for dd in plan):
        return "the strategy puts layers or the head on a device other than the CPU"
    if not _compiled("linear_one", "CPU"):
        return "the compiled CPU kernels (rwkv._C) are not available"
    return None


def want_plan(requested: bool | None, plan: list[LayerPlacement], mode: str, strategy: str) -> bool:
    """Whether to run decode steps as step plans: ``requested`` True (else ValueError saying why
    not), False, or None (where supported, unless RWKV_CPU_PLAN=0)."""
    if requested is not None and not isinstance(requested, bool):
        raise TypeError(f"RWKV: cpu_plan must be True, False or None, got {requested!r}")
    why = plan_unsupported(plan, mode)
    if requested:
        if why is not None:
            raise ValueError(f"RWKV: cpu_plan=True cannot be used with strategy {strategy!r}: {why}. "
                             "Pass cpu_plan=None (use it where possible) or False.")
        return True
    if requested is None:
        return why is None and settings.value("RWKV_CPU_PLAN")
    return False


#: How many batched (in-place) plans a model keeps, the least recently used dropped first. Each
#: holds its per-row parameters tiled for its B rows (e.g. 8 fp32 rows of B * 2048 values a
#: 1.5B RWKV-7 layer: 100 MB at B = 64), so a plan per batch size a server has seen would hold
#: gigabytes; a dropped plan is built again in milliseconds when its B comes back.
MAX_BATCH_PLANS = 8


class StepPlans:
    """The step plans of one model's runtime, built on first use: the one-token plan, and the
    MAX_BATCH_PLANS most recently used batched plans. ``forward_one`` and ``step_rows`` return
    None where no plan can run the call (the caller then runs it op by op); ``failed`` says
    why."""

    def __init__(self, runtime, explicit: bool):
        self.rt = runtime
        self.explicit = explicit  # cpu_plan=True: the layers must all have compiled steps
        self.failed: str | None = None
        self._plans: OrderedDict = OrderedDict()  # (B, inplace) -> StepPlan, or None (Unsupported)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Copies and pickles leave the plans out (they hold the original's weights); they build
        their own on first use."""
        return {**self.__dict__, "_plans": OrderedDict(), "_lock": None}

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def get(self, B: int, inplace: bool):
        """The StepPlan of B rows, built on first use; None where the model has none (``failed``
        says why)."""
        key = (B, inplace)
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
            try:
                plan = self.rt.program(B, inplace).build()
            except Exception as e:  # the op-by-op path runs the call instead
                plan = None
                self.failed = str(e) if isinstance(e, Unsupported) else f"{type(e).__name__}: {e}"
                if self.explicit:
                    raise ValueError(f"RWKV: cpu_plan=True, but this model's decode step has no "
                                     f"compiled steps: {self.failed}") from None
                if not isinstance(e, Unsupported):  # not a known gap: say so once per plan
                    warnings.warn(f"RWKV: the step plan of {B} row(s) could not be built ({self.failed}); "
                                  "those calls run op by op", RuntimeWarning, stacklevel=4)
            self._plans[key] = plan
            batched = [k for k, v in self._plans.items() if k[1] and v is not None]
            for old in batched[:max(0, len(batched) - MAX_BATCH_PLANS)]:  # least recently used first
                del self._plans[old]
            return plan

    def forward_one(self, token: int, state: list):
        """token: a range-checked id; state: a validated state list (never written). Returns
        (logits [V] fp32, new state list), those of ``Runtime.forward``, or None."""
        plan = self.get(1, False)
        if plan is None:
            return None
        rt = self.rt
        if rt.info.deep_embed:
            state = [torch.tensor([token], dtype=torch.long), *state]
        out = plan.run_row(rt.emb, token, state)  # [logits, *new state]
        return out[0], out[1:]

    def step_rows(self, tokens: torch.Tensor, state: list | None, flat: list | None = None):
        """``Runtime.step_rows`` (tokens [B] int64, validated; state stacked, updated in place;
        or flat, the state as ``Runtime.flat_rows`` gives it) as a plan, or None (more than
        ROWS_MAX rows, or no plan)."""
        B = int(tokens.shape[0])
        if B > ROWS_MAX:
            return None
        plan = self.get(B, True)
        if plan is None:
            return None
        rt = self.rt
        inputs = rt.flat_rows(state) if flat is None else flat
        if rt.info.deep_embed:
            inputs = [tokens, *inputs]
        return plan.run(rt.emb.index_select(0, tokens), inputs)[0]
