"""RWKV-7 "Goose" time mix (reference-behaviour 6.3, 6.4). Matrix state [head, value, key], fp32."""

from __future__ import annotations

import torch

from .. import ops
from ..ops.reference import wkv7_block_math
from .program import Program, Val, need
from .common import (GROUP_NORM_EPS, LnMix, Projection, ProjectionChain, ProjectionGroup, Tiled, flat,
                     fused_op, moved, state_buffer)

# wkv7_block's parameter rows, in order (v0 is zeros in the first layer, which has no v0).
BLOCK_PARAMS = ("w0", "a0", "v0", "k_k", "k_a", "r_k", "ln_x.weight", "ln_x.bias")


class TimeMixV7:
    """The projections and low-rank products run here; what lies between them and the output
    projection (the recurrence and its elementwise surroundings) is ``wkv7_block``: the compiled
    op on CPU (fp32 or bf16 activations) and on CUDA (also fp16): one call instead of ~35 small
    torch ops per layer, the main per-token overhead of decoding; otherwise the same math as torch
    ops (wkv7_block_math, upstream's order of operations, with this layer's wkv7 op)."""

    def __init__(self, w: dict, i: int, dd, info, mode: str, stream: bool):
        p = f"blocks.{i}."
        a = p + "att."
        self.layer = i
        self.H, self.N = info.n_head, info.head_size
        self.ln_mix = LnMix(w, p + "ln1", [w[a + f"x_{c}"] for c in "rwkvag"], False, dd, mode)
        # Low-rank factors as Projections: one-token products on CPU use the matrix-vector kernel.
        self.w1, self.w2, self.a1, self.a2, self.g1, self.g2 = (
            Projection(w, a + n, dd, mode) for n in ("w1", "w2", "a1", "a2", "g1", "g2"))
        if i > 0:
            self.v1, self.v2 = Projection(w, a + "v1", dd, mode), Projection(w, a + "v2", dd, mode)
        zeros = torch.zeros_like(w[a + "w0"])
        rows = [w[a + n].reshape(-1) if a + n in w else zeros for n in BLOCK_PARAMS]
        self.params = torch.stack(rows)  # [8, H*N] in the activation dtype
        self.param_rows = self.params.unbind(0)  # for wkv7_block_math
        self.receptance, self.key, self.value, self.output = (
            Projection(w, a + f"{n}.weight", dd, mode, stream) for n in ("receptance", "key", "value", "output"))
        # The products of the mixed inputs, then those of the low-rank first factors' outputs.
        first = [(self.receptance, None, None), (self.w1, "tanh", None), (self.key, None, None),
                 (self.value, None, None), (self.a1, None, None), (self.g1, "sigmoid", None)]
        second = [(self.w2, None, None), (self.a2, None, None), (self.g2, None, None)]
        if i > 0:
            first.append((self.v1, None, None))
            second.append((self.v2, None, None))
        self.first_products, self.second_products = ProjectionGroup(first, mode), ProjectionGroup(second, mode)
        # The second factors' inputs: w1, a1, g1 (and v1) of the first products.
        self.products = ProjectionChain(self.first_products, self.second_products,
                                        [1, 4, 5] + ([6] if i > 0 else []), mode)
        self.wkv = ops.resolve("wkv7_forward", torch.device(dd.device).type, mode)
        self.block = fused_op("wkv7_block", dd, mode)
        self.state_buffer = state_buffer(self.block, dd)
        if self.block is not None:
            self.block_params = self.params.float()  # the op's p: fp32 (bf16 rows widened, exactly)
        # The batched step's parameters: every row's heads after one another (see rows()).
        self.tiled = Tiled(lambda B: (self.block_params if self.block is not None else self.params).repeat(1, B))

    def __call__(self, x, sx, S_old, v_first):
        """S_old: the caller's state (never written). Returns (x + out, shift, v_first, new state)."""
        _, shift, mixed = self.ln_mix(x, sx)
        x, v_first, S = self._mixed(x, mixed, S_old, v_first)
        return x, shift, v_first, S

    def rows(self, x, sx, S, v_first):
        """The batched step: row b of x [B, C] is one token of sequence b, whose shift state is
        sx[b] and matrix state S[b] ([B, H, N, N], contiguous); both are updated in place.
        Returns (x + out, v_first)."""
        xx, mixed = self.ln_mix.rows(x, sx)
        sx.copy_(xx)
        x, v_first, _ = self._mixed(x, mixed, S, v_first, batch=True)
        return x, v_first

    def steps(self, p: Program, x: Val, sx: Val, S: Val, v_first: Val | None) -> tuple:
        """``__call__`` (a one-token program) or ``rows`` (an in-place program; S [B*H, N, N]) as
        program steps. Returns (x + out, v_first, the new shift state, the new matrix state)."""
        xx, shift, (xr, xw, xk, xv, xaa, xg) = self.ln_mix.steps(p, x, sx)
        (r, w1, k, v, a1, g1, *v1), (w, a, g, *v2) = self.products.steps(
            p, [xr, xw, xk, xv, xaa, xg] + ([xv] if self.layer else []))
        if self.layer == 0:
            v_first, v_gate, vf = v, None, None
        else:
            v_first = vf = p.to(v_first, v.dtype)
            v_gate = v2[0]
        block = need(self.block, "wkv7_block")
        if not p.inplace:  # reads S, writes the new state
            S_new = p.call(need(self.state_buffer, "pooled_empty_like"), S)
            y = p.call(block, S_new, r, w, k, v, a, g, vf, v_gate, self.block_params, GROUP_NORM_EPS, S,
                       dtype=r.dtype)
        else:  # the B rows' recurrences as one token of B*H heads, in S itself
            B, S_new = p.B, S
            acts = [t if t is None or B == 1 else p.view(t, 1, -1) for t in (r, w, k, v, a, g, vf, v_gate)]
            y = p.call(block, S, *acts, self.tiled(B) if B > 1 else self.block_params, GROUP_NORM_EPS,
                       dtype=r.dtype)
            y = y if B == 1 else p.view(y, B, -1)
        return self.output.add_to_steps(p, x, y), v_first, p.update(sx, shift), S_new

    def _mixed(self, x, mixed, S_old, v_first, batch=False):
        """From the mixes on: (x + out, v_first, the new state). With ``batch``, the B rows'
        recurrences run as one sequence of one token with B*H heads, in S_old itself."""
        xr, xw, xk, xv, xaa, xg = mixed
        (r, w1, k, v, a1, g1, *v1), (w, a, g, *v2) = self.products(
            [xr, xw, xk, xv, xaa, xg] + ([xv] if self.layer else []))
        if self.layer == 0:
            v_first, v_gate, vf = v, None, None
        else:
            v_first = vf = moved(v_first, v.dtype, v.device)
            v_gate = v2[0]
        if batch:
            B = x.shape[0]
            S = S_old.view(B * self.H, self.N, self.N)
            acts = [flat(t) for t in (r, w, k, v, a, g, vf, v_gate)]
            if self.block is not None:
                y = self.block(S, *acts, self.tiled(B), GROUP_NORM_EPS)
            else:
                y = wkv7_block_math(self.wkv, S, *acts, self.tiled(B).unbind(0), GROUP_NORM_EPS)
            y = y.view(B, -1)
        elif self.block is not None:  # reads S_old, writes the new state: no copy of S_old first
            S = self.state_buffer(S_old)
            y = self.block(S, r, w, k, v, a, g, vf, v_gate, self.block_params, GROUP_NORM_EPS, S_old)
        else:
            S = S_old.clone()
            y = wkv7_block_math(self.wkv, S, r, w, k, v, a, g, vf, v_gate, self.param_rows, GROUP_NORM_EPS)
        return self.output.add_to(x, y), v_first, S
