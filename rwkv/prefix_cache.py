"""A prefix-state cache: skip re-processing a prompt whose beginning was processed before.

``PrefixCache(max_entries, max_bytes)`` maps token-id sequences to (state, logits) snapshots. ``lookup``
returns the longest cached key that is a prefix of the asked tokens. Entries are evicted least
recently used first once either limit is exceeded. Everything is deep-copied on the way in and on
the way out, so neither the caller nor a later in-place ``forward`` can corrupt a cached state.
Exported as ``rwkv.generation.PrefixCache``; thread-safe (one lock).
"""

import copy
import threading
from collections import OrderedDict
from typing import Any, NamedTuple, Optional

__all__ = ["PrefixCache", "CacheHit", "clone_state", "state_nbytes"]


class CacheHit(NamedTuple):
    """What ``PrefixCache.lookup`` found: the state (and logits) after the first ``n_tokens``
    tokens of the prompt, as private copies the caller may modify."""

    n_tokens: int          # how many leading tokens the cached state covers
    state: Any             # a private deep copy of the state after those tokens
    logits: Any            # a private copy of the logits after the last of them (or None)


def clone_state(obj):
    """Deep copy of a state: tensors are cloned (same device/dtype), containers rebuilt."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if obj is None:
        return None
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, list):
        return [clone_state(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(clone_state(x) for x in obj)
    return copy.deepcopy(obj)


def state_nbytes(obj):
    """Bytes held by the tensors/arrays inside ``obj`` (lists and tuples are walked)."""
    if obj is None:
        return 0
    if isinstance(obj, (list, tuple)):
        return sum(state_nbytes(x) for x in obj)
    if hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        return int(obj.element_size() * obj.nelement())
    return int(getattr(obj, "nbytes", 0))


class PrefixCache:
    """Model states keyed by the token ids that produced them, to skip recomputing a prompt's
    processed prefix (a chat's earlier turns, a retry, a shared system prompt).

    ``put(tokens, state, logits)`` stores a snapshot; ``lookup(tokens)`` returns the longest stored
    prefix of ``tokens`` as a ``CacheHit`` (or None). Least recently used entries go first when
    there are more than ``max_entries`` or their tensors exceed ``max_bytes``; an entry larger than
    the whole budget is not stored. States are copied in and out, so neither the caller nor a later
    in-place ``forward`` can change a stored state. Thread-safe; ``hits`` and ``misses`` count
    lookups. ``PIPELINE.generate(..., cache=cache)`` uses it for the prompt and stores the state
    after the prompt and after the reply.

    >>> cache = PrefixCache(max_entries=8, max_bytes=1 << 30)
    >>> logits, state = model.forward(tokens, None)                     # doctest: +SKIP
    >>> cache.put(tokens, state, logits)                                # doctest: +SKIP
    >>> hit = cache.lookup(tokens + more)                                # doctest: +SKIP
    >>> logits, state = model.forward(more, hit.state)                   # doctest: +SKIP
    """

    def __init__(self, max_entries: int = 16, max_bytes: int = 2 << 30):
        if int(max_entries) < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if int(max_bytes) < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._entries = OrderedDict()  # tuple(tokens) -> (state, logits, nbytes)
        self._nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return len(self._entries)

    @property
    def nbytes(self):
        """Bytes held by the stored states and logits."""
        return self._nbytes

    def clear(self):
        """Forget every entry (the hit and miss counts are kept)."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def put(self, tokens, state, logits=None) -> bool:
        """Store a snapshot of ``state`` (and ``logits``) after ``tokens``. Returns False when the
        entry alone exceeds ``max_bytes`` (nothing is stored) or ``tokens`` is empty."""
        key = _key(tokens)
        if not key or state is None:
            return False
        size = state_nbytes(state) + state_nbytes(logits)
        if size > self.max_bytes:
            return False
        snapshot = (clone_state(state), clone_state(logits), size)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old[2]
            self._entries[key] = snapshot
            self._nbytes += size
            while len(self._entries) > self.max_entries or self._nbytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._nbytes -= evicted[2]
        return True

    def lookup(self, tokens, max_len: Optional[int] = None) -> Optional[CacheHit]:
        """The longest cached prefix of ``tokens`` (at most ``max_len`` long), or None."""
        key = _key(tokens)
        limit = len(key) if max_len is None else min(len(key), int(max_len))
        with self._lock:
            best = None
            for cached in self._entries:
                n = len(cached)
                if n <= limit and (best is None or n > len(best)) and key[:n] == cached:
                    best = cached
            if best is None:
                self.misses += 1
                return None
            self._entries.move_to_end(best)
            state, logits, _ = self._entries[best]
            self.hits += 1
            state, logits = clone_state(state), clone_state(logits)
        return CacheHit(len(best), state, logits)

    def __repr__(self):
        return (f"PrefixCache({len(self)}/{self.max_entries} entries, {self._nbytes}/{self.max_bytes} "
                f"bytes, hits={self.hits}, misses={self.misses})")


def _key(tokens):
    key = tuple(int(t) for t in tokens)
    return key
