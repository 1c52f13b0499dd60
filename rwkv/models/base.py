"""Version-independent runtime: embedding, layer loop, head, and the recurrent state.

State layout (upstream's, per layer i):
  v4:      [5i+0] att shift (C, atype)  [5i+1] aa  [5i+2] bb  [5i+3] pp (A, fp32; pp starts at -1e30)
           [5i+4] ffn shift (C, atype)
  v5/v6:   [3i+0] att shift  [3i+1] S (H, N, N) fp32 [head, key, value]  [3i+2] ffn shift
  v7:      [3i+0] att shift  [3i+1] S (H, N, N) fp32 [head, value, key]  [3i+2] ffn shift
Shift states hold the layer-norm output of the previous token. Tensors live on their layer's device.
"""

from __future__ import annotations

import torch

from ..loading import ModelInfo
from ..strategy import LayerPlacement
from .common import HeadNorm, Projection, concrete_device, moved, projections, rows
from .ffn import ChannelMix
from .program import Program, Unsupported
from .v4 import TimeMixV4
from .v5 import TimeMixV5, TimeMixV6
from .v7 import TimeMixV7


class StateError(ValueError):
    """A state that does not belong to this model (length, shape, dtype or device)."""


class TokenError(ValueError, IndexError):
    """Bad token ids. Subclasses IndexError too, which is what upstream raised for these cases."""


def _time_mix_class(version: float):
    if version == 4:
        return TimeMixV4
    if version == 6:
        return TimeMixV6
    if version == 7:
        return TimeMixV7
    return TimeMixV5


def _on_device(t: torch.Tensor, dev: torch.device) -> bool:
    return t.device.type == dev.type and (dev.index is None or t.device.index in (dev.index, None))


