"""RWKV-5.x and RWKV-6 time mix (reference-behaviour 5.5, 5.6). Matrix state [head, key, value]."""

from __future__ import annotations

import torch

from .. import ops
from ..ops.reference import group_norm, maa_mix_math, maa_mix_rows_math, rows, wkv6_block_math
from .program import Program, Val, need
from .common import (GROUP_NORM_EPS, LnMix, Projection, ProjectionChain, ProjectionGroup, Tiled, flat,
                     fused_op, stacked_mixes, state_buffer)


class TimeMixV5:
    """5.0 (no gate), 5.1 (gate, per-head decay), 5.2 (gate, per-channel decay) and, as a subclass,
    6.0 (data-dependent token shift and decay)."""

    op_name = "wkv5_forward"

    def __init__(self, w: dict, i: int, dd, info, mode: str, stream: bool):
        p = self.prefix = f"blocks.{i}."
        self.H, self.N = info.n_head, info.head_size
        self.lx_w, self.lx_b = w[p + "att.ln_x.weight"], w[p + "att.ln_x.bias"]
        self.gated = info.version >= 5.1
        proj = ("key", "value", "receptance", "output") + (("gate",) if self.gated else ())
        for name in proj:
            # The gate streams never (upstream streams only key/value/receptance/output).
            setattr(self, name, Projection(w, p + f"att.{name}.weight", dd, mode, stream and name != "gate"))
        shape = (self.H, self.N)
        self.first = w[p + "att.time_first"].expand(self.H, self.N, 1).reshape(shape).contiguous()
        self._load_mixes(w, p, dd, mode)
        rkv = self._rkv_dtype()
        members = [(self.receptance, None, rkv), (self.key, None, rkv), (self.value, None, rkv)]
        members += [(self.gate, "silu", None)] if self.gated else []
        members += self._extra_members()
        self.products = ProjectionGroup(members, mode)
        self.wkv = ops.resolve(self.op_name, torch.device(dd.device).type, mode)
        # The batched step's per-head parameters, one copy per row (see rows()).
        self.tiled = Tiled(self._tile)

    def _load_mixes(self, w, p, dd, mode):
        names = "kvr" + ("g" if self.gated else "")
        self.ln_mix = LnMix(w, p + "ln1", [w[p + f"att.time_mix_{c}"] for c in names], True, dd, mode)
        self.decay = w[p + "att.time_decay"].expand(self.H, self.N, 1).reshape(self.H, self.N).contiguous()

    def _extra_members(self) -> list:
        """Products of the same token besides r, k, v, g (RWKV-6: the decay's first factor)."""
        return []

    def _rkv_dtype(self):
        """The dtype r, k, v are converted to after their products (upstream's fp32), or None to
        keep the products' own (the activation dtype)."""
        return torch.float32

    def _products(self, xx, prev, mixed, batch):
        """The inputs of _block from the layer norm xx, the previous rows' (prev: the shift state
        [C], or [B, C] with ``batch``) and the mixes: r, k, v (fp32, [T, A]), the gate (atype or
        None) and the decay input."""
        r, k, v, *g = self.products([mixed[2], mixed[0], mixed[1]] + mixed[3:])  # of k, v, r(, g)
        return r, k, v, g[0] if g else None, self.decay

    def __call__(self, x, sx, S_old):
        """S_old: the caller's matrix state (never written). Returns (x + out, shift, new state)."""
        xx, shift, mixed = self.ln_mix(x, sx)
        y, S = self._block(S_old, *self._products(xx, sx, mixed, False), x.dtype)
        return self.output.add_to(x, y), shift, S

    def rows(self, x, sx, S):
        """The batched step: row b of x [B, C] is one token of sequence b, whose shift state is
        sx[b] and matrix state S[b] ([B, H, N, N], contiguous); both are updated in place. The B
        recurrences run as one token of one sequence with B*H heads. Returns x + out."""
        xx, mixed = self.ln_mix.rows(x, sx)
        inputs = self._products(xx, sx, mixed, True)
        sx.copy_(xx)
        B = x.shape[0]
        y = self._block_rows(S.view(B * self.H, self.N, self.N), [flat(t) for t in inputs], B, x.dtype)
        return self.output.add_to(x, y.view(B, -1))

    def steps(self, p: Program, x: Val, sx: Val, S: Val) -> tuple:
        """``__call__`` (a one-token program) or ``rows`` (an in-place program; S [B*H, N, N]) as
        program steps. Returns (x + out, the new shift state, the new matrix state)."""
        xx, shift, mixed = self.ln_mix.steps(p, x, sx)
        inputs = self._products_steps(p, xx, sx, mixed)
        if p.B > 1:
            inputs = [p.view(t, 1, -1) if isinstance(t, Val) else t for t in inputs]
        y, S_new = self._block_steps(p, S, *inputs, x.dtype)
        y = y if p.B == 1 else p.view(y, p.B, -1)
        return self.output.add_to_steps(p, x, y), p.update(sx, shift), S_new

    def _products_steps(self, p, xx, sx, mixed):
        """_products as program steps (the decay: a constant)."""
        r, k, v, *g = self.products.steps(p, [mixed[2], mixed[0], mixed[1]] + mixed[3:])
        return r, k, v, g[0] if g else None, self.decay

    def _block_steps(self, p, S, r, k, v, g, decay, dtype):
        """_block (one-token program) or _block_rows (in place) as program steps, on the values r,
        k, v and g of the rows (flattened to one row in place): (y, the new state)."""
        B = p.B
        decay, first, lx_w, lx_b = self.tiled(B) if B > 1 else (decay, self.first, self.lx_w, self.lx_b)
        S_new = S if p.inplace else p.call(torch.ops.aten.clone.default, S)
        y = p.call(need(self.wkv, self.op_name), S_new, r, k, v, decay, first, dtype=torch.float32)
        y = p.call(torch.ops.aten.group_norm.default, y, B * self.H, lx_w, lx_b, GROUP_NORM_EPS, True)
        y = p.to(y, dtype)
        return (y if g is None else p.call(torch.ops.aten.mul.Tensor, y, g)), S_new

    def _tile(self, B):
        return self.decay.repeat(B, 1), self.first.repeat(B, 1), self.lx_w.repeat(B), self.lx_b.repeat(B)

    def _block_rows(self, S, inputs, B, dtype):
        """_block of B one-token rows flattened to one row of B*H heads (S [B*H, N, N], the
        inputs [1, B*A]), updating S in place."""
        r, k, v, g, _ = inputs
        decay, first, lx_w, lx_b = self.tiled(B)
        y = self.wkv(S, r.contiguous(), k.contiguous(), v.contiguous(), decay, first)
        y = group_norm(y, B * self.H, lx_w, lx_b, GROUP_NORM_EPS).to(dtype=dtype)
        return y if g is None else y * g

    def _block(self, S_old, r, k, v, g, decay, dtype):
        """The recurrence, the group norm and the gate: (the input of the output projection, the
        new state)."""
        S = S_old.clone()  # the recurrence updates it in place
        y = self.wkv(S, r.contiguous(), k.contiguous(), v.contiguous(), decay, self.first)
        y = group_norm(y, self.H, self.lx_w, self.lx_b, GROUP_NORM_EPS)
        y = y.to(dtype=dtype)
        return (y if g is None else y * g), S


