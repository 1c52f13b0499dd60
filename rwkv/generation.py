"""Text generation: upstream's ``PIPELINE.generate`` loop, as a stream, with beyond-upstream extras.

``GenerationStream`` runs exactly upstream 0.8.32's loop (prompt chunked by ``args.chunk_len``, then
one token per step; ``token_ban`` -> -inf; presence/frequency penalties with decay before counting and
the substring whitespace/digit rule; ``token_stop`` ends without emitting; text is released only when
the decoded tail holds no U+FFFD). On top of that, all optional:

* iteration yields the text pieces as they become valid UTF-8 (``PIPELINE.generate_stream``);
* ``stop=[...]``: stop strings; text that could be the start of a stop string is held back, and the
  stop string itself is never emitted;
* ``generator``: an int seed or generator for repeatable sampling (see ``rwkv.sampling``);
* ``cache``: a ``PrefixCache``; the prompt's longest cached prefix is restored instead of recomputed,
  and the prompt's and the final state are stored back (only when the caller passes no ``state``);
* ``.result`` (after the stream is exhausted): a ``GenerationResult`` with the text, the generated
  tokens and, when ``complete_state`` (the default for streams), the state and logits after the prompt
  *and every generated token* (the last sampled token is fed once more at the end, which upstream's
  ``generate`` never does).

Penalties are applied to a copy of the model's logits (upstream edits the model's tensor in place; the
caller never sees it, so results are identical). The prompt may be a string or a list of token ids.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from .prefix_cache import CacheHit, PrefixCache, clone_state
from .sampling import check_sampling_args, check_token_ban, resolve_generator

__all__ = ["GenerationStream", "GenerationResult", "PrefixCache", "CacheHit", "clone_state"]

_ZERO_WEIGHT_TEXT = " \t0123456789"


@dataclass
class GenerationResult:
    """What one generation produced (``GenerationStream.result``): the text and tokens, the state
    and logits after the prompt and the tokens, why it stopped, and how many prompt tokens came
    from the prefix cache and how many went through ``model.forward``."""

    text: str = ""
    tokens: List[int] = field(default_factory=list)  # generated tokens (the stop token excluded)
    state: Any = None            # after prompt + tokens when complete_state, else as upstream leaves it
    logits: Any = None           # logits matching ``state`` (no bans or penalties applied)
    stop_reason: str = "length"  # "length" | "token_stop" | "stop_string"
    prompt_tokens: int = 0       # tokens in the prompt
    cached_tokens: int = 0       # prompt tokens restored from the prefix cache instead of computed
    forward_tokens: int = 0      # tokens this call fed through model.forward


def apply_penalties(logits, occurrence, args):
    """Upstream's ``logits[n] -= alpha_presence + occurrence[n] * alpha_frequency`` for every token
    n seen, in place. For fp32 or fp64 logits (the model's) one indexed update, each Python float
    rounded to the logits' dtype as that scalar subtraction rounds it, so each logit gets the same
    value, with ~3 tensor ops fewer per distinct token seen. Other dtypes: upstream's loop."""
    if not occurrence:
        return
    values = [args.alpha_presence + occurrence[n] * args.alpha_frequency for n in occurrence]
    if logits.dtype in (torch.float32, torch.float64):
        logits[list(occurrence)] -= torch.tensor(values, dtype=logits.dtype, device=logits.device)
    else:
        for n, value in zip(occurrence, values):
            logits[n] -= value


class _StopMatcher:
    """Holds back text that may begin a stop string; cuts the text at the first stop string."""

    def __init__(self, stops):
        if isinstance(stops, str):
            stops = [stops]
        stops = list(stops or [])
        for s in stops:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.stopped = False

    def feed(self, text):
        if not self.stops:
            return [text]
        self.buf += text
        found = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if found:
            out, self.buf, self.stopped = self.buf[:min(found)], "", True
            return [out] if out else []
        keep = 0
        for k in range(min(len(self.buf), max(map(len, self.stops)) - 1), 0, -1):
            tail = self.buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                keep = k
                break
        out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return [out] if out else []

    def flush(self):
        out, self.buf = self.buf, ""
        return [out] if out else []


class GenerationStream:
    """Iterator over generated text pieces; ``.result`` (a ``GenerationResult``) is set once it is
    exhausted. Made by ``PIPELINE.generate_stream``; ``run()`` consumes it and returns the result."""

    def __init__(self, pipeline, ctx, token_count, args, callback=None, state=None, *, stop=None,
                 generator=None, cache: Optional[PrefixCache] = None, complete_state=True):
        if cache is not None and not isinstance(cache, PrefixCache):
            raise TypeError(f"cache must be a rwkv.generation.PrefixCache, got {type(cache).__name__}")
        self.pipeline = pipeline
        self.args = args
        self.callback = callback
        self.cache = cache
        self.complete_state = complete_state
        self.token_count = int(token_count)
        self.result: Optional[GenerationResult] = None
        self._ctx = ctx
        self._state = state
        self._stop = _StopMatcher(stop)
        self._generator = generator
        # Checked before the prompt runs, so that bad arguments leave the caller's state untouched.
        check_sampling_args(args.temperature, args.top_p, args.top_k)
        vocab = getattr(pipeline, "model_vocab_size", lambda: None)()
        self._banned = None if vocab is None else check_token_ban(args.token_ban, vocab)
        self._it = self._run()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def run(self) -> GenerationResult:
        """Consume the stream and return its result."""
        for _ in self:
            pass
        return self.result

    # -- internals -------------------------------------------------------------------------------------
    def _forward(self, tokens, state, res):
        model, chunk = self.pipeline.model, self.args.chunk_len
        out = None
        while len(tokens) > 0:
            out, state = model.forward(tokens[:chunk], state)
            res.forward_tokens += len(tokens[:chunk])
            tokens = tokens[chunk:]
        return out, state

    def _prompt(self, res):
        ctx = self._ctx
        if isinstance(ctx, str):
            tokens = self.pipeline.encode(ctx)
        else:
            tokens = [int(t) for t in ctx]
        res.prompt_tokens = len(tokens)
        state, out, use_cache = self._state, None, self.cache is not None and self._state is None
        if use_cache:
            hit = self.cache.lookup(tokens)
            if hit is not None and hit.logits is None and hit.n_tokens == len(tokens):
                hit = self.cache.lookup(tokens, max_len=len(tokens) - 1)
            if hit is not None:
                res.cached_tokens, state, out = hit.n_tokens, hit.state, hit.logits
        if len(tokens) == 0:
            raise ValueError("generate: the prompt encodes to no tokens, so there are no logits to sample "
                             "from (upstream fails here with UnboundLocalError); pass a non-empty prompt")
        rest = tokens[res.cached_tokens:]
        if rest:
            out, state = self._forward(rest, state, res)
            if use_cache:
                self.cache.put(tokens, state, out)
        return tokens, out, state

    def _emit(self, pieces, res):
        for piece in pieces:
            if self.callback:
                self.callback(piece)
            res.text += piece
            yield piece

    def _run(self):
        args, pipe = self.args, self.pipeline
        res = GenerationResult()
        all_tokens, out_last, occurrence = [], 0, {}
        state, out, token, fed, prompt = self._state, None, None, 0, None
        generator = self._generator
        for i in range(self.token_count):
            if i == 0:
                prompt, out, state = self._prompt(res)
                generator = resolve_generator(generator, out.device)
            else:
                out, state = self._forward([token], state, res)
                fed = len(all_tokens)
            logits = out.clone()
            if self._banned is None:  # a model that does not tell its vocabulary size
                self._banned = check_token_ban(args.token_ban, logits.shape[-1])
            for n in self._banned:
                logits[n] = -float("inf")
            apply_penalties(logits, occurrence, args)
            token = pipe.sample_logits(logits, temperature=args.temperature, top_p=args.top_p,
                                       top_k=args.top_k, generator=generator)
            if token in args.token_stop:
                res.stop_reason = "token_stop"
                break
            all_tokens.append(token)
            for n in occurrence:
                occurrence[n] *= args.alpha_decay
            weight = 0 if pipe.decode([token]) in _ZERO_WEIGHT_TEXT else 1
            occurrence[token] = occurrence.get(token, 0) + weight
            text = pipe.decode(all_tokens[out_last:])
            if "\ufffd" not in text:
                out_last = len(all_tokens)
                yield from self._emit(self._stop.feed(text), res)
                if self._stop.stopped:
                    res.stop_reason = "stop_string"
                    break
        if not self._stop.stopped:
            yield from self._emit(self._stop.flush(), res)
        if self.complete_state and fed < len(all_tokens):
            out, state = self._forward(all_tokens[fed:], state, res)
        if self.complete_state and all_tokens and self.cache is not None and self._state is None:
            self.cache.put(list(prompt) + all_tokens, state, out)
        res.tokens, res.state, res.logits = all_tokens, state, out
        self.result = res
