"""Opt-in CUDA-graph decode: ``RWKV(..., cuda_graph=True)``.

One-token ``forward`` calls replay a CUDA graph of ``Runtime.run`` instead of launching every kernel
from Python. The graph is captured lazily, on the model's first one-token call, over static device
buffers: the embedding row (already in layer 0's dtype) and the recurrent state. Each call copies the
caller's state into the static state, replays, and clones the graph's outputs (logits and the new
state) into new tensors, so the caller's tensors are never written and nothing returned is
overwritten by a later call. The graph runs the same ops with the same inputs as the plain path, so
its results equal the plain path's.

Supported strategies put every layer and the head on one CUDA device with no streamed layer (no
``*N+`` that leaves layers in CPU memory): a graph cannot copy weights from pageable host memory per
call, nor cross devices. Other strategies raise ``ValueError`` when the model is built (an explicit
opt-in that silently did nothing would hide a misconfiguration). Sequence calls (more than one
token) always take the plain path.

Capturability of ``Runtime.run`` for one token on one CUDA device (reviewed; keep it so): no
``.item()``/``int()``/``bool()`` on device tensors (token ids are range-checked on CPU before), no
data-dependent Python branches (only shapes), no host<->device copies (the embedding row is copied
in before replay; ``.to(device)`` calls are no-ops on one device), and every op, compiled or
reference, only launches kernels and allocates from torch's caching allocator (the graph's pool).
"""

from __future__ import annotations

import torch

from ..strategy import LayerPlacement

WARMUP_RUNS = 2  # eager runs on a side stream before capture (cuBLAS handles, lazy inits)


def graph_device(plan: list[LayerPlacement], strategy: str) -> torch.device:
    """The one CUDA device of ``plan`` (layers, then the head), or ``ValueError`` saying why the
    strategy cannot use a CUDA graph. ``cuda`` means the current CUDA device, as at weight placement."""
    found: dict[int | None, str] = {}
    last = len(plan) - 1
    for slot, dd in enumerate(plan):
        what = "the head" if slot == last else f"layer {slot}"
        dev = torch.device(dd.device)
        if dev.type != "cuda":
            raise ValueError(
                f"RWKV: cuda_graph=True needs every layer and the head on one CUDA device, but strategy "
                f"{strategy!r} puts {what} on {dd.device!r}. Use a strategy such as 'cuda fp16', or pass "
                "cuda_graph=False.")
        if dd.stream and slot != last:  # the head never streams (upstream streams block matrices only)
            raise ValueError(
                f"RWKV: cuda_graph=True cannot capture strategy {strategy!r}: {what} is streamed ('*N+'), "
                "so its weights are copied from CPU memory on every call, which a captured graph cannot "
                "repeat. Keep every layer on the device (no '+'), or pass cuda_graph=False.")
        found.setdefault(dev.index, dd.device)
    if None in found:  # 'cuda': the device current now, where the weights are placed
        current = torch.cuda.current_device() if torch.cuda.is_available() else 0
        found.setdefault(current, found.pop(None))
    if len(found) != 1:
        names = ", ".join(sorted(set(found.values())))
        raise ValueError(
            f"RWKV: cuda_graph=True needs every layer and the head on one CUDA device, but strategy "
            f"{strategy!r} uses several ({names}). Use one device, or pass cuda_graph=False.")
    return torch.device("cuda", next(iter(found)))


def _copy_all(dst: list, src: list) -> None:
    """dst[i].copy_(src[i]) for all i, as one multi-tensor copy per dtype rather than one launch per
    tensor (3 to 5 per layer, whose launch overhead would otherwise rival a small model's replay).
    torch's fused copy needs one dtype per list (it falls back to single copies otherwise)."""
    if not hasattr(torch, "_foreach_copy_"):
        for d, s in zip(dst, src):
            d.copy_(s)
        return
    groups: dict = {}
    for d, s in zip(dst, src):
        lists = groups.setdefault((d.dtype, s.dtype), ([], []))
        lists[0].append(d)
        lists[1].append(s)
    for d, s in groups.values():
        torch._foreach_copy_(d, s)


class CudaGraphDecoder:
    """Replays a captured one-token ``runtime.run`` on ``device`` (see the module docstring)."""

    def __init__(self, runtime, device: torch.device):
        self.rt = runtime
        self.device = device
        self.graph: torch.cuda.CUDAGraph | None = None
        self._x = None          # [1, C] embedding row in layer 0's activation dtype
        self._state_in = None   # the recurrent state the graph reads
        self._logits = None     # [V] fp32, written by each replay
        self._state_out = None  # the new state, written by each replay
        # DeepEmbed models: the token id [1] int64 on the device, which the graph's channel mixes
        # gather their table rows with (the tables are on the device: rwkv/model.py, _place).
        self._ids = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def forward_one(self, token: int, state: list):
        """token: an id, already range-checked; state: a validated state list (not written).
        Returns (logits [V] fp32, new state list of new tensors), like ``Runtime.forward``."""
        if self.graph is None:
            self._capture(state)
        with torch.cuda.device(self.device):
            # The same CPU-to-device copy (and dtype conversion) as the plain path's x.to(dtype, device).
            self._x.copy_(self.rt.emb.narrow(0, token, 1))
            if self._ids is not None:
                self._ids.fill_(token)
            _copy_all(self._state_in, list(state))
            self.graph.replay()
            logits = self._logits.clone()
            new_state = [torch.empty_like(t) for t in self._state_out]
            _copy_all(new_state, self._state_out)
        return logits, new_state

    def _capture(self, state: list) -> None:
        rt, dev = self.rt, self.device
        with torch.cuda.device(dev):
            x = torch.empty((1, rt.info.n_embd), dtype=rt.plan[0].atype, device=dev)
            x.copy_(rt.emb[:1])  # any valid row; warm-up results are discarded
            state_in = [torch.empty(t.shape, dtype=t.dtype, device=dev).copy_(t) for t in state]
            ids = torch.zeros(1, dtype=torch.long, device=dev) if rt.info.deep_embed else None
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    rt.run(x, state_in, False, ids)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    logits, state_out = rt.run(x, state_in, False, ids)
            except Exception as e:
                raise RuntimeError(f"RWKV: capturing the one-token CUDA graph failed ({e}); build the "
                                   "model with cuda_graph=False to run without it") from e
        self._x, self._state_in, self._ids = x, state_in, ids
        self._logits, self._state_out = logits, list(state_out)
        self.graph = graph
