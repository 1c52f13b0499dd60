"""Shared pieces for the tiny RWKV-7 model shipped in models/rwkv7-tiny/.

* the deterministic train / held-out split of the LAMBADA passages,
* the byte-level BPE tokenizer trainer,
* ``TinyRWKV7``: a plain-PyTorch RWKV-7 ("x070") language model used for training.  It computes the
  same function as the inference code described in docs (reference-behaviour.md 6.3-6.5), so a
  checkpoint saved by ``TinyRWKV7.export_state_dict`` gives the same logits in the upstream ``rwkv``
  package (and ours) as in this module.  The parameter names are the upstream training-checkpoint
  names (reference 4.2), Linear weights in ``nn.Linear`` (out, in) layout.

Only torch / numpy / tokenizers are needed; nothing here imports the ``rwkv`` package.
"""
from __future__ import annotations

import json
import math
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_PATH = os.environ.get("RWKV_TINY_DATA", "/work/shared/data/lambada_test.jsonl")
MODEL_DIR = os.path.join(REPO, "models", "rwkv7-tiny")
MODEL_PATH = os.path.join(MODEL_DIR, "rwkv7-tiny.pth")
TOKENIZER_PATH = os.path.join(MODEL_DIR, "tokenizer.json")

SPLIT_SEED = 1234
HELDOUT_FRACTION = 0.05
EOT_ID = 0
EOT_TOKEN = "<|endoftext|>"

W_SCALE = 0.606531  # e^(-1/2), the literal constant of the v7 decay formula
GN_EPS = 64e-5


# --------------------------------------------------------------------------------------------- data
def load_passages(path: str = DATA_PATH) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def split_passages(passages: list[str], seed: int = SPLIT_SEED, frac: float = HELDOUT_FRACTION):
    """Deterministic split: seeded shuffle of the passage indices, the last ``frac`` is held out.

    Returns (train, heldout) lists of passages, each in original file order.
    """
    idx = list(range(len(passages)))
    random.Random(seed).shuffle(idx)
    n_held = max(1, int(round(len(passages) * frac)))
    held = sorted(idx[-n_held:])
    train = sorted(idx[:-n_held])
    return [passages[i] for i in train], [passages[i] for i in held]


def load_split(path: str = DATA_PATH):
    return split_passages(load_passages(path))


def encode_passages(tok, passages: list[str]) -> list[int]:
    """Token stream: every passage followed by the end-of-text id 0."""
    out: list[int] = []
    for enc in tok.encode_batch(passages):
        out.extend(enc.ids)
        out.append(EOT_ID)
    return out


def unigram_logprobs(train_ids: list[int], vocab_size: int, alpha: float = 1.0) -> torch.Tensor:
    """Add-alpha smoothed unigram log-probabilities estimated on the training stream."""
    counts = torch.bincount(torch.tensor(train_ids, dtype=torch.long), minlength=vocab_size).double()
    p = (counts + alpha) / (counts.sum() + alpha * vocab_size)
    return p.log()


def unigram_ppl(train_ids: list[int], eval_targets: list[int], vocab_size: int) -> float:
    lp = unigram_logprobs(train_ids, vocab_size)
    t = torch.tensor(eval_targets, dtype=torch.long)
    return math.exp(-lp[t].mean().item())


# ---------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(train_passages: list[str], vocab_size: int, out_path: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT_TOKEN],  # -> id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_passages, trainer=trainer)
    assert tok.token_to_id(EOT_TOKEN) == EOT_ID
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    tok.save(out_path)
    return tok


def load_tokenizer(path: str = TOKENIZER_PATH):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


