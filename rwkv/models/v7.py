"""RWKV-7 "Goose" time mix (reference-behaviour 6.3, 6.4). Matrix state [head, value, key], fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from .common import GROUP_NORM_EPS, Projection, layer_norm, stacked_mixes, token_shift

# exp(-1/2), written as upstream's literal so decays match it bit for bit.
DECAY_SCALE = 0.606531
# The constants as 0-dim CPU tensors: a Python number in a tensor op is first copied into a tensor
# of the op's dtype (~2.5 us per op, a share of one-token decode); a 0-dim tensor is used as it is.
# Same values: 1 is exact in every dtype, and the decay product is computed in fp32, where a 0-dim
# fp32 factor gives the bits the Python number gives.
_ONE = torch.tensor(1.0)
_NEG_DECAY_SCALE = torch.tensor(-DECAY_SCALE)


class TimeMixV7:
    def __init__(self, w: dict, i: int, dd, info, mode: str, stream: bool):
        p = f"blocks.{i}."
        a = p + "att."
        self.layer = i
        self.H, self.N = info.n_head, info.head_size
        self.ln_w, self.ln_b = w[p + "ln1.weight"], w[p + "ln1.bias"]
        self.mix = stacked_mixes([w[a + f"x_{c}"] for c in "rwkvag"])[0]
        # Low-rank factors as Projections: one-token products on CPU use the matrix-vector kernel.
        self.w0, self.a0 = w[a + "w0"], w[a + "a0"]
        self.w1, self.w2, self.a1, self.a2, self.g1, self.g2 = (
            Projection(w, a + n, dd, mode) for n in ("w1", "w2", "a1", "a2", "g1", "g2"))
        if i > 0:
            self.v0 = w[a + "v0"]
            self.v1, self.v2 = Projection(w, a + "v1", dd, mode), Projection(w, a + "v2", dd, mode)
        self.k_k, self.k_a = w[a + "k_k"], w[a + "k_a"]
        self.r_k = w[a + "r_k"].reshape(-1)
        self.lx_w, self.lx_b = w[a + "ln_x.weight"], w[a + "ln_x.bias"]
        self.receptance, self.key, self.value, self.output = (
            Projection(w, a + f"{n}.weight", dd, mode, stream) for n in ("receptance", "key", "value", "output"))
        self.wkv = ops.resolve("wkv7_forward", torch.device(dd.device).type, mode)

    def __call__(self, x, sx, S, v_first):
        """S is a private copy (updated in place by the kernel). Returns (x + out, shift, v_first)."""
        T, H, N = x.shape[0], self.H, self.N
        xa = layer_norm(x, self.ln_w, self.ln_b)
        d = token_shift(xa, sx) - xa
        xr, xw, xk, xv, xaa, xg = (xa + d * self.mix).unbind(0)
        r = self.receptance(xr)
        wl = self.w2(torch.tanh(self.w1(xw)))
        k = self.key(xk)
        v = self.value(xv)
        a = torch.sigmoid(self.a0 + self.a2(self.a1(xaa)))
        g = self.g2(torch.sigmoid(self.g1(xg)))
        kk = F.normalize((k * self.k_k).view(T, H, N), dim=-1, p=2.0).view(T, H * N)
        k = k * (_ONE + (a - _ONE) * self.k_a)
        if self.layer == 0:
            v_first = v
        else:
            v_first = v_first.to(device=v.device, dtype=v.dtype)
            v = v + (v_first - v) * torch.sigmoid(self.v0 + self.v2(self.v1(xv)))
        decay = torch.exp(_NEG_DECAY_SCALE * torch.sigmoid((self.w0 + wl).float()))
        f32 = [t.float().contiguous() for t in (r, k, v, -kk, kk * a)]
        y = self.wkv(S, f32[0], decay.contiguous(), f32[1], f32[2], f32[3], f32[4]).to(x.dtype)
        y = F.group_norm(y, num_groups=H, weight=self.lx_w, bias=self.lx_b, eps=GROUP_NORM_EPS)
        bonus = (r * k * self.r_k).view(T, H, N).sum(dim=-1, keepdim=True) * v.view(T, H, N)
        y = y + bonus.view(T, H * N)
        return x + self.output(y * g), xa[-1], v_first
