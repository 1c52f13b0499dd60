"""Continuous batching: one thread drives a ``BatchDecoder`` for every request in flight.

Requests wait in a bounded queue until a slot is free; then their prompt joins the engine (the
longest cached prefix restored from the ``PrefixCache`` instead of recomputed, the rest prefilled
in chunks between the decode steps of the others). Every step feeds each decoding sequence the
token sampled from its last logits, so the batch changes between steps as requests join and
finish. Prompt states at message boundaries are stored in the prefix cache as the prefill passes
them (a repeated system prompt or a conversation's earlier turns are then not recomputed).

A request's events go to its asyncio queue through its event loop (thread-safe): ``("text",
piece)``, then ``("done", finish_reason, usage)`` or ``("error", ApiError)``. A cancelled request
(client gone) leaves the batch at the next step and frees its slot.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..engine import BatchDecoder
from ..prefix_cache import PrefixCache
from .protocol import ApiError
from .sampler import Sampler, SamplingParams, TextOutput, sample_rows


@dataclass
class Job:
    """One request as the engine thread sees it."""

    tokens: list  # the prompt's ids
    params: SamplingParams
    emit: callable  # emit(event tuple), thread-safe
    marks: tuple = ()  # prompt positions worth caching (message boundaries)
    strip_leading: bool = False  # drop the reply's leading whitespace (chat)
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    # engine-side
    handle: int | None = None
    sampler: Sampler | None = None
    out: TextOutput | None = None
    next_token: int | None = None
    first_at: float | None = None
    last_at: float | None = None
    cached: int = 0

    def cancel(self) -> None:
        """Ask the engine thread to drop this request (safe from any thread)."""
        self.cancelled = True


class QueueFull(ApiError):
    def __init__(self, limit: int, retry_after: int):
        super().__init__(429, f"the server is at capacity ({limit} requests queued); retry later",
                         type="rate_limit_error", code="queue_full", headers={"Retry-After": str(retry_after)})


class Scheduler:
    def __init__(self, model, decode, metrics, *, max_batch: int, max_queue: int, prefill_chunk: int,
                 cache_bytes: int, cache_entries: int = 256, token_limit: int | None = None):
        """token_limit: the ids the tokenizer decodes (only those are sampled)."""
        self.token_limit = token_limit
        self.engine = BatchDecoder(model, max_batch, prefill_chunk=prefill_chunk)
        self.engine_vocab = model.args.vocab_size
        self.decode = decode
        self.metrics = metrics
        self.max_queue = max_queue
        self.cache = PrefixCache(max_entries=cache_entries, max_bytes=cache_bytes) if cache_bytes > 0 else None
        self._waiting: deque = deque()
        self._jobs: dict = {}  # handle -> Job
        self._cv = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="rwkv-engine", daemon=True)
        self._thread.start()

    # --------------------------------------------------------------------- from request handlers
    def submit(self, job: Job) -> None:
        with self._cv:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(self.max_queue, retry_after=1)
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cv.notify()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._running = False
            self._cv.notify()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict:
        return {"waiting": len(self._waiting), "active": len(self.engine), "free_slots": self.engine.free,
                "max_batch": self.engine.max_batch}

    # ------------------------------------------------------------------------- engine thread
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while self._running and not self._waiting and not self._jobs:
                    self._cv.wait(timeout=1.0)
                if not self._running:
                    break
            try:
                self._drop_cancelled()
                self._admit()
                self._step()
            except Exception as e:  # a bug: fail the requests in flight, keep serving
                self._fail_all(e)
        self._fail_all(RuntimeError("the server is shutting down"), status=503)

    def _drop_cancelled(self) -> None:
        for h, job in list(self._jobs.items()):
            if job.cancelled:
                self._finish(job, None)
        with self._cv:
            kept = [j for j in self._waiting if not j.cancelled]
            if len(kept) != len(self._waiting):
                self._waiting = deque(kept)
                self.metrics.queue_depth.set(len(self._waiting))

    def _admit(self) -> None:
        while self.engine.free > 0:
            with self._cv:
                if not self._waiting:
                    return
                job = self._waiting.popleft()
                self.metrics.queue_depth.set(len(self._waiting))
            self._start(job)

    def _start(self, job: Job) -> None:
        job.sampler = Sampler(job.params, self.engine_vocab)
        job.out = TextOutput(self.decode, job.params.stop, job.strip_leading)
        tokens, hit = job.tokens, None
        if self.cache is not None:
            hit = self.cache.lookup(tokens)
        self.metrics.prompt.inc(len(tokens))
        if hit is not None and hit.n_tokens == len(tokens) and hit.logits is not None:
            job.cached = hit.n_tokens
            job.handle = self.engine.add(state=hit.state)
            self._jobs[job.handle] = job
            self._on_logits([job], hit.logits.reshape(1, -1))
        else:
            n = 0 if hit is None else hit.n_tokens
            job.cached = n
            marks = [m - n for m in job.marks if n < m < len(tokens)]
            job.handle = self.engine.add(tokens[n:], None if hit is None else hit.state, snapshots=marks)
            self._jobs[job.handle] = job
        self.metrics.cached.inc(job.cached)
        self.metrics.active.set(len(self.engine))

    def _step(self) -> None:
        feed = {h: j.next_token for h, j in self._jobs.items() if j.next_token is not None}
        if not feed and not self.engine.prefilling:
            return
        out = self.engine.step(feed)
        for j in self._jobs.values():
            if j.handle in feed:
                j.next_token = None
        if self.cache is not None:
            for snap in out.snapshots:
                job = self._jobs.get(snap.handle)
                if job is not None:
                    self.cache.put(job.tokens[:job.cached + snap.n_tokens], snap.state, snap.logits)
        rows = [i for i, h in enumerate(out.handles) if h in self._jobs]
        if rows:
            self._on_logits([self._jobs[out.handles[i]] for i in rows], out.logits[rows])
        self.metrics.step(len(rows))

    def _on_logits(self, jobs: list, logits: torch.Tensor) -> None:
        """Sample every job's next token from its row of logits [n, V] (all rows at once), emit
        its text, finish it or queue the token."""
        now = time.monotonic()
        for job, token in zip(jobs, sample_rows([j.sampler for j in jobs], logits, self.token_limit)):
            if job.cancelled:
                self._finish(job, None)
            else:
                self._on_token(job, token, now)

    def _on_token(self, job: Job, token: int, now: float) -> None:
        if job.first_at is None:
            job.first_at = now
            self.metrics.ttft.observe(now - job.arrived)
        else:
            self.metrics.itl.observe(now - job.last_at)
        job.last_at = now
        if token in job.params.stop_tokens:
            return self._finish(job, "stop")
        for piece in job.out.add(token):
            job.emit(("text", piece))
        if job.out.stopped:
            return self._finish(job, "stop")
        if len(job.out.tokens) >= job.params.max_tokens:
            return self._finish(job, "length")
        job.next_token = token

    def _finish(self, job: Job, reason: str | None) -> None:
        if job.handle is not None and job.handle in self.engine:
            self.engine.remove(job.handle)
        self._jobs.pop(job.handle, None)
        self.metrics.active.set(len(self.engine))
        if reason is None:  # cancelled: nobody is listening
            return
        for piece in job.out.flush():
            job.emit(("text", piece))
        n = len(job.out.tokens)
        job.emit(("done", reason, {"prompt_tokens": len(job.tokens), "completion_tokens": n,
                                   "total_tokens": len(job.tokens) + n}))

    def _fail_all(self, err: Exception, status: int = 500) -> None:
        error = ApiError(status, f"internal error while generating: {type(err).__name__}: {err}",
                         type="server_error" if status == 500 else "service_unavailable")
        jobs = list(self._jobs.values())
        with self._cv:
            jobs += list(self._waiting)
            self._waiting.clear()
        for job in jobs:
            if job.handle is not None and job.handle in self.engine:
                self.engine.remove(job.handle)
            job.emit(("error", error))
        self._jobs.clear()


_ids = itertools.count()


def request_id(prefix: str) -> str:
    return f"{prefix}-{int(time.time() * 1000):x}{next(_ids):06x}"