# -------------------------------------------------------------------------------------------- model
class TimeMix(nn.Module):
    def __init__(self, C: int, H: int, layer_id: int, n_layer: int, d_w: int, d_a: int, d_v: int, d_g: int):
        super().__init__()
        self.C, self.H, self.N, self.layer_id = C, H, C // H, layer_id
        z = lambda *s: nn.Parameter(torch.zeros(*s))
        self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g = (z(1, 1, C) for _ in range(6))
        self.w0, self.w1, self.w2 = z(1, 1, C), z(C, d_w), z(d_w, C)
        self.a0, self.a1, self.a2 = z(1, 1, C), z(C, d_a), z(d_a, C)
        self.v0, self.v1, self.v2 = z(1, 1, C), z(C, d_v), z(d_v, C)
        self.g1, self.g2 = z(C, d_g), z(d_g, C)
        self.k_k, self.k_a = z(1, 1, C), z(1, 1, C)
        self.r_k = z(H, C // H)
        self.receptance = nn.Linear(C, C, bias=False)
        self.key = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(C, C, bias=False)
        self.output = nn.Linear(C, C, bias=False)
        self.ln_x = nn.GroupNorm(H, C, eps=GN_EPS)
        self._init(layer_id, n_layer)

    @torch.no_grad()
    def _init(self, layer_id: int, n_layer: int):
        C, H, N = self.C, self.H, self.N
        depth = layer_id / max(1, n_layer - 1)      # 0 .. 1
        keep = 1.0 - layer_id / n_layer             # 1 .. ~0
        pos = torch.arange(C, dtype=torch.float32) / C
        # token-shift mixes: how much of the previous token each branch sees (more in early channels)
        for p, e in ((self.x_r, 0.2), (self.x_w, 0.9), (self.x_k, 0.7), (self.x_v, 0.7),
                     (self.x_a, 0.9), (self.x_g, 0.2)):
            p.copy_((1.0 - pos.pow(e * keep)).view(1, 1, C))
        # decay bias: a ramp of slow .. fast decays over the channels of each head
        ramp = torch.arange(C, dtype=torch.float32) / (C - 1)
        self.w0.copy_((-6.0 + 6.0 * ramp.pow(0.85 + depth)).view(1, 1, C) + 0.5)
        for p2 in (self.w2, self.a2, self.v2, self.g2):
            nn.init.orthogonal_(p2, gain=0.1)
        self.a0.zero_()
        self.v0.fill_(1.0)
        self.k_k.fill_(0.85)
        self.k_a.fill_(1.0)
        self.r_k.normal_(0.0, 0.1)
        b = 0.5 / math.sqrt(C)
        for lin in (self.receptance, self.key, self.value):
            lin.weight.uniform_(-b, b)
        self.output.weight.zero_()
        self.ln_x.weight.fill_(((1 + layer_id) / n_layer) ** 0.7)
        self.ln_x.bias.zero_()

    def forward(self, x, v_first, shift=None, state=None):
        """x: (B, T, C) = LN1 output.  shift: (B, C) previous-token LN1 output (zeros if None).
        state: (B, H, N(value), N(key)) fp32 (zeros if None).  Returns out, v_first, last x, state."""
        B, T, C = x.shape
        H, N = self.H, self.N
        prev = torch.zeros_like(x[:, :1]) if shift is None else shift.unsqueeze(1)
        d = torch.cat([prev, x[:, :-1]], dim=1) - x
        xr, xw, xk = x + d * self.x_r, x + d * self.x_w, x + d * self.x_k
        xv, xa, xg = x + d * self.x_v, x + d * self.x_a, x + d * self.x_g
        r = self.receptance(xr)
        k = self.key(xk)
        v = self.value(xv)
        w = torch.exp(-W_SCALE * torch.sigmoid(self.w0 + torch.tanh(xw @ self.w1) @ self.w2))
        a = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, T, H, N), dim=-1, p=2.0, eps=1e-12).view(B, T, C)
        k = k * (1 + (a - 1) * self.k_a)
        if self.layer_id == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)

        y, state = wkv7(r, w, k, v, -kk, kk * a, H, state)
        y = self.ln_x(y.reshape(B * T, C)).view(B, T, C)
        bonus = (r * k * self.r_k.view(1, 1, C)).view(B, T, H, N).sum(-1, keepdim=True)
        y = y + (bonus * v.view(B, T, H, N)).view(B, T, C)
        return self.output(y * g), v_first, x[:, -1], state


def wkv7(r, w, k, v, alpha, beta, H: int, state=None):
    """The RWKV-7 recurrence (fp32), per head:

        S_t = S_{t-1} * w_t[None, :] + (S_{t-1} @ alpha_t) beta_t^T + v_t k_t^T ,   y_t = S_t @ r_t

    with S indexed [value channel i, key channel j] (alpha = -kk, beta = kk * a in RWKV-7).
    Inputs (B, T, C); returns y (B, T, C) and the final state (B, H, N, N).  The time loop runs in a
    custom autograd function with a hand-written backward (much faster than autograd on a loop).
    """
    B, T, C = r.shape
    N = C // H
    if state is None:
        state = r.new_zeros(B, H, N, N)
    y, S_last = _WKV7.apply(r, w, k, v, alpha, beta, state, H)
    return y, S_last


