"""Channel mix (the feed-forward half of a block) for every version (reference-behaviour 5.7, 6.3)."""

from __future__ import annotations

import torch

from .common import Projection, layer_norm, stacked_mixes, token_shift


def _relu_squared(k: torch.Tensor) -> torch.Tensor:
    """relu(k)**2 as h*h: the same bits as ``** 2`` (torch computes x**2 as x*x), without the
    Python number's per-call conversion (a share of one-token decode time)."""
    h = torch.relu(k)
    return h * h


class ChannelMix:
    """v4/v5.x use ``time_mix_k/r`` (lerp form), v6 ``time_maa_k/r`` (delta form), v7 ``x_k`` and no
    receptance. Returns ``(x + out, new shift state)``; the shift state is the LN2 output."""

    def __init__(self, w: dict, i: int, dd, version: float, mode: str, stream: bool):
        p = f"blocks.{i}."
        self.ln_w, self.ln_b = w[p + "ln2.weight"], w[p + "ln2.bias"]
        self.version = version
        if version == 7:
            self.mix_k = w[p + "ffn.x_k"]
        else:  # (k, r) stacked; 1 - mix is computed once here instead of on every call (same values)
            prefix = p + ("ffn.time_maa_" if version == 6 else "ffn.time_mix_")
            self.mix, self.rmix = stacked_mixes([w[prefix + "k"], w[prefix + "r"]])
        self.key = Projection(w, p + "ffn.key.weight", dd, mode, stream)
        self.value = Projection(w, p + "ffn.value.weight", dd, mode, stream)
        if version != 7:
            self.receptance = Projection(w, p + "ffn.receptance.weight", dd, mode, stream)

    def __call__(self, x: torch.Tensor, sx: torch.Tensor):
        xx = layer_norm(x, self.ln_w, self.ln_b)
        prev = token_shift(xx, sx)
        if self.version == 7:
            kx = xx + (prev - xx) * self.mix_k
            return x + self.value(_relu_squared(self.key(kx))), xx[-1]
        if self.version == 6:
            kx, rx = (xx + (prev - xx) * self.mix).unbind(0)
        else:
            kx, rx = (xx * self.mix + prev * self.rmix).unbind(0)
        r = torch.sigmoid(self.receptance(rx))
        h = _relu_squared(self.key(kx))
        return x + r * self.value(h), xx[-1]
