"""Token choice and text output for the server, in OpenAI's terms.

``sample_rows`` turns one step's logits (a row per sequence) into each sequence's next token, for
all rows at once: ``logit_bias`` added, then ``frequency_penalty * count + presence_penalty *
(count > 0)`` subtracted for every token the sequence generated so far (OpenAI's rule), then
greedy for ``temperature == 0`` (the first largest logit), else the logits divided by the
temperature, softmax, ``top_k`` and ``top_p`` truncation (the fewest most likely tokens whose
probabilities reach top_p) and one draw by inverse CDF with a uniform number from the sequence's
own ``torch.Generator`` (seeded from ``seed`` when given): a seeded request draws the same tokens
whatever else is in the batch. Per-sequence state (generator, bias, counts) is a ``Sampler``.

``TextOutput`` turns the generated tokens into text pieces as they become valid UTF-8 (a
character split over several tokens is held until it is whole, as ``PIPELINE.generate`` does)
and cuts the text at the first stop string, never emitting it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

from ..generation import _StopMatcher


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler (validated by rwkv/serve/protocol.py)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict = field(default_factory=dict)  # token id -> bias
    stop: tuple = ()  # stop strings
    stop_tokens: tuple = (0,)  # ids that end the text (the tokenizer's end of text)


class Sampler:
    """One sequence's sampling state: its parameters, random generator, logit bias and the counts
    of the tokens it generated (dense [V], kept only when a penalty needs them)."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        self.p = params
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed % (1 << 63))
        self.penalized = bool(params.presence_penalty or params.frequency_penalty)
        self.counts = torch.zeros(vocab_size) if self.penalized else None
        self.bias = None
        if params.logit_bias:
            ids = list(params.logit_bias)
            self.bias = (torch.tensor(ids, dtype=torch.long),
                         torch.tensor([float(params.logit_bias[i]) for i in ids]))

    def __call__(self, logits: torch.Tensor) -> int:
        """The next token from this sequence's logits [V] alone."""
        return sample_rows([self], logits.reshape(1, -1))[0]


def sample_rows(samplers: list, logits: torch.Tensor, limit: int | None = None) -> list:
    """The next token of every row of logits [n, V] (row i belongs to samplers[i]); see the
    module docstring. ``limit``: only ids below it are chosen (a tokenizer with fewer tokens than
    the model's vocabulary cannot decode the others). Updates each sampler's counts."""
    x = logits.float().clone()
    n, V = x.shape
    if limit is not None and limit < V:
        x[:, limit:] = float("-inf")
    for i, s in enumerate(samplers):
        if s.bias is not None:
            x[i].index_add_(0, *s.bias)
    pen = [i for i, s in enumerate(samplers) if s.penalized]
    if pen:
        counts = torch.stack([samplers[i].counts for i in pen])
        freq = torch.tensor([[samplers[i].p.frequency_penalty] for i in pen])
        pres = torch.tensor([[samplers[i].p.presence_penalty] for i in pen])
        x[pen] -= counts * freq + (counts > 0) * pres
    tokens = [0] * n
    greedy = [i for i, s in enumerate(samplers) if s.p.temperature == 0]
    drawn = [i for i, s in enumerate(samplers) if s.p.temperature != 0]
    if greedy:
        for i, t in zip(greedy, x[greedy].argmax(dim=1).tolist()):
            tokens[i] = t
    if drawn:
        temp = torch.tensor([[samplers[i].p.temperature] for i in drawn])
        probs = torch.softmax(x[drawn] / temp, dim=-1)
        u = torch.stack([torch.rand((), generator=samplers[i].generator) for i in drawn])
        for k, (i, t) in enumerate(zip(drawn, _draw(probs, u, [samplers[i].p for i in drawn]))):
            tokens[i] = t if t >= 0 else int(x[i].argmax())  # nothing to draw from: greedy
    for s, t in zip(samplers, tokens):
        if s.counts is not None:
            s.counts[t] += 1
    return tokens


#: How many of a truncated row's most likely tokens ``_draw`` looks at (all rows at once, each
#: size in turn for the rows the last did not settle); a row whose top_p is not reached among the
#: largest, or whose top_k is larger, is sorted whole.
HEADS = (64, 512)