class TimeMixV6(TimeMixV5):
    """The data-dependent token shift after its first low-rank product is ``maa_mix`` (for one token
    on CPU ``maa_lora_one``, which computes that product too), and what lies
    between the projections and the output projection (decay, recurrence, group norm, gate) is
    ``wkv6_block``: compiled CPU ops when the activations are fp32 or bf16 (one call each instead
    of ~10 small torch ops), otherwise the same math as torch ops (maa_mix_math and wkv6_block_math,
    upstream's order of operations, with this layer's wkv6 op)."""

    op_name = "wkv6_forward"

    def __init__(self, w: dict, i: int, dd, info, mode: str, stream: bool):
        super().__init__(w, i, dd, info, mode, stream)
        # The decay's second factor after the products (its input: the first factor's result).
        self.decay_products = ProjectionChain(
            self.products, ProjectionGroup([(self.decay_w2, None, self._rkv_dtype())], mode), [4], mode)

    def _load_mixes(self, w, p, dd, mode):
        a = p + "att."
        # ln_mix gives xx + (prev - xx) * time_maa_x, the input of the low-rank token-shift path.
        self.ln_mix = LnMix(w, p + "ln1", [w[a + "time_maa_x"]], False, dd, mode)
        self.maa = stacked_mixes([w[a + f"time_maa_{c}"] for c in "wkvrg"])[0]  # [5, 1, C]
        # (C, 5D) and (5, D, C); the 2-D low-rank factors as Projections (one-token products on CPU
        # use the matrix-vector kernel).
        self.maa_w1, self.maa_w2 = Projection(w, a + "time_maa_w1", dd, mode), w[a + "time_maa_w2"]
        self.decay_w1, self.decay_w2 = (Projection(w, a + n, dd, mode)
                                        for n in ("time_decay_w1", "time_decay_w2"))
        self.decay_base = w[a + "time_decay"].reshape(-1)  # fp32 log-decay (A,)
        self.params = (self.decay_base, self.first, self.lx_w, self.lx_b)
        self.maa_rows = self.maa.squeeze(1).float()  # [5, C] fp32, the op's layout
        self.maa_op = fused_op("maa_mix", dd, mode, self.maa_w2)
        self.maa_split = fused_op("maa_mix_split", dd, mode, self.maa_w2)
        self.maa_rows_op = fused_op("maa_mix_rows", dd, mode, self.maa_w2) \
            if torch.device(dd.device).type == "cpu" else None
        # One token on CPU: maa_mix_split with the first factor's product in the same call.
        w1 = self.maa_w1.weight
        self.maa_lora = fused_op("maa_lora_one", dd, mode, self.maa_w2, w1) \
            if w1.dim() == 2 and w1.t().is_contiguous() else None
        self.block = fused_op("wkv6_block", dd, mode)
        self.state_buffer = state_buffer(self.block, dd)
        if self.block is not None:
            self.block_params = torch.stack([t.reshape(-1).float() for t in self.params])

    def _products(self, xx, prev, mixed, batch):
        (xmaa,) = mixed
        w1 = self.maa_w1.weight
        if batch:
            mixed = self._mix_rows(xx, prev, self.maa_w1(xmaa))
        elif self.maa_lora is not None and rows(xx) == 1 and xmaa.dtype == w1.dtype:
            # one token on CPU: the first low-rank product inside the same call
            mixed = self.maa_lora(xx, prev, xmaa, w1, self.maa_w2, self.maa_rows)
        else:
            mixed = self._mixes(xx, prev, self.maa_w1(xmaa))
        wx, kx, vx, rx, gx = mixed  # (5 x [T, C]): w, k, v, r, g
        (r, k, v, g, _), (w,) = self.decay_products([rx, kx, vx, gx, wx])
        return r, k, v, g, w

    def _products_steps(self, p, xx, sx, mixed):
        (xmaa,) = mixed
        w1 = self.maa_w1.weight
        if p.B > 1:
            z = self.maa_w1.steps(p, xmaa)
            mixed = p.call(need(self.maa_rows_op, "maa_mix_rows"), xx, sx, z, self.maa_w2, self.maa_rows, n=5)
        elif self.maa_lora is not None and xmaa.dtype == w1.dtype:
            mixed = p.call(self.maa_lora, xx, sx, xmaa, w1, self.maa_w2, self.maa_rows, n=5)
        else:
            z = self.maa_w1.steps(p, xmaa)
            mixed = p.call(need(self.maa_split, "maa_mix_split"), xx, sx, z, self.maa_w2, self.maa_rows, n=5)
        wx, kx, vx, rx, gx = mixed
        (r, k, v, g, _), (w,) = self.decay_products.steps(p, [rx, kx, vx, gx, wx])
        return r, k, v, g, w

    def _block_steps(self, p, S, r, k, v, g, w, dtype):
        block = need(self.block, "wkv6_block")
        if not p.inplace:  # reads S, writes the new state
            S_new = p.call(need(self.state_buffer, "pooled_empty_like"), S)
            y = p.call(block, S_new, r, k, v, w, g, self.block_params, GROUP_NORM_EPS, S, dtype=g.dtype)
            return y, S_new
        params = self.tiled(p.B) if p.B > 1 else self.block_params
        return p.call(block, S, r, k, v, w, g, params, GROUP_NORM_EPS, dtype=g.dtype), S

    def _mix_rows(self, xx, prev, z):
        """The 5 mixes of B one-token rows, prev [B, C] their shift states: on CPU the compiled
        ``maa_mix_rows``; elsewhere as the compiled op computes them (fp32, rounded once) where it
        would run, else as the torch ops do."""
        if self.maa_rows_op is not None:
            return self.maa_rows_op(xx, prev, z, self.maa_w2, self.maa_rows)
        if self.maa_split is not None or self.maa_op is not None:
            m = maa_mix_rows_math(xx.float(), prev.float(), z.float(), self.maa_w2.float(),
                                  self.maa_rows.unsqueeze(1))
            return m.to(xx.dtype).unbind(0)
        return maa_mix_rows_math(xx, prev, z, self.maa_w2, self.maa).unbind(0)

    def _mixes(self, xx, sx, z):
        """The 5 mixes from the first low-rank product's result z."""
        if self.maa_split is not None:  # compiled, its 5 results as separate tensors (CPU)
            return self.maa_split(xx, sx, z, self.maa_w2, self.maa_rows)
        if self.maa_op is not None:  # compiled (CUDA has none), else the same math as torch ops
            return self.maa_op(xx, sx, z, self.maa_w2, self.maa_rows).unbind(0)
        return maa_mix_math(xx, sx, z, self.maa_w2, self.maa).unbind(0)

    def _extra_members(self) -> list:
        return [(self.decay_w1, "tanh", None)]

    def _rkv_dtype(self):
        # The compiled wkv6_block widens bf16 r, k, v and w itself (exactly, so the same values as
        # upstream's .float() after each product): no conversion op per tensor.
        return None if self.block is not None else torch.float32

    def _tile(self, B):
        if self.block is not None:
            return self.block_params.repeat(1, B)
        base, u, lx_w, lx_b = self.params
        return base.repeat(B), u.repeat(B, 1), lx_w.repeat(B), lx_b.repeat(B)

    def _block_rows(self, S, inputs, B, dtype):
        r, k, v, g, w = inputs
        if self.block is not None:
            return self.block(S, r, k, v, w, g, self.tiled(B), GROUP_NORM_EPS)
        return wkv6_block_math(self.wkv, S, r, k, v, w, g, self.tiled(B), GROUP_NORM_EPS)

    def _block(self, S_old, r, k, v, g, w, dtype):
        if self.block is not None:  # reads S_old, writes the new state: no copy of S_old first
            S = self.state_buffer(S_old)
            return self.block(S, r, k, v, w, g, self.block_params, GROUP_NORM_EPS, S_old), S
        S = S_old.clone()
        return wkv6_block_math(self.wkv, S, r, k, v, w, g, self.params, GROUP_NORM_EPS), S
