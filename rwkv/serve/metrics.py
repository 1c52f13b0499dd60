"""The server's Prometheus metrics, in a registry of its own (several servers in one process,
as in tests, do not share counters)."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, window_s: float = 10.0):
        r = self.registry = CollectorRegistry()
        self.queue_depth = Gauge("rwkv_queue_depth", "Requests waiting for a slot", registry=r)
        self.active = Gauge("rwkv_active_sequences", "Sequences in the running batch (decoding or "
                            "prefilling)", registry=r)
        self.generated = Counter("rwkv_generated_tokens", "Tokens generated", registry=r)
        self.prompt = Counter("rwkv_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached = Counter("rwkv_cached_prompt_tokens", "Prompt tokens restored from the prefix "
                              "cache instead of computed", registry=r)
        self.requests = Counter("rwkv_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("rwkv_time_to_first_token_seconds", "From a request's arrival to its "
                              "first generated token", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("rwkv_inter_token_latency_seconds", "Between a request's consecutive "
                             "generated tokens", buckets=LATENCY_BUCKETS, registry=r)
        self.tps = Gauge("rwkv_tokens_per_second", f"Generated tokens per second over the last "
                         f"{window_s:g} s", registry=r)
        self._window = window_s
        self._recent: deque = deque()  # (time, tokens) of recent steps

    def step(self, n_tokens: int) -> None:
        """Record one engine step's generated tokens (updates the tokens/s gauge)."""
        now = time.monotonic()
        if n_tokens:
            self.generated.inc(n_tokens)
            self._recent.append((now, n_tokens))
        while self._recent and self._recent[0][0] < now - self._window:
            self._recent.popleft()
        self.tps.set(sum(n for _, n in self._recent) / self._window)

    def render(self) -> bytes:
        return generate_latest(self.registry)