def _draw(probs: torch.Tensor, u: torch.Tensor, params: list) -> list:
    """Row i's token drawn from probs [n, V] by inverse CDF at u[i] (uniform in [0, 1)), after
    params[i]'s top_k and top_p truncation; -1 where nothing is left to draw from. Rows without
    truncation are drawn together from their cumulative sums; truncated rows together from their
    most likely tokens where the truncation falls inside them (HEADS), else each sorted on its own
    (torch sorts one row several times faster per row than a batch of rows)."""
    n, V = probs.shape
    out = [-1] * n
    whole = [i for i, p in enumerate(params) if p.top_p >= 1 and not 0 < p.top_k < V]
    if whole:
        cdf = torch.cumsum(probs[whole], dim=-1)
        pick = torch.searchsorted(cdf, (u[whole] * cdf[:, -1]).unsqueeze(1)).clamp_(max=V - 1).squeeze(1)
        ok = (torch.isfinite(cdf[:, -1]) & (cdf[:, -1] > 0)).tolist()
        for i, t, good in zip(whole, pick.tolist(), ok):
            out[i] = t if good else -1
    cut = [i for i in range(n) if i not in whole]
    for head in HEADS:  # the most likely `head` tokens of each truncated row, all rows at once
        if not cut or head >= V:
            break
        values, order = torch.topk(probs[cut], head, dim=-1)
        cum = torch.cumsum(values, dim=-1)
        top_p = torch.tensor([[params[i].top_p] for i in cut])
        top_k = torch.tensor([[params[i].top_k if 0 < params[i].top_k < V else V] for i in cut])
        keep = ((cum - values) < top_p) & (torch.arange(head) < top_k)
        keep[:, 0] = True
        # The truncation ends inside the head: top_p reached there, or top_k at most the head.
        inside = (((cum[:, -1:] >= top_p) & (top_p < 1)) | (top_k <= head)).squeeze(1).tolist()
        cdf = torch.cumsum(values * keep, dim=-1)
        pick = torch.searchsorted(cdf, (u[cut] * cdf[:, -1]).unsqueeze(1)).clamp_(max=head - 1)
        chosen = order.gather(1, pick).squeeze(1).tolist()
        ok = (torch.isfinite(cdf[:, -1]) & (cdf[:, -1] > 0)).tolist()
        for i, t, good, done in zip(cut, chosen, ok, inside):
            if done:
                out[i] = t if good else -1
        cut = [i for i, done in zip(cut, inside) if not done]
    for i in cut:  # a wider nucleus: the row sorted whole
        p = params[i]
        values, order = torch.sort(probs[i], descending=True)
        keep = V if not 0 < p.top_k < V else p.top_k
        if p.top_p < 1:  # the fewest most likely tokens whose probabilities reach top_p
            reach = int(torch.searchsorted(torch.cumsum(values[:keep], 0), torch.tensor(p.top_p))) + 1
            keep = max(1, min(keep, reach))
        cdf = torch.cumsum(values[:keep], 0)
        total = float(cdf[-1])
        if not (total > 0 and total != float("inf")):
            continue
        j = min(int(torch.searchsorted(cdf, u[i] * total)), keep - 1)
        out[i] = int(order[j])
    return out


class TextOutput:
    """Text pieces of the generated tokens (module docstring). ``add(token)`` returns the new
    pieces; ``stopped`` tells whether a stop string ended the text; ``flush()`` the rest."""

    def __init__(self, decode, stop: tuple, strip_leading: bool = False):
        self.decode = decode
        self.tokens: list = []
        self._sent = 0  # tokens whose text is out
        self._stop = _StopMatcher(list(stop))
        self._strip = strip_leading
        self.text = ""

    @property
    def stopped(self) -> bool:
        return self._stop.stopped

    def add(self, token: int) -> list:
        self.tokens.append(token)
        text = self.decode(self.tokens[self._sent:])
        if "\ufffd" in text:
            return []
        self._sent = len(self.tokens)
        return self._out(self._stop.feed(text))

    def flush(self) -> list:
        return [] if self.stopped else self._out(self._stop.flush())

    def _out(self, pieces: list) -> list:
        if self._strip:
            pieces = [p.lstrip() if not self.text else p for p in pieces]
            pieces = [p for p in pieces if p]
            if pieces:
                self._strip = False
        self.text += "".join(pieces)
        return pieces
