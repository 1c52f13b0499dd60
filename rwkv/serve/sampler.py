"""Per-request token choice and text output for the server, in OpenAI's terms.

``Sampler`` turns a sequence's logits into its next token: ``logit_bias`` added, then
``frequency_penalty * count + presence_penalty * (count > 0)`` subtracted for every token generated
so far (OpenAI's rule), then greedy for ``temperature == 0`` (the first largest logit), else the
logits divided by the temperature, softmax, ``top_k`` and ``top_p`` truncation and one draw from
the request's own ``torch.Generator`` (seeded from ``seed`` when given, so a seeded request draws
the same tokens whatever else the server is doing).

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
    """The next token of one request from its logits [V] fp32 (module docstring)."""

    def __init__(self, params: SamplingParams):
        self.p = params
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed % (1 << 63))
        self.counts: dict = {}
        self._bias = None
        if params.logit_bias:
            ids = list(params.logit_bias)
            self._bias = (torch.tensor(ids, dtype=torch.long),
                          torch.tensor([float(params.logit_bias[i]) for i in ids]))

    def __call__(self, logits: torch.Tensor) -> int:
        p = self.p
        x = logits.float()
        if self._bias is not None or (self.counts and (p.presence_penalty or p.frequency_penalty)):
            x = x.clone()
            if self._bias is not None:
                x.index_add_(0, *self._bias)
            if self.counts and (p.presence_penalty or p.frequency_penalty):
                ids = torch.tensor(list(self.counts), dtype=torch.long)
                n = torch.tensor([float(c) for c in self.counts.values()])
                x.index_add_(0, ids, -(n * p.frequency_penalty + p.presence_penalty))
        token = self._choose(x)
        self.counts[token] = self.counts.get(token, 0) + 1
        return token

    def _choose(self, x: torch.Tensor) -> int:
        p = self.p
        if p.temperature == 0:
            return int(torch.argmax(x))
        probs = torch.softmax(x / p.temperature, dim=-1)
        if 0 < p.top_k < probs.numel() or p.top_p < 1:
            values, order = torch.sort(probs, descending=True)
            keep = values.numel()
            if 0 < p.top_k < keep:
                keep = p.top_k
            if p.top_p < 1:
                # the fewest most likely tokens whose probabilities reach top_p (at least one)
                reach = int(torch.searchsorted(torch.cumsum(values[:keep], 0), torch.tensor(p.top_p))) + 1
                keep = min(keep, max(1, reach))
            probs = torch.zeros_like(probs).index_put_((order[:keep],), values[:keep])
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
            return int(torch.argmax(x))  # nothing left to draw from (e.g. all -inf but one)
        return int(torch.multinomial(probs, 1, generator=self.generator))


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
