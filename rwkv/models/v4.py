"""RWKV-4 time mix (reference-behaviour 5.4). State per layer: [shift, aa, bb, pp] + ffn shift."""

from __future__ import annotations

import torch

from .. import ops
from .program import Program, Val, need
from .common import LnMix, Projection, ProjectionGroup, Tiled, flat, fused_op, moved


class TimeMixV4:
    def __init__(self, w: dict, i: int, dd, info, mode: str, stream: bool):
        p = f"blocks.{i}."
        self.ln_mix = LnMix(w, p + "ln1", [w[p + f"att.time_mix_{c}"] for c in "kvr"], True, dd, mode)
        self.decay, self.first = w[p + "att.time_decay"], w[p + "att.time_first"]  # fp32 (A,)
        self.key, self.value, self.receptance, self.output = (
            Projection(w, p + f"att.{n}.weight", dd, mode, stream)
            for n in ("key", "value", "receptance", "output"))
        self.wkv = ops.resolve("wkv4_forward", torch.device(dd.device).type, mode)
        # On CPU (fp32 or bf16 activations) the compiled wkv4_block: one op for what is otherwise
        # three state copies, wkv4_forward, the gate's multiply and (bf16) a conversion, with the
        # same bits. It takes k and v as the products return them (bf16 ones widened
        # inside: two conversion ops fewer per layer).
        self.block = fused_op("wkv4_block", dd, mode)
        kv = None if self.block is not None else torch.float32
        self.rkv = ProjectionGroup([(self.receptance, "sigmoid", None), (self.key, None, kv),
                                    (self.value, None, kv)], mode)
        # The batched step's decay and bonus, one copy per row (see rows()).
        self.tiled = Tiled(lambda B: (self.decay.repeat(B), self.first.repeat(B)))

    def __call__(self, x, sx, aa, bb, pp):
        """Returns (x, the new shift state, the new aa, bb, pp); the caller's aa, bb, pp are
        never written."""
        _, shift, (kx, vx, rx) = self.ln_mix(x, sx)
        r, k, v = self.rkv([rx, kx, vx])
        y, aa, bb, pp = self._wkv(r, k, v, aa, bb, pp, self.decay, self.first)
        return self.output.add_to(x, y), shift, aa, bb, pp

    def rows(self, x, sx, aa, bb, pp):
        """The batched step: row b of x [B, C] is one token of sequence b, whose states are row b
        of sx [B, C] and aa, bb, pp [B, A] (contiguous); all are updated in place. The B
        recurrences run as one token of B*A channels. Returns x + out."""
        xx, (kx, vx, rx) = self.ln_mix.rows(x, sx)
        sx.copy_(xx)
        B = x.shape[0]
        r, k, v = self.rkv([rx, kx, vx])
        state = [t.view(-1) for t in (aa, bb, pp)]
        y, *new = self._wkv(flat(r), flat(k), flat(v), *state, *self.tiled(B))
        for t, n in zip(state, new):
            t.copy_(n)
        return self.output.add_to(x, y.view(B, -1))

    def steps(self, p: Program, x: Val, sx: Val, aa: Val, bb: Val, pp: Val) -> tuple:
        """``__call__`` (a one-token program) or ``rows`` (an in-place program; aa, bb, pp
        [B*A]) as program steps. Returns (x + out, the new sx, aa, bb, pp)."""
        xx, shift, (kx, vx, rx) = self.ln_mix.steps(p, x, sx)
        r, k, v = self.rkv.steps(p, [rx, kx, vx])
        block, B = need(self.block, "wkv4_block"), p.B
        if B > 1:
            r, k, v = (p.view(t, 1, -1) for t in (r, k, v))
        decay, first = self.tiled(B) if B > 1 else (self.decay, self.first)
        y, *new = p.call(block, decay, first, k, v, r, aa, bb, pp, n=4,
                         dtype=[r.dtype] + [torch.float32] * 3)
        aa, bb, pp = (p.update(t, n) for t, n in zip((aa, bb, pp), new))
        y = y if B == 1 else p.view(y, B, -1)
        return self.output.add_to_steps(p, x, y), p.update(sx, shift), aa, bb, pp

    def _wkv(self, r, k, v, aa, bb, pp, decay, first):
        """The recurrence from aa, bb, pp (never written) and the gate: (r * wkv, new aa, bb, pp)."""
        # (No .contiguous() or no-op .to() here: the ops make their inputs contiguous themselves,
        # and each call left in would be a step of the one-token program.)
        if self.block is not None:
            return self.block(decay, first, k, v, r, aa, bb, pp)
        aa, bb, pp = aa.clone(), bb.clone(), pp.clone()  # updated in place by the kernel
        y = self.wkv(decay, first, k, v, aa, bb, pp)
        return r * moved(y, r.dtype, y.device), aa, bb, pp
