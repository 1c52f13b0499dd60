"""DeepEmbed RWKV-7 checkpoints ("RWKV-7a"): their keys, shapes, load-time merge and channel-mix gate.

Everything this package knows about DeepEmbed lives here, so that key detection and shape rules
have one home (``rwkv/loading.py`` and ``rwkv/convert.py`` call these functions).

A DeepEmbed checkpoint is a v7 checkpoint whose channel mix has, per layer i (``blocks.{i}.ffn.``):

    s_emb.weight    [V, 1024]   a per-token table (one row per vocabulary entry)
    s_emb_x.weight  [1024, C]   a projection of the (LN0-folded) embedding into that table
    s1              [C, 32]     first factor of the gate
    s2              [32, F]     second factor of the gate
    s0              [F]         the gate's bias

Load time (upstream's RWKV_DE_VERSION=1 loader, reference-behaviour 4.8 step 6): the table absorbs
the embedding's projection, ``s_emb += LN0(emb) @ s_emb_x^T``, in the activation dtype, after the
embedding's LN0 fold; ``s_emb_x`` is not used after that and is dropped.

Run time (reference-behaviour 6.6): for each row t of the channel mix, with xf_t its LN2 output and
E_t the 1024 values ``s_emb[token_t]`` viewed as a 32 x 32 matrix,

    gate_t = ((xf_t @ s1) @ E_t) @ s2 + s0            [F]
    h_t    = relu(mix_t @ K)^2 * gate_t                (before the value projection)

Each row's gate depends only on that row's LN2 output and token id, so any set of rows (one
sequence's tokens or the rows of several sequences) computes it the same way.

The tables are V x 1024 per layer, most of a small model's bytes (0.1B: 12 layers x 65536 x 1024),
and a token reads one row of each. ``rwkv/models/ffn.py`` gathers the rows where the table lives.
"""

from __future__ import annotations

import torch

ROW = 1024  # s_emb's row length: a RANK x RANK matrix per token
RANK = 32  # the gate's inner width (s1's columns, s2's rows)

TABLE = "ffn.s_emb.weight"
EMB_PROJECTION = "ffn.s_emb_x.weight"
#: The per-layer channel-mix keys of a raw DeepEmbed checkpoint (after ``blocks.{i}.``); a converted
#: file has all but EMB_PROJECTION (merged into TABLE).
RAW_KEYS = (TABLE, EMB_PROJECTION, "ffn.s1", "ffn.s2", "ffn.s0")


def is_deep_embed(sd) -> bool:
    """Whether a checkpoint's keys (raw or converted) are a DeepEmbed model's: any
    ``blocks.N.ffn.s_emb.weight``."""
    return any(k.startswith("blocks.") and k.endswith("." + TABLE) for k in sd)


def expected_shapes(n_embd: int, n_ffn: int, vocab: int, converted: bool) -> dict:
    """Key suffix (after ``blocks.{i}.``) -> expected shape, for every layer of a DeepEmbed model.
    Raw files carry s_emb_x too; converted ones (merged tables) do not."""
    C, F, V = n_embd, n_ffn, vocab
    shapes = {TABLE: (V, ROW), "ffn.s1": (C, RANK), "ffn.s2": (RANK, F), "ffn.s0": (F,)}
    if not converted:
        shapes[EMB_PROJECTION] = (ROW, C)
    return shapes


def merge_table(s_emb: torch.Tensor, emb: torch.Tensor, s_emb_x: torch.Tensor, dtype: torch.dtype,
                device: str | torch.device | None = None) -> torch.Tensor:
    """``s_emb + emb @ s_emb_x^T`` in ``dtype``, as upstream computes it there (reference-behaviour
    4.8 step 6): emb [V, C] is the LN0-folded embedding already in its activation dtype, s_emb
    [V, 1024], s_emb_x [1024, C]; returns [V, 1024] in ``dtype``, contiguous, in CPU memory.

    The product runs in fp32 from the dtype-rounded operands (exact widening) and is rounded to
    ``dtype`` once, which is what a bf16/fp16 GEMM with fp32 accumulation (upstream's on a GPU,
    oneDNN's on a CPU) gives, up to the summation order; the sum is then taken in ``dtype`` as
    upstream does. It is V x C x 1024 multiply-adds per layer (0.1B: 52 G), so it runs on
    ``device`` when that is a CUDA device (the layer's), else on the CPU with oneDNN's fp32 GEMM
    where torch has it (1.4x MKL's there; 2.2 s a layer of the 0.1B on 2 Zen 4 threads)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    e = emb.to(device=dev, dtype=dtype).float()
    x = s_emb_x.to(device=dev, dtype=dtype).float()
    prod = None
    if dev.type == "cpu":
        # (Imported here: rwkv.models imports rwkv.loading, which imports this module.)
        from .models.common import onednn_linear

        linear = onednn_linear()
        if linear is not None:
            try:
                prod = linear(e.contiguous(), x.contiguous(), None, "none", [], None)
            except RuntimeError:  # a oneDNN build that cannot run it here
                prod = None
    if prod is None:
        prod = e @ x.t()
    out = s_emb.to(device=dev, dtype=dtype) + prod.to(dtype)
    return out.to("cpu").contiguous()


def gate_math(xf: torch.Tensor, rows: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor,
              s0: torch.Tensor) -> torch.Tensor:
    """The channel-mix gate of T rows (module docstring): xf [T, C] the rows' LN2 outputs, rows
    [T, 1024] their tokens' s_emb rows, s1 [C, RANK], s2 [RANK, F], s0 [F], all in one dtype on
    one device. Returns [T, F] in that dtype, each op rounding as upstream's does."""
    z = (xf @ s1).unsqueeze(1)  # [T, 1, RANK]
    ss = torch.bmm(z, rows.reshape(-1, RANK, RANK)).squeeze(1)  # [T, RANK]
    return ss @ s2 + s0
