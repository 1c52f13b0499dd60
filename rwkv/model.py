"""``rwkv.model.RWKV``: the upstream-compatible model class for every RWKV version (4, 5.x, 6, 7).

Data flow: checkpoint file -> ``loading`` (safe read, version detection, validation) ->
``strategy`` (which layer goes where, in which dtype) -> ``convert`` (upstream's load-time
transforms, int8 quantization) -> device placement -> ``models.Runtime`` (the forward pass).
"""

from __future__ import annotations

import ctypes
import os
import sys
import types

import numpy as np
import torch

from . import deep_embed, hugepages, ops, slabs
from ._compat_env import read_env, resolve_kernels, resolve_rescale
from .convert import (STREAM_NAMES, check_converted, convert_classic, convert_v7, converted_payload,
                      slot_of)
from .files import save_atomic
from .loading import (CheckpointError, ModelInfo, check_finite, copy_out_of_mapping, inspect_checkpoint,
                      open_checkpoint, read_checkpoint, resolve_path)
from .models.base import Runtime, StateError, TokenError
from .models.common import _compiled
from .models.step_plan import StepPlans, want_plan
from .models.cuda_graph import CudaGraphDecoder, graph_device
from .strategy import StrategyError, parse_strategy, plan_layers
from .upstream_v7 import WeightsView, one_step

__all__ = ["RWKV", "convert_checkpoint", "StateError", "TokenError", "CheckpointError", "StrategyError",
           "DeviceUnavailableError"]


class DeviceUnavailableError(ValueError):
    """The strategy names a device this machine or this torch build cannot use."""


