"""The server's core, independent of the web framework: the model and tokenizer, the limits, the
chat format, and turning an OpenAI request into a scheduled ``Job`` and its events into OpenAI's
response bodies. ``rwkv/serve/app.py`` puts it behind FastAPI; ``rwkv/serve/ray_app.py`` runs the
same app as Ray Serve replicas.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from ..cli.common import SHIPPED_MODEL, vocab_for
from .metrics import Metrics
from .protocol import ApiError, ChatRequest, CompletionRequest
from .sampler import SamplingParams
from .scheduler import Job, Scheduler, request_id

@dataclass
class ServeConfig:
    """Everything ``python -m rwkv serve`` takes (see rwkv/cli/serve.py for the options)."""

    model: str = ""
    strategy: str = "cpu fp32"
    tokenizer: str | None = None  # None: the tokenizer.json beside the model, else the World vocabulary
    model_name: str | None = None  # None: the checkpoint's file name without .pth
    max_batch: int = 32
    max_queue: int = 256
    max_prompt_tokens: int = 8192
    max_tokens: int = 4096  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when a request gives none (completions: OpenAI's 16)
    prefill_chunk: int = 256
    cache_bytes: int = 1 << 30  # prefix-state cache budget (0: no cache)
    system_prompt: str = ""
    user_name: str = "User"
    assistant_name: str = "Assistant"
    system_name: str = "System"

    def resolved(self) -> "ServeConfig":
        """The defaults filled in: the shipped model, the tokenizer beside the checkpoint (else the
        World vocabulary), the checkpoint's file name as the model's name."""
        model = self.model or str(SHIPPED_MODEL)
        tok = vocab_for(model, self.tokenizer)
        name = self.model_name or Path(model).name.removesuffix(".pth")
        return ServeConfig(**{**self.__dict__, "model": model, "tokenizer": tok, "model_name": name})


class Server:
    def __init__(self, config: ServeConfig, model=None):
        from ..model import RWKV
        from ..utils import PIPELINE

        self.config = cfg = config.resolved()
        self.model = model if model is not None else RWKV(cfg.model, cfg.strategy, verbose=False)
        self.pipeline = PIPELINE(self.model, cfg.tokenizer)
        vocab = self.model.args.vocab_size
        if self.pipeline.vocab_size_of_tokenizer() > vocab:
            raise ValueError(f"the tokenizer {cfg.tokenizer!r} has {self.pipeline.vocab_size_of_tokenizer()} "
                             f"tokens but the model's vocabulary has {vocab}; pass the model's own tokenizer "
                             "with --tokenizer")
        self.vocab = vocab
        self.metrics = Metrics()
        self.scheduler = Scheduler(self.model, self._decode, self.metrics, max_batch=cfg.max_batch,
                                   max_queue=cfg.max_queue, prefill_chunk=cfg.prefill_chunk,
                                   cache_bytes=cfg.cache_bytes,
                                   token_limit=self.pipeline.vocab_size_of_tokenizer())
        self.created = int(time.time())

    def close(self) -> None:
        self.scheduler.close()

    def _decode(self, tokens: list) -> str:
        return self.pipeline.decode(tokens)

    def _encode(self, text: str) -> list:
        return list(self.pipeline.encode(text))

    # ------------------------------------------------------------------------------ requests
    def check_model(self, name: str) -> None:
        if name != self.config.model_name:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves "
                                f"'{self.config.model_name}'", param="model", code="model_not_found")

    def _params(self, req, max_tokens: int | None, extra_stop: tuple = ()) -> SamplingParams:
        for param, why in req.unsupported():
            raise ApiError(400, why, param=param, code="unsupported_parameter")
        cfg = self.config
        n = cfg.default_max_tokens if max_tokens is None else max_tokens
        if n > cfg.max_tokens:
            raise ApiError(400, f"max_tokens is {n}, above this server's limit of {cfg.max_tokens}",
                           param="max_tokens")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > 4:
            raise ApiError(400, f"at most 4 stop sequences are allowed, got {len(stop)}", param="stop")
        bias = {}
        for key, value in (req.logit_bias or {}).items():
            try:
                tid = int(key)
            except ValueError:
                raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
            if not 0 <= tid < self.vocab:
                raise ApiError(400, f"logit_bias token id {tid} is out of range (0..{self.vocab - 1})",
                               param="logit_bias")
            bias[tid] = value
        return SamplingParams(max_tokens=n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                              presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                              seed=req.seed, logit_bias=bias, stop=tuple(s for s in stop + list(extra_stop) if s))

    def _checked_prompt(self, tokens: list, param: str) -> list:
        if not tokens:
            raise ApiError(400, f"the {param} is empty (it encodes to no tokens)", param=param)
        limit = self.config.max_prompt_tokens
        if len(tokens) > limit:
            raise ApiError(400, f"the {param} has {len(tokens)} tokens, above this server's limit of {limit}",
                           param=param, code="context_length_exceeded")
        bad = [t for t in tokens if not 0 <= t < self.vocab]
        if bad:
            raise ApiError(400, f"the {param} has token id {bad[0]}, out of range (0..{self.vocab - 1})",
                           param=param)
        return tokens

    def completion_job(self, req: CompletionRequest, emit) -> Job:
        self.check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request is supported; send one request per prompt",
                               param="prompt", code="unsupported_parameter")
            prompt = prompt[0]
        tokens = self._encode(prompt) if isinstance(prompt, str) else list(prompt)
        params = self._params(req, req.max_tokens)
        return Job(self._checked_prompt(tokens, "prompt"), params, emit)

    def chat_job(self, req: ChatRequest, emit) -> Job:
        """The messages in RWKV's chat format, one ``Name: text\\n\\n`` block each (a system prompt
        first when configured and the request has none), then ``Assistant:``. Each block is
        tokenized on its own, so a conversation's earlier turns are the same tokens in every
        request and their states are found in the prefix cache."""
        self.check_model(req.model)
        cfg = self.config
        names = {"system": cfg.system_name, "developer": cfg.system_name, "user": cfg.user_name,
                 "assistant": cfg.assistant_name}
        msgs = [(m.role, m.text()) for m in req.messages]
        if cfg.system_prompt and not any(r in ("system", "developer") for r, _ in msgs):
            msgs.insert(0, ("system", cfg.system_prompt))
        tokens, marks = [], []
        for role, text in msgs:
            text = text.strip().replace("\r\n", "\n").replace("\n\n", "\n")
            tokens += self._encode(f"{names[role]}: {text}\n\n")
            marks.append(len(tokens))
        tokens += self._encode(f"{cfg.assistant_name}:")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = self._params(req, max_tokens, extra_stop=(f"\n\n{cfg.user_name}:", f"\n\n{cfg.system_name}:"))
        return Job(self._checked_prompt(tokens, "messages"), params, emit, marks=tuple(marks), strip_leading=True)

    def submit(self, job: Job) -> None:
        self.scheduler.submit(job)


class EventStream:
    """A job's events on the asyncio side: ``emit`` is handed to the engine thread; ``get()``
    awaits the next event."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def emit(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    async def get(self) -> tuple:
        return await self.queue.get()


def completion_body(kind: str, rid: str, model: str, created: int, text: str, reason, usage=None) -> dict:
    """A response (or stream chunk) body of either endpoint with one choice."""
    if kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        body = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    elif kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": reason}
        body = {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice]}
    else:  # chat.completion.chunk: text is the delta's content (None: an empty delta)
        delta = {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return body


__all__ = ["ServeConfig", "Server", "EventStream", "completion_body", "request_id", "ApiError"]
