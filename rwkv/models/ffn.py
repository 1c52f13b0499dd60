"""Channel mix (the feed-forward half of a block) for every version (reference-behaviour 5.7, 6.3)."""

from __future__ import annotations

import torch

from .common import LnMix, Projection, ProjectionGroup


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

    def __call__(self, x: torch.Tensor, sx: torch.Tensor):
        xx, mixed = self.ln_mix(x, sx)
        if self.version == 7:
            return self.value.add_to(x, self.key(mixed[0], act="relu2")), xx[-1]
        kx, rx = mixed.unbind(0)
        r, h = self.rk([rx, kx])
        return self.value.add_to(x, h, gate=r), xx[-1]