def wkv7_reference(r, w, k, v, alpha, beta, H: int, state=None):
    """Plain autograd version of ``wkv7`` (slow; used by the tests to check the manual backward)."""
    B, T, C = r.shape
    N = C // H
    S = r.new_zeros(B, H, N, N) if state is None else state
    ys = []
    for t in range(T):
        f = lambda z: z[:, t].view(B, H, N)
        sa = (S @ f(alpha).unsqueeze(-1))
        S = S * f(w).unsqueeze(-2) + sa @ f(beta).unsqueeze(-2) + f(v).unsqueeze(-1) @ f(k).unsqueeze(-2)
        ys.append((S @ f(r).unsqueeze(-1)).squeeze(-1).reshape(B, C))
    return torch.stack(ys, 1), S


def _tb(z, B, T, H, N):
    """(B, T, C) -> (T, B*H, N) contiguous."""
    return z.reshape(B, T, H, N).transpose(0, 1).reshape(T, B * H, N).contiguous()


class _WKV7(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, w, k, v, alpha, beta, state, H):
        B, T, C = r.shape
        N = C // H
        BH = B * H
        r_, w_, k_, v_, a_, b_ = (_tb(z, B, T, H, N) for z in (r, w, k, v, alpha, beta))
        S_all = r.new_empty(T + 1, BH, N, N)       # S_all[t + 1] = state after step t
        S_all[0] = state.reshape(BH, N, N)
        U = r.new_empty(T, BH, N, 1)               # S_{t-1} @ alpha_t
        bk = torch.stack([b_, k_], dim=2)          # (T, BH, 2, N)
        for t in range(T):
            S = S_all[t]
            torch.bmm(S, a_[t].unsqueeze(-1), out=U[t])
            torch.baddbmm(S * w_[t].unsqueeze(1), torch.cat([U[t], v_[t].unsqueeze(-1)], dim=2), bk[t],
                          out=S_all[t + 1])
        y = torch.matmul(S_all[1:], r_.unsqueeze(-1)).squeeze(-1)          # (T, BH, N)
        y = y.view(T, B, H, N).transpose(0, 1).reshape(B, T, C)
        ctx.save_for_backward(r_, w_, k_, v_, a_, b_, S_all, U)
        ctx.dims = (B, T, C, H, N)
        return y, S_all[T].reshape(B, H, N, N).clone()

    @staticmethod
    def backward(ctx, dy, dS_last):
        r_, w_, k_, v_, a_, b_, S_all, U = ctx.saved_tensors
        B, T, C, H, N = ctx.dims
        BH = B * H
        dy_ = _tb(dy, B, T, H, N)
        G_all = torch.empty_like(S_all[1:])     # G_all[t] = dL/dS_t (total, incl. the future)
        G = dS_last.reshape(BH, N, N).clone() if dS_last is not None else r_.new_zeros(BH, N, N)
        Q = r_.new_empty(T, BH, N, 1)           # G_t @ beta_t
        G = torch.baddbmm(G, dy_[T - 1].unsqueeze(-1), r_[T - 1].unsqueeze(1))
        for t in range(T - 1, -1, -1):
            G_all[t] = G
            torch.bmm(G, b_[t].unsqueeze(-1), out=Q[t])
            if t > 0:
                G = torch.baddbmm(G * w_[t].unsqueeze(1), torch.cat([Q[t], dy_[t - 1].unsqueeze(-1)], dim=2),
                                  torch.stack([a_[t], r_[t - 1]], dim=1))
            else:
                G = torch.baddbmm(G * w_[t].unsqueeze(1), Q[t], a_[t].unsqueeze(1))
        dstate = G.view(B, H, N, N)
        S_prev = S_all[:-1]
        Gt = G_all.transpose(-1, -2)
        dr = torch.matmul(S_all[1:].transpose(-1, -2), dy_.unsqueeze(-1)).squeeze(-1)
        dv = torch.matmul(G_all, k_.unsqueeze(-1)).squeeze(-1)
        dk = torch.matmul(Gt, v_.unsqueeze(-1)).squeeze(-1)
        db = torch.matmul(Gt, U).squeeze(-1)
        da = torch.matmul(S_prev.transpose(-1, -2), Q).squeeze(-1)
        dw = (S_prev * G_all).sum(-2)
        back = lambda z: z.view(T, B, H, N).transpose(0, 1).reshape(B, T, C)
        return back(dr), back(dw), back(dk), back(dv), back(da), back(db), dstate, None


