"""Many sequences at once: ``forward_batch`` and the slot-based ``BatchDecoder``.

A batch is rows. Each decode step takes one token of each of B sequences as the rows of one
[B, C] activation, so every weight is read once for all B sequences (``Runtime.step_rows``); the
sequences' recurrent states are stacked per state entry, ``[B, *shape]``, on their layer's device.

``BatchDecoder`` keeps the states of up to ``max_batch`` sequences in preallocated slots. The
sequences that are decoding occupy slots ``0 .. n-1`` in order, so a step over all of them works on
the slots themselves, with no per-step copies; a sequence that leaves has the last one moved into
its slot (one state copy). A new sequence's prompt is prefilled in chunks (sequence mode, its
own state) interleaved with the decode steps of the others, so a long prompt does not stall them;
when its prompt is done it takes the next slot.

Typical use (what a server loop does)::

    engine = BatchDecoder(model, max_batch=16)
    a = engine.add(prompt_ids)                  # prefilled over the next steps
    out = engine.step()                         # out.handles == [a] once a's prompt is done
    nxt = {h: sample(l) for h, l in out}        # next token of every sequence that has logits
    out = engine.step(nxt)                      # one token each, [B, V] logits
    state = engine.export(a); engine.remove(a)  # upstream's state layout
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from .models.base import StateError, TokenError

__all__ = ["BatchDecoder", "StepOutput", "Snapshot", "EngineFullError", "UnknownSequenceError", "forward_batch"]


class EngineFullError(ValueError):
    """``BatchDecoder.add`` with every slot taken (remove a sequence first)."""


class UnknownSequenceError(ValueError, KeyError):
    """A handle the BatchDecoder does not hold, or one that cannot take the call yet (a sequence
    still prefilling cannot be fed). Subclasses KeyError too: a handle is a key."""

    __str__ = ValueError.__str__


@dataclass
class Snapshot:
    """A prefilling sequence's state after the first ``n_tokens`` of the prompt it was added
    with (a position asked for with ``add(..., snapshots=...)``, or the whole prompt): its own
    tensors, never written later, and the logits after that token ([V] fp32)."""

    handle: int
    n_tokens: int
    state: list
    logits: torch.Tensor


@dataclass
class StepOutput:
    """The sequences that got logits in one ``BatchDecoder.step``: ``handles[i]``'s logits are
    ``logits[i]`` ([n, V] fp32). Iterating gives (handle, logits row) pairs. ``snapshots``: the
    prompt states reached in this step (see ``Snapshot``)."""

    handles: list
    logits: torch.Tensor
    snapshots: list = field(default_factory=list)

    def __iter__(self):
        return iter(zip(self.handles, self.logits))

    def __len__(self) -> int:
        return len(self.handles)


@dataclass
class _Pending:
    """A sequence whose prompt is still being prefilled: the ids left, its state so far, how many
    prompt tokens are done and the positions where the caller wants a Snapshot."""

    ids: torch.Tensor
    state: list = field(default_factory=list)
    done: int = 0
    marks: list = field(default_factory=list)


def _model_parts(model):
    rt = getattr(model, "_rt", None)
    if rt is None:
        raise TypeError(f"expected an rwkv.model.RWKV model, got {type(model).__name__}")
    return rt


def _ids(model, tokens, where: str) -> torch.Tensor:
    """tokens as a validated [T] int64 CPU tensor, errors naming ``where``."""
    try:
        return model._token_ids(tokens)
    except TokenError as e:
        raise TokenError(f"{where}: {str(e).removeprefix('RWKV.forward: ')}") from None


def _start_state(rt, state, where: str) -> list:
    """A sequence's start: zero_state() (with any state-tuned start) for None, else the caller's
    state, validated (its tensors are only read)."""
    if state is None:
        return rt.zero_state()
    try:
        return list(rt.validate_state(state))  # other layouts come back as contiguous copies
    except StateError as e:
        raise StateError(f"{where}: {str(e).removeprefix('RWKV.forward: ')}") from None


def _unstack(batch: list, b: int) -> list:
    """Sequence b's state from a stacked batch: new tensors in upstream's layout."""
    return [t[b].clone() for t in batch]


def forward_batch(model, tokens, states=None, full_output: bool = False):
    """``forward`` for B sequences at once. ``tokens``: a list of B token lists (ragged lengths
    allowed, at least one id each); ``states``: None or a list of B entries, each None (a fresh
    start, or the state-tuned start where one is loaded) or a state from this model.

    Returns ``(logits, new_states)``: logits [B, V] fp32 of each sequence's last token (with
    ``full_output``, a list of B tensors [T_i, V]) and B new states in upstream's layout. The
    results equal B separate ``forward`` calls (up to the rounding of products computed for
    several rows at once); the caller's states and lists are never written.

    Every sequence's tokens but its last run in sequence mode on its own (prefill); then the last
    tokens of all B run as one batched step that reads each weight once."""
    rt = _model_parts(model)
    if not isinstance(tokens, (list, tuple)) or not tokens:
        raise TokenError("forward_batch: tokens must be a non-empty list of token lists, got "
                         f"{type(tokens).__name__ if not isinstance(tokens, (list, tuple)) else 'an empty list'}")
    B = len(tokens)
    if states is None:
        states = [None] * B
    if not isinstance(states, (list, tuple)) or len(states) != B:
        raise StateError(f"forward_batch: states must be None or a list of {B} states (one per sequence), got "
                         f"{len(states) if isinstance(states, (list, tuple)) else type(states).__name__}")
    ids = [_ids(model, t, f"forward_batch: tokens[{b}]") for b, t in enumerate(tokens)]
    starts = [_start_state(rt, s, f"forward_batch: states[{b}]") for b, s in enumerate(states)]
    with torch.no_grad():
        if full_output:
            logits, new_states = [], []
            for seq, st in zip(ids, starts):
                out, st = rt.forward(seq, st, True)
                logits.append(out if out.dim() == 2 else out.unsqueeze(0))
                new_states.append(st)
            return logits, new_states
        prefixed = [rt.forward(seq[:-1], st, False)[1] if seq.numel() > 1 else st
                    for seq, st in zip(ids, starts)]
        batch = [torch.stack(entries) for entries in zip(*prefixed)]
        logits = rt.step_rows(torch.stack([seq[-1] for seq in ids]), batch)
        return logits, [_unstack(batch, b) for b in range(B)]


class BatchDecoder:
    """Up to ``max_batch`` sequences decoded together, their states in preallocated slots.

    - ``add(tokens=None, state=None) -> handle``: a new sequence starting from ``state`` (None: a
      fresh or the state-tuned start), its prompt ``tokens`` prefilled over the next steps, at most
      ``prefill_chunk`` prompt tokens per step across all new sequences. Without tokens it is
      ready at once (feed it its first token).
    - ``step(feed) -> StepOutput``: ``feed`` maps handles of ready sequences to their next token
      id; each of them advances one token, together (one [B, C] activation); then up to
      ``prefill_chunk`` prompt tokens are prefilled. The output holds the logits of the fed
      sequences and of those whose prompt finished in this step.
    - ``export(handle)``: the sequence's state in upstream's layout (new tensors);
      ``remove(handle)`` frees its slot.

    Not thread-safe: one thread drives it (a server runs it in its engine loop). Every call
    checks its arguments before changing anything: a bad call raises a ValueError-family error
    and leaves every sequence as it was.
    """

    def __init__(self, model, max_batch: int, *, prefill_chunk: int = 256):
        self._rt = _model_parts(model)
        self._model = model
        for name, v in (("max_batch", max_batch), ("prefill_chunk", prefill_chunk)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"BatchDecoder: {name} must be an int >= 1, got {v!r}")
        self.max_batch, self.prefill_chunk = max_batch, prefill_chunk
        with torch.no_grad():
            self._slots = self._rt.zero_batch(max_batch)
        self._order: list = []  # handles of the ready sequences, in slot order
        self._where: dict = {}  # handle -> its slot (its index in _order)
        self._views: dict = {}  # n -> (the first n rows of every slot tensor, as step_rows takes them)
        self._pending: dict = {}  # handle -> _Pending, in arrival order
        self._next = 0

    # ------------------------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Sequences held (ready and prefilling)."""
        return len(self._order) + len(self._pending)

    @property
    def ready(self) -> list:
        """Handles of the sequences that can be fed a token, in slot order."""
        return list(self._order)

    @property
    def prefilling(self) -> list:
        """Handles of the sequences whose prompt is still being prefilled."""
        return list(self._pending)

    @property
    def free(self) -> int:
        """Sequences that can still be added."""
        return self.max_batch - len(self)

    def pending_tokens(self, handle=None) -> int:
        """Prompt tokens left to prefill (of one sequence, or of all)."""
        if handle is not None:
            p = self._pending.get(handle)
            return 0 if p is None else int(p.ids.numel())
        return sum(int(p.ids.numel()) for p in self._pending.values())

    def __contains__(self, handle) -> bool:
        return handle in self._pending or handle in self._order

    # ------------------------------------------------------------------------------ changes
    def add(self, tokens=None, state=None, *, snapshots=()) -> int:
        """A new sequence; returns its handle. See the class docstring. ``snapshots``: positions
        0 < k < len(tokens) after which the step that reaches them reports the state (a
        ``Snapshot`` in ``StepOutput.snapshots``; the whole prompt's is always reported): what a
        prefix cache stores, at no copy (prefill states are never written later)."""
        if self.free <= 0:
            raise EngineFullError(f"BatchDecoder.add: all {self.max_batch} slots are taken; remove a "
                                  "sequence first")
        ids = None if tokens is None else _ids(self._model, tokens, "BatchDecoder.add: tokens")
        start = _start_state(self._rt, state, "BatchDecoder.add: state")
        marks = sorted({int(k) for k in snapshots})
        n = 0 if ids is None else int(ids.numel())
        if marks and not 0 < marks[0] <= marks[-1] < n:
            raise ValueError(f"BatchDecoder.add: snapshot positions must lie in 1..{n - 1} (inside the "
                             f"prompt), got {marks}")
        handle, self._next = self._next, self._next + 1
        if ids is None:
            self._place(handle, start)
        else:
            self._pending[handle] = _Pending(ids, start, 0, marks + [n])
        return handle

    def remove(self, handle) -> None:
        """Forget a sequence and free its slot (the last ready sequence moves into it)."""
        if self._pending.pop(handle, None) is not None:
            return
        i = self._slot(handle, "remove")
        last = len(self._order) - 1
        if i != last:
            with torch.no_grad():
                for t in self._slots:
                    t[i].copy_(t[last])
            self._order[i] = self._order[last]
            self._where[self._order[i]] = i
        self._order.pop()
        del self._where[handle]

    def export(self, handle) -> list:
        """The sequence's current state in upstream's layout (new tensors, usable with
        ``model.forward`` or ``add(state=...)``)."""
        p = self._pending.get(handle)
        if p is not None:
            return [t.clone() for t in p.state]
        return _unstack(self._slots, self._slot(handle, "export"))

    def step(self, feed: Mapping | None = None) -> StepOutput:
        """Advance every fed sequence one token and prefill; see the class docstring."""
        feed = {} if feed is None else feed
        if not isinstance(feed, Mapping):
            raise TypeError(f"BatchDecoder.step: feed must be a mapping of handle -> token id, got "
                            f"{type(feed).__name__}")
        rows = sorted((self._slot(h, "step"), self._token(h, t)) for h, t in feed.items())
        handles, logits, snaps = [], [], []
        with torch.no_grad():
            if rows:
                handles += [self._order[i] for i, _ in rows]
                logits.append(self._decode(rows))
            for h, out in self._prefill(snaps):
                handles.append(h)
                logits.append(out.reshape(1, -1))
        if len(logits) == 1:
            out = logits[0]  # a new tensor of this step's (no copy)
        else:
            out = torch.cat(logits) if logits else torch.empty(0, self._rt.info.vocab_size)
        return StepOutput(handles, out, snaps)

    # ------------------------------------------------------------------------------ internals
    def _slot(self, handle, what: str) -> int:
        try:
            return self._where[handle]
        except (KeyError, TypeError):  # TypeError: an unhashable handle
            why = "is still prefilling its prompt" if handle in self._pending else "is not held"
            raise UnknownSequenceError(f"BatchDecoder.{what}: sequence {handle!r} {why}") from None

    def _token(self, handle, token) -> int:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TokenError(f"BatchDecoder.step: the token fed to sequence {handle!r} must be an int, "
                             f"got {token!r}")
        token = int(token)
        try:
            self._model._check_id_range(token, token)
        except TokenError as e:
            raise TokenError(f"BatchDecoder.step: sequence {handle!r}: "
                             f"{str(e).removeprefix('RWKV.forward: ')}") from None
        return token

    def _place(self, handle, state: list) -> None:
        """Put a ready sequence's state into the next slot."""
        i = len(self._order)
        with torch.no_grad():
            for t, s in zip(self._slots, state):
                t[i].copy_(s)
        self._order.append(handle)
        self._where[handle] = i

    def _decode(self, rows: list) -> torch.Tensor:
        """One token for the sequences in ``rows`` ((slot, token) pairs in slot order)."""
        idx = [i for i, _ in rows]
        tokens = torch.tensor([t for _, t in rows], dtype=torch.long)
        n = len(idx)
        if idx == list(range(n)):  # the usual case: every ready sequence is fed
            views = self._views.get(n)
            if views is None:  # the slots never move: their first n rows are kept as views
                rows_n = [t[:n] for t in self._slots]
                views = self._views[n] = (rows_n, self._rt.flat_rows(rows_n))
            return self._rt.step_rows(tokens, views[0], flat=views[1])
        # A subset: gathered into a batch of their own and written back.
        where = torch.tensor(idx, dtype=torch.long)
        batch = [t.index_select(0, where.to(t.device)) for t in self._slots]
        out = self._rt.step_rows(tokens, batch)
        for t, b in zip(self._slots, batch):
            t.index_copy_(0, where.to(t.device), b)
        return out

    def _prefill(self, snaps: list) -> list:
        """Up to prefill_chunk prompt tokens of the prefilling sequences, oldest first, a chunk
        ending at each snapshot position (appended to ``snaps``). Returns (handle, last logits)
        of each whose prompt is done (it then takes a slot)."""
        budget, done = self.prefill_chunk, []
        for handle in list(self._pending):
            p = self._pending[handle]
            while budget > 0 and p.marks:
                n = min(budget, p.marks[0] - p.done)
                chunk, p.ids = p.ids[:n], p.ids[n:]
                budget -= n
                logits, p.state = self._rt.forward(chunk, p.state, False)
                p.done += n
                if p.done == p.marks[0]:
                    p.marks.pop(0)
                    snaps.append(Snapshot(handle, p.done, p.state, logits))
            if not p.marks:
                del self._pending[handle]
                self._place(handle, p.state)
                done.append((handle, logits))
            if budget <= 0:
                break
        return done
