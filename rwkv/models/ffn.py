"""Channel mix (the feed-forward half of a block) for every version (reference-behaviour 5.7, 6.3)."""

from __future__ import annotations

import torch

from .. import ops
from .common import LnMix, Projection, ProjectionGroup, _compiled


class ChannelMix:
    """v4/v5.x use ``time_mix_k/r`` (lerp form), v6 ``time_maa_k/r`` (delta form), v7 ``x_k`` (delta
    form) and no receptance. Returns ``(x + out, new shift state)``; the shift state is the LN2 output."""

    def __init__(self, w: dict, i: int, dd, version: float, mode: str, stream: bool):
        p = f"blocks.{i}."
        self.version = version
        if version == 7:
            mixes = [w[p + "ffn.x_k"]]
        else:
            prefix = p + ("ffn.time_maa_" if version == 6 else "ffn.time_mix_")
            mixes = [w[prefix + "k"], w[prefix + "r"]]
        self.ln_mix = LnMix(w, p + "ln2", mixes, version < 6, dd, mode)
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

    def __call__(self, x: torch.Tensor, sx: torch.Tensor):
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

    def rows(self, x: torch.Tensor, sx: torch.Tensor) -> torch.Tensor:
        """The batched step: row b of x [B, C] is one token of sequence b, whose shift state is
        sx[b] (updated in place). Returns x + out."""
        xx, mixed = self.ln_mix.rows(x, sx)
        sx.copy_(xx)
        if self.version == 7:
            return self._products(x, mixed, -1)
        kx, rx = mixed
        return self._products(x, [rx, kx], 0)

    def _products(self, x, xs, gate):
        ys = self.rk(xs)  # (r and) the key's relu squared
        return self.value.add_to(x, ys[-1], gate=ys[gate] if gate >= 0 else None)