class Runtime:
    """Holds the per-layer modules built from the converted weights and runs the forward pass."""

    def __init__(self, info: ModelInfo, w: dict, plan: list[LayerPlacement], rescale: int, mode: str,
                 exact_int8: bool = False):
        self.info, self.w, self.plan, self.rescale = info, w, plan, rescale
        L = info.n_layer
        self.per_layer = 5 if info.version == 4 else 3
        self.devices = [concrete_device(dd.device) for dd in plan]
        tm_cls = _time_mix_class(info.version)
        self.att, self.ffn = [], []
        for i in range(L):
            dd = plan[i]
            self.att.append(tm_cls(w, i, dd, info, mode, dd.stream))
            self.ffn.append(ChannelMix(w, i, dd, info.version, mode, dd.stream))
        self.head_norm = HeadNorm(w["ln_out.weight"], w["ln_out.bias"], plan[L], mode)
        self.head = Projection(w, "head.weight", plan[L], mode, stream=False)
        if exact_int8:
            for proj in [self.head] + [p for m in self.att + self.ffn for p in projections(m)]:
                proj.use_exact_int8()
        self.emb = w["emb.weight"]
        self.initial_matrix_state: list | None = None  # from time_state keys or load_state_tuning()
        self._flat_specs: list | None = None  # state_spec of every entry, built on first validation
        self.plans = None  # the model's StepPlans (rwkv/models/step_plan.py) when decode steps run as plans
        if info.has_time_state and info.version >= 5:
            self.initial_matrix_state = self._time_state_from_weights()

    def int8_decode_op(self, i: int) -> str | None:
        """The op one-token int8 products of layer i (i = n_layer: the head) use, None if no int8."""
        mods = [self.head] if i == self.info.n_layer else projections(self.att[i]) + projections(self.ffn[i])
        return next((p.one_token_op for p in mods if p.int8), None)

    # ----------------------------------------------------------------------------------- state
    def state_spec(self, i: int) -> list:
        """(shape, dtype, device, description) of every state entry of layer i, in order."""
        info, dd, dev = self.info, self.plan[i], self.devices[i]
        shift = ((info.n_embd,), dd.atype, dev)
        if info.version == 4:
            vec = ((info.n_att,), torch.float32, dev)
            return [shift + ("att shift",), vec + ("aa",), vec + ("bb",), vec + ("pp",), shift + ("ffn shift",)]
        mat = ((info.n_head, info.head_size, info.head_size), torch.float32, dev)
        return [shift + ("att shift",), mat + ("matrix state",), shift + ("ffn shift",)]

    def zero_state(self) -> list:
        state = []
        for i in range(self.info.n_layer):
            for n, (shape, dtype, dev, _) in enumerate(self.state_spec(i)):
                t = torch.zeros(shape, dtype=dtype, device=dev)
                if self.info.version == 4 and n == 3:
                    t -= 1e30
                elif n == 1 and self.initial_matrix_state is not None:
                    t = self.initial_matrix_state[i].to(dev).clone()
                state.append(t)
        return state

    def zero_batch(self, B: int) -> list:
        """Fresh states of B sequences stacked: entry k is [B, *shape of entry k] (upstream's layout
        with a leading row per sequence), every row equal to zero_state()'s entry k."""
        return [t.unsqueeze(0).repeat((B,) + (1,) * t.dim()) for t in self.zero_state()]

    def _time_state_from_weights(self) -> list:
        """Upstream: ``time_state`` (rounded to atype at load), last two axes swapped for v5/v6."""
        out = []
        for i in range(self.info.n_layer):
            ts = self.w.get(f"blocks.{i}.att.time_state")
            if ts is None:
                out.append(torch.zeros(self.info.n_head, self.info.head_size, self.info.head_size))
                continue
            ts = ts.reshape(self.info.n_head, self.info.head_size, self.info.head_size)
            if self.info.version < 7:
                ts = ts.transpose(1, 2)
            out.append(ts.to(dtype=torch.float32, device=self.devices[i]).contiguous())
        return out

    def validate_state(self, state) -> list:
        """The state to run from: ``state`` itself when every tensor is already in the kernels' layout,
        else a new list in which the tensors that are not (non-contiguous views, other strides) are
        replaced by contiguous private copies (same values: the caller's tensors are never written
        either way). A state of another model, dtype, device or layout is a StateError."""
        n = self.info.n_layer * self.per_layer
        if not isinstance(state, (list, tuple)):
            raise StateError(f"RWKV.forward: state must be None or the list returned by a previous forward, "
                             f"got {type(state).__name__}")
        if len(state) != n:
            raise StateError(f"RWKV.forward: state has {len(state)} entries, this model needs {n} "
                             f"({self.info.n_layer} layers x {self.per_layer}); it was made by a different "
                             "model. Pass state=None to start fresh.")
        specs = self._flat_specs
        if specs is None:
            specs = self._flat_specs = [spec for i in range(self.info.n_layer) for spec in self.state_spec(i)]
        copied = None
        for idx, (t, (shape, dtype, dev, what)) in enumerate(zip(state, specs)):
            # The fast test first: this runs on every forward call.
            if type(t) is torch.Tensor and t.dtype == dtype and t.shape == shape and (
                    t.device == dev or _on_device(t, dev)) and t.layout == torch.strided and t.is_contiguous():
                continue
            where = f"state[{idx}] (layer {idx // self.per_layer} {what})"
            if not isinstance(t, torch.Tensor):
                raise StateError(f"RWKV.forward: {where} must be a Tensor, got {type(t).__name__}")
            if t.layout != torch.strided:
                raise StateError(f"RWKV.forward: {where} has layout {t.layout}, expected a dense tensor "
                                 "(torch.strided); convert it with .to_dense()")
            if tuple(t.shape) != shape:
                raise StateError(f"RWKV.forward: {where} has shape {list(t.shape)}, expected {list(shape)}: "
                                 "the state comes from a different model. Pass state=None to start fresh.")
            if t.dtype != dtype:
                raise StateError(f"RWKV.forward: {where} has dtype {t.dtype}, expected {dtype} for this "
                                 "strategy; convert it with .to(dtype) or pass state=None.")
            if not _on_device(t, dev):
                raise StateError(f"RWKV.forward: {where} is on {t.device}, expected {dev} for this "
                                 "strategy; move it with .to(device) or pass state=None.")
            if not t.is_contiguous():
                if copied is None:
                    copied = list(state)
                copied[idx] = t.detach().contiguous()
        return state if copied is None else copied

    # --------------------------------------------------------------------------------- forward
    def forward(self, tokens: torch.Tensor, state: list, full_output: bool):
        """tokens: [T] int64 on CPU, already validated. Returns (logits fp32, new state list).
        The input state's tensors are never written: the kernels update private copies."""
        return self.run(self.emb[tokens], state, full_output, tokens)

    def step_rows(self, tokens: torch.Tensor, state: list, flat: list | None = None) -> torch.Tensor:
        """One token of each of B sequences: tokens [B] int64 on CPU (validated), state the B
        sequences' states stacked (zero_batch's layout, each entry contiguous), updated in place.
        Each weight is read once for all B rows (the products take the B rows as one matrix); the
        recurrences of the B rows run as one token with B times the heads. Returns logits [B, V]
        fp32. Row b's results are those of ``forward`` on sequence b alone, up to the rounding of
        products computed for several rows at once. Runs as a step plan where the model has one
        (the same ops), otherwise op by op. flat: ``flat_rows(state)``, where the caller keeps
        it from step to step."""
        if self.plans is not None:
            logits = self.plans.step_rows(tokens, state if flat is None else None, flat)
            if logits is not None:
                return logits
        info, per = self.info, self.per_layer
        x = self.emb[tokens]
        v_first = None
        for i in range(info.n_layer):
            x = moved(x, self.plan[i].atype, self.devices[i])
            s = state[i * per:(i + 1) * per]
            att, ffn = self.att[i], self.ffn[i]
            if info.version == 4:
                x = ffn.rows(att.rows(x, *s[:4]), s[4])
            else:
                if info.version == 7:
                    x, v_first = att.rows(x, s[0], s[1], v_first)
                else:
                    x = att.rows(x, s[0], s[1])
                x = ffn.rows(x, s[2], tokens)
            if self.rescale > 0 and (i + 1) % self.rescale == 0:
                x = x / 2
        x = moved(x, self.plan[info.n_layer].atype, self.devices[info.n_layer])
        return self.head(self.head_norm(x), torch.float32)

    def program(self, B: int, inplace: bool) -> Program:
        """One decode step of B rows as a Program (rwkv/models/program.py), built from the
        layers' own steps: inputs [x (the B embedding rows), the token ids (DeepEmbed models
        only), *state]; results [logits, *new state] (one-token: B = 1, not in place; logits
        [V]) or [logits [B, V]] (``inplace``: the state entries, stacked as step_rows takes them
        and flattened as ``flat_rows`` gives them, updated in place). Raises Unsupported when a
        layer or the head has no compiled steps."""
        info, per = self.info, self.per_layer
        if any(d.type != "cpu" for d in self.devices):
            raise Unsupported("the strategy puts layers or the head on a device other than the CPU")
        if not inplace and B != 1:
            raise ValueError("Runtime.program: a program that is not in place takes one row")
        p = Program(B, inplace)
        x = p.input(self.emb.dtype)
        ids = p.input(torch.int64) if info.deep_embed else None
        state = [p.input(dtype) for i in range(info.n_layer) for _, dtype, _, _ in self.state_spec(i)]
        new_state: list = []
        v_first = None
        for i in range(info.n_layer):
            x = p.to(x, self.plan[i].atype)
            s = state[i * per:(i + 1) * per]
            att, ffn = self.att[i], self.ffn[i]
            if info.version == 4:
                x, *new = att.steps(p, x, *s[:4])
                x, sf = ffn.steps(p, x, s[4])
            else:
                if info.version == 7:
                    x, v_first, *new = att.steps(p, x, s[0], s[1], v_first)
                else:
                    x, *new = att.steps(p, x, s[0], s[1])
                x, sf = ffn.steps(p, x, s[2], ids)
            new_state += [*new, sf]
            if self.rescale > 0 and (i + 1) % self.rescale == 0:
                x = p.call(torch.ops.aten.div.Scalar, x, 2)
        x = p.to(x, self.plan[info.n_layer].atype)
        logits = self.head.steps(p, self.head_norm.steps(p, x), torch.float32)
        if not inplace:
            logits = p.call(torch.ops.aten.select.int, logits, 0, 0)
        p.results = [logits] + ([] if inplace else new_state)
        return p

    def flat_rows(self, state: list) -> list:
        """B stacked states (step_rows' layout) as an in-place program takes them: matrix states
        [B, H, N, N] as [B*H, N, N], RWKV-4's aa, bb, pp [B, A] as [B*A], and for B = 1 the shift
        states [1, C] as [C], the one-token ops' layout (views)."""
        one = state[0].shape[0] == 1
        shift = (lambda t: t.view(t.shape[1:])) if one else (lambda t: t)  # noqa: E731
        if self.info.version == 4:
            return [shift(t) if k % 5 in (0, 4) else t.view(-1) for k, t in enumerate(state)]
        return [t.view(-1, *t.shape[2:]) if k % 3 == 1 else shift(t) for k, t in enumerate(state)]

    def run(self, x: torch.Tensor, state: list, full_output: bool, tokens: torch.Tensor | None = None):
        """``forward`` from embedding rows x: [T, C] (moved to layer 0's device and dtype). tokens:
        the ids of x's rows ([T] int64), which DeepEmbed channel mixes read (others ignore it).
        Captured in a CUDA graph by models/cuda_graph.py: no host syncs or data-dependent branches
        here."""
        info, per = self.info, self.per_layer
        if info.deep_embed and tokens is None:
            raise ValueError("RWKV: this DeepEmbed model's channel mix reads each row's token id; "
                             "pass the ids of x's rows (tokens=...)")
        new_state = list(state)
        v_first = None
        # Shift states are the last row of a [T, C] activation; for T > 1 keep a copy of the row, not
        # a view that would pin (and make copy.deepcopy duplicate) the whole activation.
        own = (lambda t: t.clone()) if rows(x) > 1 else (lambda t: t)  # noqa: E731
        for i in range(info.n_layer):
            dd, dev = self.plan[i], self.devices[i]
            x = moved(x, dd.atype, dev)
            s = state[i * per:(i + 1) * per]
            att, ffn = self.att[i], self.ffn[i]
            if info.version == 4:
                x, sx, aa, bb, pp = att(x, s[0], *s[1:4])
                x, sf = ffn(x, s[4])
                new_state[i * per:(i + 1) * per] = [own(sx), aa, bb, pp, own(sf)]
            else:  # the time mix makes the new matrix state (the caller's is never written)
                if info.version == 7:
                    x, sx, v_first, S = att(x, s[0], s[1], v_first)
                else:
                    x, sx, S = att(x, s[0], s[1])
                x, sf = ffn(x, s[2], tokens)
                new_state[i * per:(i + 1) * per] = [own(sx), S, own(sf)]
            if self.rescale > 0 and (i + 1) % self.rescale == 0:
                x = x / 2
        if not full_output and rows(x) > 1:
            x = x[-1:]
        hd = self.plan[info.n_layer]
        x = moved(x, hd.atype, self.devices[info.n_layer])
        x = self.head_norm(x)
        logits = self.head(x, torch.float32)
        if rows(logits) == 1:
            logits = logits[0]
        return logits, new_state
