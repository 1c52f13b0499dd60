"""What upstream's RWKV-7 class (``RWKV_x070``) offers besides ``forward``, on our model object.

Upstream's README decodes with a CUDA graph of ``model.forward_one_alt(x, state)``, copying
``model.z['emb.weight'][token]`` into the graph's input before each replay, and sizes its buffers
with ``model.n_embd`` and ``model.args.vocab_size``. ``rwkv.model.RWKV`` provides these for every
version: ``z`` is a read-only view of the converted weights under upstream's names (``WeightsView``),
``forward_one_alt`` is ``one_step`` below.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch


class WeightsView(Mapping):
    """``model.z``: the converted weights under upstream's key names, as upstream's v7 class lays
    them out where ours differ only in storage: ``att.r_k`` flattened to [C], CPU matrices kept as
    row slabs (rwkv/slabs.py) given back as one (in, out) matrix. Everything else is ``model.w``'s
    tensor itself (no copy): ``emb.weight`` is the LN0-folded embedding [V, C] in layer 0's
    activation dtype, in CPU memory (upstream's is on its one device; ``copy_`` into a device
    buffer works from either). int8 layers give their uint8 matrices and ``_mx/_rx/_my/_ry`` side
    tensors (upstream's v7 class has no int8). Keys that upstream keeps but never reads (layer 0's
    empty ``att.v0/v1/v2``, ``blocks.0.ln0.*`` and DeepEmbed's ``ffn.s_emb_x.weight``, merged into
    the table at load) are absent."""

    def __init__(self, w: dict):
        self._w = w

    def __getitem__(self, key: str) -> torch.Tensor:
        t = self._w[key]
        if key.endswith("att.r_k"):
            return t.reshape(-1)
        if t.dim() == 3 and key.endswith(".weight"):  # row slabs [S, K, M] -> [S*K, M]
            return t.flatten(0, 1)
        return t

    def __iter__(self) -> Iterator[str]:
        return iter(self._w)

    def __len__(self) -> int:
        return len(self._w)


def one_step(model, x: torch.Tensor, state: list, token=None):
    """``model.forward_one_alt(x, state, token=None)`` (see RWKV.forward_one_alt)."""
    rt = model._rt
    C = rt.info.n_embd
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.shape[0] != C or not x.is_floating_point():
        got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"RWKV.forward_one_alt: x must be one embedding row, a floating-point tensor "
                         f"of shape [{C}] (e.g. model.z['emb.weight'][token]), got {got}")
    state = rt.validate_state(state)  # other layouts come back as contiguous copies
    ids = _token_ids(model, token)
    with torch.no_grad():
        return rt.run(x.unsqueeze(0), state, False, ids)


def _token_ids(model, token) -> torch.Tensor | None:
    """token as the [1] int64 tensor the runtime reads, or None when the model does not need it."""
    if not model._rt.info.deep_embed:
        return None  # (ignored, as upstream's signature has no token)
    if token is None:
        raise ValueError(
            "RWKV.forward_one_alt: this is a DeepEmbed model, whose channel mix reads the token id: "
            "pass token=<id> with x = model.z['emb.weight'][id] (an int; for CUDA-graph capture a "
            "one-element int64 tensor on the model's device, with the model built with "
            "cuda_graph=True so that its DeepEmbed tables are on the GPU)")
    if isinstance(token, torch.Tensor):
        if token.numel() != 1 or token.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"RWKV.forward_one_alt: token must be an int or a one-element integer "
                             f"tensor, got {token.dtype} {list(token.shape)}")
        # (Not range-checked: reading a device tensor's value would synchronise, and cannot be
        # captured in a graph. index_select checks it on the device.)
        return token.reshape(1).long()
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
        raise ValueError(f"RWKV.forward_one_alt: token must be an int or a one-element integer tensor, "
                         f"got {type(token).__name__}")
    model._check_id_range(int(token), int(token))
    return torch.tensor([int(token)], dtype=torch.long)