def _check_devices(strat) -> None:
    """Fail before any conversion or placement when a strategy asks for a device that is not there."""
    for seg in strat.segments:
        dev = torch.device(seg.device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                why = ("this torch is a CPU-only build" if torch.version.cuda is None
                       else "no CUDA GPU is visible")
                raise DeviceUnavailableError(
                    f"RWKV: strategy segment {seg.text.strip()!r} asks for {seg.device!r}, but {why}; "
                    "use a 'cpu ...' strategy (e.g. 'cpu fp32' or 'cpu bf16') or install a CUDA build "
                    "of torch")
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise DeviceUnavailableError(
                    f"RWKV: strategy segment {seg.text.strip()!r} asks for {seg.device!r}, but only "
                    f"{torch.cuda.device_count()} CUDA device(s) are visible (cuda:0..cuda:"
                    f"{torch.cuda.device_count() - 1})")
        elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise DeviceUnavailableError(
                f"RWKV: strategy segment {seg.text.strip()!r} asks for 'mps', which this machine or torch "
                "build does not support; use a 'cpu ...' strategy")


def _load(model, strategy, rescale_layer, kernels):
    env = read_env()
    strat = parse_strategy(strategy)
    path = resolve_path(model)
    # Mapped, so that a model larger than the free memory still loads (pages are read as converted);
    # RWKV() copies what it keeps out of the mapping (copy_out_of_mapping) before dropping it.
    sd, mapped = open_checkpoint(path, mmap=True)
    info = inspect_checkpoint(sd, path)
    check_finite(sd, path)
    plan = plan_layers(strat, info.n_layer)
    rescale = resolve_rescale(env, strat.normalized, info.version, rescale_layer)
    mode = resolve_kernels(env, kernels)
    return env, strat, path, sd, mapped, info, plan, rescale, mode


def _convert(sd, info, plan, rescale, strategy_string, path):
    if info.converted:
        return check_converted(sd, strategy_string, rescale, path)
    if info.version == 7:
        return convert_v7(sd, info, plan)
    return convert_classic(sd, info, plan, rescale)


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """A dense (pinned) host copy of a streamed matrix in its layout: a column-major (in, out) view
    stays column-major, so the per-call device copy is what mm8 (and gemm_fp16) read in place."""
    if t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous():
        return (t.t().pin_memory() if pin else t.t()).t()
    t = t.contiguous()
    return t.pin_memory() if pin else t


# Low-rank factors used as ``x @ W`` (v7 time mix; v6 token-shift and decay).
LORA_NAMES = tuple(f".att.{n}" for n in ("w1", "w2", "a1", "a2", "v1", "v2", "g1", "g2",
                                         "time_maa_w1", "time_decay_w1", "time_decay_w2"))


def release_freed_memory() -> None:
    """Give the C heap's free memory back to the OS (glibc's ``malloc_trim``; nothing elsewhere).
    Loading frees many weight-sized temporaries (conversion, int8 quantization, the move into huge
    pages) that glibc otherwise keeps for reuse: a 1.5B-shaped int8 model left the process at
    11.2 GB of resident memory, 2.2 GB after the trim."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _place(w: dict, plan, n_layer: int, tables_on_device: bool = False) -> None:
    """Move weights to their layer's device. The embedding stays on CPU (rows are copied per call);
    CPU weights keep upstream's (in, out) column-major views; streamed matrices stay in CPU memory
    (pinned when CUDA is available) and are copied to the device for each call. Weights of CPU
    layers move into transparent huge pages (rwkv/hugepages.py): decode streams them faster. The
    small low-rank factors of v6/v7 (LORA_NAMES) are stored column-major on CPU, as the big
    matrices are, so one-token products can use the matrix-vector kernel (same values, several
    times torch's speed on these narrow shapes, while torch's prefill GEMMs run as fast with
    either layout). Big CPU matrices
    whose one-token activation would not stay in the L1 cache (int8 with more than 4096 rows,
    bf16/fp32 with more than 2048) are stored as row slabs (rwkv/slabs.py: faster decode), a
    [slabs, rows, out] tensor in ``w``.

    DeepEmbed tables (``ffn.s_emb.weight``, V x 1024 per layer, most of a small model's bytes) of
    layers on another device stay in CPU memory unless ``tables_on_device``: a token reads one row
    of each, so gathering the rows on the CPU and copying them over (T x 2 KiB a layer in fp16)
    costs far less than the device memory the tables would take. A CUDA graph cannot gather from
    host memory, so ``cuda_graph=True`` puts them on the device (``tables_on_device``)."""
    pin = torch.cuda.is_available()
    on_cpu = []
    for key in list(w):
        t = w[key]
        if key.startswith("emb."):
            w[key] = t.contiguous()
            continue
        dd = plan[slot_of(key, n_layer)]
        if dd.device == "cpu":
            if (key.endswith(LORA_NAMES) and t.dim() == 2 and t.dtype in (torch.bfloat16, torch.float32)
                    and not t.t().is_contiguous()):
                w[key] = t.t().contiguous().t()
            if key.endswith(".weight"):  # the big matrices, all used through Projection
                w[key] = slabs.for_decode(w[key])
            on_cpu.append(key)
            continue
        if key.endswith(deep_embed.TABLE) and not tables_on_device:
            continue  # stays in CPU memory (see above)
        if dd.stream and key.endswith(STREAM_NAMES):
            w[key] = _host_copy(t, pin)
        else:
            w[key] = t.to(device=dd.device)
    hugepages.pack(w, on_cpu)


def convert_checkpoint(model, strategy: str, out: str, *, rescale_layer: int | None = None) -> str:
    """Write a pre-converted file for ``strategy`` (upstream's ``convert_and_save_and_exit`` format,
    loadable by upstream for v4/v5.x, and by us for every version including v6 and v7), without
    exiting the process. Returns the path written (``.pth`` appended when missing)."""
    env, strat, path, sd, _, info, plan, rescale, _ = _load(model, strategy, rescale_layer, "reference")
    if info.converted:
        raise CheckpointError(f"convert_checkpoint: {path!r} is already converted")
    w = _convert(sd, info, plan, rescale, strat.normalized, path)
    out = os.fspath(out).strip()
    if not out.endswith(".pth"):
        out += ".pth"
    # A new file renamed into place: the source (possibly the same path) stays mapped and intact.
    return save_atomic(converted_payload(w, strat.normalized, rescale), out)


_NO_TOKENS = "RWKV.forward: tokens is empty; pass at least one token id"


class RWKV(torch.nn.Module):
    """Drop-in for upstream's ``RWKV(model, strategy, verbose=True, convert_and_save_and_exit=None)``.

    Loads v4, v5.0/5.1/5.2, v6 and v7 checkpoints in one process (no RWKV_V7_ON needed), with any
    strategy for any version (int8 and multi-device v7 included). ``forward(tokens, state,
    full_output=False)`` returns ``(logits, state)`` with upstream's state layout and fp32 logits.

    Keyword-only extras: ``kernels="auto"|"compiled"|"reference"`` (env ``RWKV_KERNELS``) forces the
    op implementation; ``exact_int8=True`` (env ``RWKV_EXACT_INT8=1``) keeps one-token int8 products
    on CPU in fp32 as upstream does, instead of rounding the activation to int16 (faster; error far
    below the int8 weight's own, docs/kernels.md); ``rescale_layer`` overrides
    ``RWKV_RESCALE_LAYER``; ``cuda_graph=True``
    replays a CUDA graph for one-token calls (one CUDA device, no streaming, else ``ValueError``;
    see ``rwkv/models/cuda_graph.py``); ``cpu_plan`` (None: where supported, unless
    ``RWKV_CPU_PLAN=0``; True: required; False: off) runs decode steps on CPU (one-token calls and
    the batched engine's steps) as compiled step plans (same results, no Python between the ops;
    ``rwkv/models/step_plan.py``).
    """

    def __init__(self, model, strategy, verbose=True, convert_and_save_and_exit=None, *,
                 kernels: str | None = None, rescale_layer: int | None = None, cuda_graph: bool = False,
                 exact_int8: bool | None = None, cpu_plan: bool | None = None):
        """Load a checkpoint and place its layers as ``strategy`` says.

        model: checkpoint path (``.pth`` appended when missing, as upstream; ``.safetensors`` and
        upstream's pre-converted files load too). strategy: e.g. ``"cpu fp32"``, ``"cuda fp16"``,
        ``"cuda fp16i8 *20 -> cpu fp32"`` (README, "Strategies"). verbose: print the plan.
        convert_and_save_and_exit: upstream's keyword (write a pre-converted file and exit the
        process); ``convert_checkpoint`` does the same without exiting. The keyword-only options
        are described on the class. Raises ``StrategyError`` for a bad strategy,
        ``CheckpointError`` for an unusable file and ``DeviceUnavailableError`` for a device this
        machine lacks (all ``ValueError``)."""
        super().__init__()
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"RWKV: cuda_graph must be True or False, got {cuda_graph!r}")
        if exact_int8 is not None and not isinstance(exact_int8, bool):
            raise TypeError(f"RWKV: exact_int8 must be True, False or None, got {exact_int8!r}")
        env, strat, path, sd, mapped, info, plan, rescale, mode = _load(model, strategy, rescale_layer, kernels)
        graph_dev = graph_device(plan, strat.normalized) if cuda_graph else None
        use_cpu_plan = want_plan(cpu_plan, plan, mode, strat.normalized)
        if convert_and_save_and_exit is None:
            _check_devices(strat)  # converting needs no device, like upstream's convert_model.py
        if convert_and_save_and_exit is not None and info.converted:
            raise CheckpointError(f"RWKV: {path!r} is already converted; convert the original checkpoint")
        if verbose:
            print(f"RWKV_JIT_ON {int(env.jit_on)} RWKV_CUDA_ON {int(env.cuda_on)} RESCALE_LAYER {rescale}\n")
            print(f"Loading {path} ...")
            if info.converted:
                print(f"Converted model: strategy {sd.get('_strategy')}, version {sd.get('_version')}\n")
            print(f"Model detected: {info.version_label}" + (" DeepEmbed" if info.deep_embed else ""))
        w = _convert(sd, info, plan, rescale, strat.normalized, path)
        if convert_and_save_and_exit:
            out = os.fspath(convert_and_save_and_exit).strip()
            out = out if out.endswith(".pth") else out + ".pth"
            save_atomic(converted_payload(w, strat.normalized, rescale), out)
            if verbose:
                print(f"Saved converted model to {out}")
            sys.exit(0)  # upstream's behaviour; use rwkv.model.convert_checkpoint to keep running
        _place(w, plan, info.n_layer, tables_on_device=cuda_graph)
        if mapped:
            # Nothing kept may view the file: rewriting it while the model lives must not fault.
            copy_out_of_mapping(w, sd)
        del sd
        release_freed_memory()
        self.w = w
        self.info = info
        self.version = {4: 4, 5: 5, 5.1: 5.1, 5.2: 5.2, 6: 6, 7: 7}[info.version]
        self.RESCALE_LAYER = rescale
        self.kernels = mode
        self.strategy = [types.SimpleNamespace(device=dd.device, atype=dd.atype, wtype=dd.wtype,
                                               stream=dd.stream) for dd in plan]
        self.args = types.SimpleNamespace(
            MODEL_NAME=path, strategy_string=strat.normalized, n_embd=info.n_embd, n_att=info.n_att,
            n_ffn=info.n_ffn, n_layer=info.n_layer, vocab_size=info.vocab_size,
            time_state=info.has_time_state)
        if info.n_head is not None:
            self.args.n_head, self.args.head_size = info.n_head, info.head_size
        # Upstream v7 names, for code written against RWKV_x070.
        self.n_embd, self.n_layer, self.n_head, self.head_size = (info.n_embd, info.n_layer, info.n_head,
                                                                  info.head_size)
        self.exact_int8 = env.exact_int8 if exact_int8 is None else exact_int8
        self._rt = Runtime(info, w, plan, rescale, mode, self.exact_int8)
        self.cuda_graph = cuda_graph
        self._graph = CudaGraphDecoder(self._rt, graph_dev) if cuda_graph else None
        if use_cpu_plan:
            self._rt.plans = StepPlans(self._rt, explicit=cpu_plan is True)
            if cpu_plan:  # required: built now, so that a model without compiled steps says so here
                self._rt.plans.get(1, False)
        if verbose:
            self._print_plan(plan)

    # ------------------------------------------------------------------------------ public API
    def forward(self, tokens, state, full_output=False):
        """Run ``tokens`` (a list/array/1-D tensor of ids, or one int) from ``state`` (None or a state
        list from this model). Returns ``(logits, state)``.

        Classic versions (4/5/6) update the caller's list in place and return it, like upstream;
        v7 returns a new list and leaves the caller's list alone, like upstream's v7 class. In both
        cases the caller's tensors are never written, so a shallow copy of a state is a snapshot.
        """
        with torch.no_grad():
            one = self._single_id(tokens)  # an int or a list of one int: no ids tensor
            ids = None if one is not None else self._token_ids(tokens)
            if state is None:
                state_in = self._rt.zero_state()
            else:
                state_in = self._rt.validate_state(state)
            done = None
            if ids is None or ids.numel() == 1:  # one token: same result, logits [V]
                token = one if ids is None else int(ids[0])
                if self._graph is not None:
                    done = self._graph.forward_one(token, state_in)
                elif self._rt.plans is not None:
                    done = self._rt.plans.forward_one(token, state_in)
            if done is not None:
                logits, new_state = done
            else:
                ids = torch.tensor([one], dtype=torch.long) if ids is None else ids
                logits, new_state = self._rt.forward(ids, state_in, bool(full_output))
            if state is None or self.version == 7 or not isinstance(state, list):
                return logits, new_state
            state[:] = new_state
            return logits, state

    def forward_batch(self, tokens, states=None, full_output=False):
        """``forward`` for B sequences at once: ``tokens`` a list of B token lists (ragged),
        ``states`` None or a list of B states (an entry None: a fresh start). Returns ``(logits
        [B, V] fp32, list of B new states)`` (with ``full_output``, logits is a list of [T_i, V]).
        Equal to B separate ``forward`` calls; each weight is read once for all B last tokens; the
        caller's states are never written. See ``rwkv.engine`` (also ``BatchDecoder``, slots for
        servers)."""
        from .engine import forward_batch

        return forward_batch(self, tokens, states, full_output)

    @property
    def z(self) -> WeightsView:
        """Upstream v7's weight dict ``model.z`` (``z['emb.weight']``: the LN0-folded embedding),
        a read-only view of ``model.w`` (rwkv/upstream_v7.py says where the layouts differ)."""
        return WeightsView(self.w)

    def forward_one_alt(self, x: torch.Tensor, state: list, token=None):
        """Upstream v7's one-step call for CUDA-graph decoding: x is the token's embedding row [C]
        (``model.z['emb.weight'][token]``, any float dtype, on any device: it is moved to layer 0's
        device and dtype), state a state list of this model (not written). Returns (logits [V] fp32,
        a new state list), as ``forward([token], state)`` does. On a strategy with every layer and
        the head on one CUDA device, a call can be captured in a ``torch.cuda.graph`` (upstream's
        README). DeepEmbed models also need ``token``, the id x belongs to (an int; for graph
        capture a one-element int64 tensor on the device, with the model built with
        ``cuda_graph=True``, which keeps the DeepEmbed tables on the GPU); without it a ValueError
        says so (upstream's DeepEmbed forward_one_alt fails with a NameError)."""
        return one_step(self, x, state, token)

    def generate_zero_state(self) -> list:
        """A fresh initial state (including a state-tuned initial state, if one is loaded)."""
        return self._rt.zero_state()

    def load_state_tuning(self, source) -> None:
        """Use a state-tuning file (``blocks.{i}.att.time_state`` tensors of shape (H, N, N), as
        produced by RWKV-LM state tuning for v5/v6/v7) as the initial state of every forward with
        ``state=None``. ``source`` is a path (.pth or .safetensors) or a dict of tensors."""
        if self.version == 4:
            raise ValueError("load_state_tuning: RWKV-4 has no matrix state to tune")
        # Read into memory and closed: the file may be rewritten while the model uses the state.
        sd = read_checkpoint(resolve_path(source)) if not isinstance(source, dict) else source
        H, N, L = self.info.n_head, self.info.head_size, self.info.n_layer
        states = []
        for i in range(L):
            key = f"blocks.{i}.att.time_state"
            if key not in sd:
                raise CheckpointError(f"load_state_tuning: {key!r} is missing (expected one per layer, "
                                      f"{L} layers)")
            t = sd[key]
            if not isinstance(t, torch.Tensor) or t.numel() != H * N * N:
                raise CheckpointError(f"load_state_tuning: {key} has shape {list(getattr(t, 'shape', []))}, "
                                      f"expected [{H}, {N}, {N}] for this model")
            t = t.reshape(H, N, N).float()
            if self.version < 7:
                t = t.transpose(1, 2)  # stored [head, value, key]; v5/v6 states are [head, key, value]
            states.append(t.to(self._rt.devices[i]).contiguous())
        self._rt.initial_matrix_state = states

    # ------------------------------------------------------------------------------- internals
    def _single_id(self, tokens):
        """The id of a decoding step's usual argument, one int or a list of one int, range-checked;
        None for anything else (then _token_ids). No tensor is made for it: while decoding, a
        tensor of one id and the embedding row indexed by it cost several times more than the row
        as a view (their code and data evicted by the weights streamed in between)."""
        if type(tokens) is list and len(tokens) == 1:
            tokens = tokens[0]
        if type(tokens) is not int:  # (bool, numpy ints and the rest: _token_ids)
            return None
        self._check_id_range(tokens, tokens)
        return tokens

    def _token_ids(self, tokens) -> torch.Tensor:
        """Ids as a [T] int64 CPU tensor. Accepted: an int, a list or tuple of ints, a 1-D integer numpy
        array or an integer tensor (0-D or 1-D); anything else (dicts, sets, bytes, strings, iterators)
        is a TokenError. Ranges are checked on the values as given, so an unsigned id that does not fit
        int64 is reported as itself, not wrapped."""
        if isinstance(tokens, (bool, np.bool_)):
            raise TokenError(f"RWKV.forward: tokens must be token ids, got {tokens!r}")
        if isinstance(tokens, (int, np.integer)):
            tokens = [int(tokens)]
        if isinstance(tokens, torch.Tensor):
            if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
                raise TokenError(f"RWKV.forward: tokens must be an integer tensor, got {tokens.dtype}")
            if tokens.dim() > 1:
                raise TokenError(f"RWKV.forward: tokens must be 1-D, got shape {list(tokens.shape)}")
            if tokens.layout != torch.strided or tokens.device.type not in ("cpu", "cuda"):
                raise TokenError(f"RWKV.forward: tokens must be a dense CPU or CUDA tensor, got "
                                 f"{tokens.layout} on {tokens.device}")
            tokens = tokens.detach().reshape(-1).cpu()
            if tokens.dtype in (torch.uint16, torch.uint32, torch.uint64):
                tokens = tokens.numpy()  # torch has no min/max for these; numpy does, exactly
            else:
                ids = tokens.to(dtype=torch.long)
        if isinstance(tokens, np.ndarray):
            if tokens.dtype.kind not in "iu" or tokens.ndim != 1:
                raise TokenError(f"RWKV.forward: a numpy tokens array must be 1-D of integers, got "
                                 f"{tokens.dtype} with shape {list(tokens.shape)}")
            if tokens.size == 0:
                raise TokenError(_NO_TOKENS)
            self._check_id_range(int(tokens.min()), int(tokens.max()))  # before any cast to int64
            return torch.from_numpy(tokens.astype(np.int64, copy=True))
        if not isinstance(tokens, torch.Tensor):
            if not isinstance(tokens, (list, tuple)):
                raise TokenError(f"RWKV.forward: tokens must be a list of token ids (or a tuple, a 1-D "
                                 f"integer numpy array or tensor), got {type(tokens).__name__}")
            for t in tokens:
                if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                    raise TokenError(f"RWKV.forward: every token must be an int, got {t!r} "
                                     f"({type(t).__name__})")
            if not tokens:
                raise TokenError(_NO_TOKENS)
            vals = [int(t) for t in tokens]
            self._check_id_range(min(vals), max(vals))  # on Python ints: no tensor ops per token
            return torch.tensor(vals, dtype=torch.long)
        if ids.numel() == 0:
            raise TokenError(_NO_TOKENS)
        self._check_id_range(int(ids.min()), int(ids.max()))
        return ids

    def _check_id_range(self, lo: int, hi: int) -> None:
        V = self.info.vocab_size
        if lo < 0 or hi >= V:
            bad = lo if lo < 0 else hi
            raise TokenError(f"RWKV.forward: token id {bad} is out of range for this model's vocabulary "
                             f"(valid ids are 0..{V - 1})")

    def _print_plan(self, plan) -> None:
        L = self.info.n_layer
        print(f"Strategy: (total {L}+1={L + 1} layers)")
        groups, start = [], 0
        for n in range(1, L + 2):
            if n == L + 1 or plan[n] != plan[start]:
                groups.append((start, n - 1, plan[start]))
                start = n
        wkv = f"wkv{int(self.info.version)}_forward"
        for a, b, dd in groups:
            dev_type = torch.device(dd.device).type
            compiled = self.kernels != "reference" and _compiled(wkv, dev_type.upper())
            impl = f"compiled({dev_type})" if compiled else "reference"
            span = f"layers {a}-{b}" if a != b else f"layer {a}"
            if b == L:
                span += " (head)" if a == b else " + head"
            op = self._rt.int8_decode_op(a)
            int8 = f"  int8 decode={op}" if op else ""
            print(f"  {span:<22} {dd.device} {dd.dtype}{' i8' if dd.quant else ''}"
                  f"{' stream' if dd.stream else ''}  {wkv}={impl}{int8}")
        if self.info.deep_embed:
            where = sorted({str(self.w[f"blocks.{i}.{deep_embed.TABLE}"].device) for i in range(L)})
            print(f"  DeepEmbed token tables in {', '.join(where)} memory (one row per token gathered)")
        print(f"  CPU ISA: {ops.cpu_isa()}")