class ChannelMix(nn.Module):
    def __init__(self, C: int, layer_id: int, n_layer: int, ffn_mult: int = 4):
        super().__init__()
        self.x_k = nn.Parameter(torch.zeros(1, 1, C))
        self.key = nn.Linear(C, ffn_mult * C, bias=False)
        self.value = nn.Linear(ffn_mult * C, C, bias=False)
        with torch.no_grad():
            keep = 1.0 - layer_id / n_layer
            pos = torch.arange(C, dtype=torch.float32) / C
            self.x_k.copy_((1.0 - pos.pow(keep ** 4)).view(1, 1, C))
            b = 0.5 / math.sqrt(C)
            self.key.weight.uniform_(-b, b)
            self.value.weight.zero_()

    def forward(self, x, shift=None):
        prev = torch.zeros_like(x[:, :1]) if shift is None else shift.unsqueeze(1)
        d = torch.cat([prev, x[:, :-1]], dim=1) - x
        h = torch.relu(self.key(x + d * self.x_k)) ** 2
        return self.value(h), x[:, -1]


class Block(nn.Module):
    def __init__(self, C, H, layer_id, n_layer, lora):
        super().__init__()
        self.layer_id = layer_id
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(C)
        self.ln1 = nn.LayerNorm(C)
        self.ln2 = nn.LayerNorm(C)
        self.att = TimeMix(C, H, layer_id, n_layer, *lora)
        self.ffn = ChannelMix(C, layer_id, n_layer)


class TinyRWKV7(nn.Module):
    def __init__(self, vocab_size: int, n_embd: int = 256, n_layer: int = 4, head_size: int = 64,
                 lora=(32, 32, 16, 64)):
        super().__init__()
        self.config = dict(vocab_size=vocab_size, n_embd=n_embd, n_layer=n_layer, head_size=head_size,
                           lora=list(lora))
        C, H = n_embd, n_embd // head_size
        self.emb = nn.Embedding(vocab_size, C)
        self.blocks = nn.ModuleList([Block(C, H, i, n_layer, lora) for i in range(n_layer)])
        self.ln_out = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab_size, bias=False)
        with torch.no_grad():
            self.emb.weight.uniform_(-1e-4, 1e-4)
            nn.init.orthogonal_(self.head.weight, gain=0.5 * math.sqrt(vocab_size / C))
            self.head.weight.mul_(1.0 / math.sqrt(vocab_size))

    def forward(self, idx, state=None):
        """idx: (B, T) long.  state: None or a list with per layer (att_shift (B,C), S (B,H,N,N),
        ffn_shift (B,C)).  Returns logits (B, T, V) and the new state list."""
        x = self.blocks[0].ln0(self.emb(idx))
        v_first = None
        new_state = []
        for i, blk in enumerate(self.blocks):
            st = state[i] if state is not None else (None, None, None)
            out, v_first, sx_a, S = blk.att(blk.ln1(x), v_first, st[0], st[1])
            x = x + out
            out, sx_f = blk.ffn(blk.ln2(x), st[2])
            x = x + out
            new_state.append((sx_a, S, sx_f))
        return self.head(self.ln_out(x)), new_state

    def export_state_dict(self, dtype=torch.float32) -> dict:
        """Upstream training-checkpoint layout (reference 4.2), in a fixed key order."""
        sd = {}
        for name, p in self.named_parameters():
            t = p.detach().to(dtype).contiguous().clone()
            sd[name] = t
        return sd

    @classmethod
    def from_state_dict(cls, sd: dict, lora=None):
        V, C = sd["emb.weight"].shape
        H, N = sd["blocks.0.att.r_k"].shape
        L = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
        if lora is None:
            lora = tuple(sd[f"blocks.0.att.{n}1"].shape[1] for n in "wavg")
        m = cls(V, C, L, N, lora)
        m.load_state_dict({k: v.float() for k, v in sd.items()})
        return m


def param_groups(model: TinyRWKV7, weight_decay: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.dim() >= 2 and "r_k" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]
