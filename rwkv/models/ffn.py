"""Channel mix (the feed-forward half of a block) for every version (reference-behaviour 5.7, 6.3)."""

from __future__ import annotations

import torch

from .. import deep_embed, ops
from .program import Program, Val
from .common import LnMix, Projection, ProjectionGroup, _compiled, concrete_device, moved


class ChannelMix:
    """v4/v5.x use ``time_mix_k/r`` (lerp form), v6 ``time_maa_k/r`` (delta form), v7 ``x_k`` (delta
    form) and no receptance. Returns ``(x + out, new shift state)``; the shift state is the LN2 output.

    DeepEmbed v7 layers (rwkv/deep_embed.py) multiply the key's relu squared by a gate that depends
    on each row's token id: ``__call__(x, sx, tokens)`` takes the ids of x's rows ([T] int64), and
    ``deep_embed_gate(xf, tokens)`` is that gate for any set of rows (row by row independent, so
    rows of different sequences may share a call). The layer's s_emb table stays where
    rwkv/model.py placed it (CPU memory for CUDA layers, unless a CUDA graph needs it on the
    device): the rows are gathered there and only they are moved to the layer's device."""

    def __init__(self, w: dict, i: int, dd, version: float, mode: str, stream: bool):
        p = f"blocks.{i}."
        self.version = version
        if version == 7:
            mixes = [w[p + "ffn.x_k"]]
        else:
            prefix = p + ("ffn.time_maa_" if version == 6 else "ffn.time_mix_")
            mixes = [w[prefix + "k"], w[prefix + "r"]]
        self.ln_mix = LnMix(w, p + "ln2", mixes, version < 6, dd, mode)
        self.s_emb = w.get(p + deep_embed.TABLE) if version == 7 else None  # [V, 1024] or None
        if self.s_emb is not None:
            self.layer = i
            self.device, self.dtype = concrete_device(dd.device), dd.atype
            self.s1, self.s2, self.s0 = (w[p + n] for n in ("ffn.s1", "ffn.s2", "ffn.s0"))
        self.key = Projection(w, p + "ffn.key.weight", dd, mode, stream)
        self.value = Projection(w, p + "ffn.value.weight", dd, mode, stream)
        if version != 7:
            self.receptance = Projection(w, p + "ffn.receptance.weight", dd, mode, stream)
            self.rk = ProjectionGroup([(self.receptance, "sigmoid", None), (self.key, "relu2", None)], mode)
        else:
            self.rk = ProjectionGroup([(self.key, "relu2", None)], mode)  # (no receptance)
        # One token on CPU: the group, the value product and the residual add in one call.
        self.one_op = None
        if self.rk.op is not None and self.value._residual_one is not None \
                and _compiled("linear_one_ffn", "CPU"):
            self.one_op = ops.resolve("linear_one_ffn", "cpu", mode)

    def deep_embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The s_emb rows of ``tokens`` ([T] int64, on the CPU or on the table's device), [T, 1024]
        in the layer's dtype on its device. The ids must be in range (the model checks them)."""
        table = self.s_emb
        if tokens.device != table.device:
            if tokens.device.type != "cpu":
                raise ValueError(
                    f"RWKV: layer {self.layer}'s DeepEmbed table is in {table.device} memory, but the "
                    f"token ids are on {tokens.device}; pass them as a CPU tensor or int (tables of "
                    "CUDA layers live on the GPU only when the model is built with cuda_graph=True)")
            tokens = tokens.to(table.device)
        return moved(table.index_select(0, tokens), self.dtype, self.device)

    def deep_embed_gate(self, xf: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The DeepEmbed gate of T rows: xf [T, C] their LN2 outputs (the layer's dtype and device),
        tokens [T] int64 their token ids. Returns [T, F] in xf's dtype (rwkv/deep_embed.py)."""
        return deep_embed.gate_math(xf, self.deep_embed_rows(tokens), self.s1, self.s2, self.s0)

    def __call__(self, x: torch.Tensor, sx: torch.Tensor, tokens: torch.Tensor | None = None):
        """x [T, C], sx [C]; tokens: the ids of x's rows ([T] int64), read by DeepEmbed layers only."""
        if self.s_emb is not None:
            return self._deep_embed_call(x, sx, tokens)
        _, shift, mixed = self.ln_mix(x, sx)
        if self.version == 7:
            xs, gate = mixed, -1
        else:
            kx, rx = mixed
            xs, gate = [rx, kx], 0
        # (The value's x, the key's result, has kx's dtype and shape.)
        if self.one_op is not None and self.rk.fusable(xs) and self.value._one_token_kernel(xs[-1]) \
                and x.dtype == xs[-1].dtype:
            value = self.value
            side = self.rk.side + (list(value.one_side) if value.int8 else [])
            return self.one_op(xs, self.rk.weights + [value.weight], side, self.rk.acts, x, gate), shift
        return self._products(x, xs, gate), shift

    def rows(self, x: torch.Tensor, sx: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The batched step: row b of x [B, C] is one token of sequence b, whose shift state is
        sx[b] (updated in place); tokens [B] int64: the rows' token ids (DeepEmbed layers only).
        Returns x + out."""
        xx, mixed = self.ln_mix.rows(x, sx)
        sx.copy_(xx)
        if self.s_emb is not None:
            self._check_tokens(tokens)
            return self._deep_embed_products(x, xx, mixed, tokens)
        if self.version == 7:
            return self._products(x, mixed, -1)
        kx, rx = mixed
        return self._products(x, [rx, kx], 0)

    def steps(self, p: Program, x: Val, sx: Val, tokens: Val | None = None) -> tuple:
        """``__call__`` (a one-token program) or ``rows`` (an in-place program) as program steps;
        tokens: the rows' token ids (DeepEmbed layers). Returns (x + out, the new shift state)."""
        xx, shift, mixed = self.ln_mix.steps(p, x, sx)
        shift = p.update(sx, shift)
        if self.s_emb is not None:
            self._check_tokens(tokens)
            h = self.rk.steps(p, mixed)[0]
            gate = self._deep_embed_gate_steps(p, xx, tokens)
            return self.value.add_to_steps(p, x, p.call(torch.ops.aten.mul.Tensor, h, gate)), shift
        if self.version == 7:
            xs, gate = mixed, -1
        else:
            kx, rx = mixed
            xs, gate = [rx, kx], 0
        value = self.value
        if (self.one_op is not None and self.rk.fusable_steps(p, xs)
                and value.one_token_kernel_for(xs[-1].dtype) and x.dtype == xs[-1].dtype):
            side = self.rk.side + (list(value.one_side) if value.int8 else [])
            weights = self.rk.weights + [value.weight]
            return p.call(self.one_op, xs, weights, side, self.rk.acts, x, gate), shift
        ys = self.rk.steps(p, xs)
        return value.add_to_steps(p, x, ys[-1], gate=ys[gate] if gate >= 0 else None), shift

    def _deep_embed_gate_steps(self, p: Program, xf: Val, tokens: Val) -> Val:
        """deep_embed_gate as program steps (deep_embed.gate_math's ops, on the table's rows)."""
        aten, R = torch.ops.aten, deep_embed.RANK
        rows = p.call(aten.index_select.default, self.s_emb, 0, tokens, dtype=self.s_emb.dtype)
        rows = p.to(rows, self.dtype)
        z = p.call(aten.unsqueeze.default, p.call(aten.mm.default, xf, self.s1), 1)
        ss = p.call(aten.bmm.default, z, p.call(aten.reshape.default, rows, [-1, R, R]))
        ss = p.call(aten.squeeze.dim, ss, 1)
        return p.call(aten.add.Tensor, p.call(aten.mm.default, ss, self.s2), self.s0)

    def _products(self, x, xs, gate):
        ys = self.rk(xs)  # (r and) the key's relu squared
        return self.value.add_to(x, ys[-1], gate=ys[gate] if gate >= 0 else None)

    def _deep_embed_call(self, x, sx, tokens):
        self._check_tokens(tokens)
        xf, shift, mixed = self.ln_mix(x, sx)
        return self._deep_embed_products(x, xf, mixed, tokens), shift

    def _deep_embed_products(self, x, xf, mixed, tokens):
        """x + the DeepEmbed channel mix's output, from xf (LN2 of x) and its mix with the shift."""
        h = self.rk(mixed)[0]  # the key's relu squared, [T, F]
        return self.value.add_to(x, h * self.deep_embed_gate(xf, tokens))

    def _check_tokens(self, tokens) -> None:
        if tokens is None:
            raise ValueError(f"RWKV: layer {self.layer} is a DeepEmbed channel mix, which needs the "
                             "token ids of its rows (tokens=...)")
