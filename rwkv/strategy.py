"""Strategy strings: parse, validate, normalize and allocate layers like ``rwkv`` 0.8.32.

A strategy string says where each layer of a model lives and in which precision::

    cpu fp32                          every layer on the CPU in float32
    cuda fp16 *10 -> cpu fp32         10 layers on the GPU in float16, the rest on the CPU
    cuda fp16i8 *0+ -> cpu fp32 *1    stream all blocks to the GPU as int8, head on the CPU

Grammar (one segment per ``->``; spaces around ``->`` are optional)::

    strategy := segment ( "->" segment )*
    segment  := device " " dtype [ " *" N [ "+" ] ]
    device   := cpu | cuda | cuda:N | mps
    dtype    := ( fp32 | fp16 | bf16 ) [ i8 ]

Everything here is pure Python: no torch import until :attr:`LayerPlacement.atype` (or ``wtype``)
is read, and no device calls at all.

Compatibility decisions (pinned by ``tests/test_strategy.py``):

* Every string upstream accepts *and implements* is accepted, and ``Strategy.normalized`` is
  byte-identical to upstream's ``model.args.strategy_string`` (including a single trailing newline,
  which upstream's regex tolerates and its normalization strips).
* Upstream accepts but never implemented ``i4``/``i3`` (silently ignored) and ``dml`` (needs
  ``torch_directml``); these raise :class:`StrategyError`, as do a leading ``->`` (upstream:
  ``IndexError``) and allocations on which upstream divides by zero (``cpu fp32 *0 -> cpu bf16``).
* :func:`plan_layers` reproduces upstream's allocation exactly, quirks included.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from typing import Optional

__all__ = [
    "StrategyError",
    "Segment",
    "Strategy",
    "LayerPlacement",
    "parse_strategy",
    "plan_layers",
]

DEVICES_HELP = "cpu, cuda, cuda:N or mps"
DTYPES_HELP = "fp32, fp16 or bf16 (optionally followed by i8)"
SEGMENT_HELP = "a segment is '<device> <dtype>' optionally followed by ' *N' or ' *N+'"
EXAMPLES_HELP = "e.g. 'cpu fp32' or 'cuda fp16 *10 -> cpu fp32'"

_TORCH_DTYPE_NAME = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_DTYPE_RE = re.compile(r"(fp32|fp16|bf16)(i8)?")
_UNSUPPORTED_QUANT_RE = re.compile(r"(fp32|fp16|bf16)(i4|i3)")
_CUDA_RE = re.compile(r"cuda(?::[0-9]+)?")
# Upstream's regex uses Python's Unicode-aware \d and converts with int(), so we do the same.
_COUNT_RE = re.compile(r"\*(\d+)(\+?)")

_DTYPE_ALIASES = {
    "f32": "fp32",
    "float": "fp32",
    "float32": "fp32",
    "single": "fp32",
    "f16": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "bfloat16": "bf16",
    "b16": "bf16",
    "bfp16": "bf16",
}
_SEPARATOR_LIKE = {"-", ">", "=>", "-->", "->>", "<-", "|", ",", ";", "/"}
_DEVICE_ALIASES = {"gpu": "cuda", "cuda0": "cuda:0", "cuda1": "cuda:1"}


class StrategyError(ValueError):
    """A strategy string that is malformed or asks for something this package does not support.

    The message names the segment (1-based index and text), the bad token and the allowed values,
    and ends with the strategy string and a caret line under the bad token.  The same facts are
    available as attributes: ``strategy``, ``segment_index`` (1-based, or None), ``segment_text``,
    ``token`` and ``position`` (offset of the token in ``strategy``, or None).
    """

    def __init__(
        self,
        message: str,
        *,
        strategy: str = "",
        segment_index: Optional[int] = None,
        segment_text: Optional[str] = None,
        token: Optional[str] = None,
        position: Optional[int] = None,
        width: Optional[int] = None,
    ):
        self.reason = message
        self.strategy = strategy
        self.segment_index = segment_index
        self.segment_text = segment_text
        self.token = token
        self.position = position
        full = message
        if position is not None:
            shown = "".join(c if c.isprintable() else "\u00b7" for c in strategy)
            if width is None:
                width = len(token) if token else 1
            full += f"\n    {shown}\n    {' ' * position}{'^' * max(1, width)}"
        super().__init__(full)


@functools.lru_cache(maxsize=None)
def _torch_dtype(name: str):
    import torch  # deferred: importing this module must stay cheap

    return getattr(torch, _TORCH_DTYPE_NAME[name])


class _DtypeProps:
    """Shared ``atype``/``wtype`` properties for classes with ``dtype`` and ``quant`` fields."""

    __slots__ = ()

    @property
    def atype(self):
        """Activation dtype as a ``torch.dtype`` (torch is imported on first use)."""
        return _torch_dtype(self.dtype)

    @property
    def wtype(self):
        """Weight dtype: ``torch.uint8`` for int8 layers, otherwise :attr:`atype`."""
        if self.quant == "i8":
            import torch

            return torch.uint8
        return self.atype

    @property
    def dtype_spec(self) -> str:
        """The dtype token as written in a strategy string: ``fp16`` or ``fp16i8``."""
        return self.dtype + (self.quant or "")


@dataclasses.dataclass(frozen=True)
class Segment(_DtypeProps):
    """One ``->``-separated part of a strategy string.

    >>> parse_strategy("cuda:1 fp16i8 *10+").segments[0]
    Segment(device='cuda:1', dtype='fp16', quant='i8', count=10, stream=True, text='cuda:1 fp16i8 *10+')
    """

    device: str
    dtype: str  # 'fp32' | 'fp16' | 'bf16'
    quant: Optional[str]  # 'i8' or None
    count: Optional[int]  # N of '*N' / '*N+'; None for a free segment
    stream: bool  # written with '*N+'
    text: str  # the segment as it appears in the normalized string


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A parsed strategy string.

    ``normalized`` equals upstream's ``model.args.strategy_string``:

    >>> parse_strategy("  cuda fp16 *10->cpu fp32  ").normalized
    'cuda fp16 *10 -> cpu fp32'
    """

    segments: tuple
    normalized: str

    def __str__(self) -> str:
        return self.normalized

    def plan(self, n_layer: int) -> list:
        """Shorthand for ``plan_layers(self, n_layer)``."""
        return plan_layers(self, n_layer)


@dataclasses.dataclass(frozen=True)
class LayerPlacement(_DtypeProps):
    """Where one slot lives. Slots ``0..n_layer-1`` are the blocks, slot ``n_layer`` is the head.

    >>> p = plan_layers(parse_strategy("cpu fp32i8"), 1)[0]
    >>> p
    LayerPlacement(device='cpu', dtype='fp32', quant='i8', stream=False)
    >>> p.atype, p.wtype
    (torch.float32, torch.uint8)
    """

    device: str
    dtype: str
    quant: Optional[str]
    stream: bool


# ------------------------------------------------------------------------------------------ parse


def _quote_segment(index: int, text: str) -> str:
    return f"segment {index} '{text}'"


class _Parser:
    """Parses one strategy string; every error carries the position of the bad token."""

    def __init__(self, text: str):
        self.text = text

    def fail(self, message, *, index=None, seg_text=None, token=None, pos=None, width=None):
        raise StrategyError(
            message,
            strategy=self.text,
            segment_index=index,
            segment_text=seg_text,
            token=token,
            position=pos,
            width=width,
        )

    def parse(self) -> Strategy:
        text = self.text
        # Upstream validates with re.match(... $), and '$' also matches before one final newline.
        body = text[:-1] if text.endswith("\n") else text
        if body.strip(" ") == "":
            what = "empty strategy string" if text == "" else f"blank strategy string {text!r}"
            self.fail(f"{what}; expected '<device> <dtype>' segments separated by '->', {EXAMPLES_HELP}")
        for pos, ch in enumerate(body):
            if ch != " " and (ch.isspace() or not ch.isprintable()):
                name = {"\t": "tab", "\n": "line break", "\r": "carriage return"}.get(ch, f"character {ch!r}")
                index, seg_text = self._segment_at(body, pos)
                shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in seg_text)
                self.fail(
                    f"{name} in {_quote_segment(index, shown)} at column {pos + 1}; tokens must be "
                    f"separated by single spaces ({SEGMENT_HELP}, segments joined by '->')",
                    index=index,
                    seg_text=seg_text,
                    token=ch,
                    pos=pos,
                )

        pieces = []
        start = 0
        while True:
            arrow = body.find("->", start)
            end = len(body) if arrow < 0 else arrow
            pieces.append((start, body[start:end]))
            if arrow < 0:
                break
            start = arrow + 2

        segments = []
        for index, (start, raw) in enumerate(pieces, 1):
            segments.append(self._segment(index, start, raw, len(pieces)))
        normalized = " -> ".join(s.text for s in segments)
        return Strategy(segments=tuple(segments), normalized=normalized)

    @staticmethod
    def _segment_at(body: str, pos: int):
        index = body.count("->", 0, pos) + 1
        seg = body.split("->")[index - 1]
        return index, seg.strip(" ")

    def _segment(self, index: int, start: int, raw: str, n_pieces: int) -> Segment:
        seg_text = raw.strip(" ")
        if seg_text == "":
            arrow_pos = start - 2 if index > 1 else start + len(raw)
            if index == 1:
                # Upstream's regex lets a leading '->' through (not ' ->') and then hits IndexError.
                note = "; upstream rwkv crashes on a leading '->' with IndexError" if raw == "" else ""
                self.fail(
                    f"empty segment 1 '' before the first '->': the strategy must start with a segment "
                    f"('<device> <dtype>', {EXAMPLES_HELP}){note}",
                    index=1, seg_text="", token="->", pos=arrow_pos,
                )
            if index == n_pieces:
                self.fail(
                    f"empty segment {index} '' after the last '->': remove the trailing '->' or add a "
                    f"segment after it ({EXAMPLES_HELP})",
                    index=index, seg_text="", token="->", pos=arrow_pos,
                )
            self.fail(
                f"empty segment {index} '' between two '->'; expected '<device> <dtype>' ({EXAMPLES_HELP})",
                index=index, seg_text="", token="->", pos=arrow_pos,
            )
        seg_start = start + (len(raw) - len(raw.lstrip(" ")))
        where = _quote_segment(index, seg_text)

        # Tokens with their offsets; an empty token means two spaces in a row.
        tokens = []
        offset = seg_start
        for tok in seg_text.split(" "):
            tokens.append((tok, offset))
            offset += len(tok) + 1
        for k, (tok, off) in enumerate(tokens):
            if tok == "":
                self.fail(
                    f"two spaces in a row in {where}; separate the tokens with exactly one space "
                    f"({SEGMENT_HELP})",
                    index=index, seg_text=seg_text, token="  ", pos=off - 1, width=2,
                )

        def fail_tok(message, k, width=None):
            tok, off = tokens[k]
            self.fail(message, index=index, seg_text=seg_text, token=tok, pos=off, width=width)

        device = self._device(tokens[0][0], where, lambda m: fail_tok(m, 0))
        if len(tokens) < 2:
            fail_tok(f"{where} has no dtype after the device; expected {DTYPES_HELP}, "
                     f"e.g. '{device} fp32'", 0)
        dtype, quant = self._dtype(tokens[1][0], where, lambda m: fail_tok(m, 1))

        for k in range(2, len(tokens)):
            if tokens[k][0] in _SEPARATOR_LIKE:
                fail_tok(f"unexpected token '{tokens[k][0]}' in {where}; segments are separated by '->' "
                         f"({SEGMENT_HELP})", k)
        count, stream = None, False
        if len(tokens) >= 3:
            tok = tokens[2][0]
            nxt = tokens[3][0] if len(tokens) > 3 else None
            if tok == "*" and nxt is not None and nxt.rstrip("+").isdigit():
                tok_off = tokens[2][1]
                self.fail(
                    f"space after '*' in {where}; write the layer count without spaces, e.g. '*{nxt}'",
                    index=index, seg_text=seg_text, token=tok, pos=tok_off,
                    width=len(tok) + 1 + len(nxt),
                )
            if nxt == "+" and _COUNT_RE.fullmatch(tok):
                self.fail(
                    f"space before '+' in {where}; write '{tok}+' to stream the remaining layers",
                    index=index, seg_text=seg_text, token="+", pos=tokens[3][1],
                )
            count, stream = self._count(tok, where, lambda m: fail_tok(m, 2))
        if len(tokens) > 3:
            fail_tok(f"unexpected extra token '{tokens[3][0]}' in {where}; {SEGMENT_HELP}", 3)
        return Segment(device=device, dtype=dtype, quant=quant, count=count, stream=stream, text=seg_text)

    @staticmethod
    def _device(tok: str, where: str, fail) -> str:
        if tok in ("cpu", "mps") or _CUDA_RE.fullmatch(tok):
            return tok
        low = tok.lower()
        if low == "dml" or low.startswith("dml:") or low == "directml":
            fail(f"DirectML is not supported: device '{tok}' in {where}; expected {DEVICES_HELP}")
        if low in ("cpu", "mps") or _CUDA_RE.fullmatch(low):
            fail(f"invalid device '{tok}' in {where}: device names are lowercase, use '{low}'; "
                 f"expected {DEVICES_HELP}")
        if low in _DEVICE_ALIASES:
            fail(f"invalid device '{tok}' in {where} (did you mean '{_DEVICE_ALIASES[low]}'?); "
                 f"expected {DEVICES_HELP}")
        if low.startswith("cuda"):
            fail(f"invalid CUDA device '{tok}' in {where}; expected 'cuda' or 'cuda:N' where N is a "
                 f"device index such as 0 or 1 ({DEVICES_HELP})")
        looks_like = None
        if _DTYPE_RE.fullmatch(low) or _UNSUPPORTED_QUANT_RE.fullmatch(low):
            looks_like = "a dtype"
        elif low in _DTYPE_ALIASES:
            looks_like = f"a dtype (did you mean '{_DTYPE_ALIASES[low]}'?)"
        elif _COUNT_RE.fullmatch(tok):
            looks_like = "a layer count"
        if looks_like:
            fail(f"{where} does not start with a device: '{tok}' looks like {looks_like}; expected "
                 f"{DEVICES_HELP} first, e.g. 'cuda fp16' ({SEGMENT_HELP})")
        fail(f"invalid device '{tok}' in {where}; expected {DEVICES_HELP}")
        raise AssertionError("unreachable")

    @staticmethod
    def _dtype(tok: str, where: str, fail):
        m = _DTYPE_RE.fullmatch(tok)
        if m:
            return m.group(1), m.group(2)
        expected = f"expected {DTYPES_HELP}"
        m = _UNSUPPORTED_QUANT_RE.fullmatch(tok)
        if m:
            fail(f"unsupported quantization '{m.group(2)}' in dtype '{tok}' of {where}: only i8 is "
                 f"supported, i4 and i3 are not (upstream rwkv accepts them but silently ignores them); "
                 f"use '{m.group(1)}i8' or '{m.group(1)}'")
        low = tok.lower()
        if _DTYPE_RE.fullmatch(low) or _UNSUPPORTED_QUANT_RE.fullmatch(low):
            fail(f"invalid dtype '{tok}' in {where}: dtype names are lowercase, use '{low}'; {expected}")
        base, suffix = low, ""
        for q in ("i8", "-i8", "_i8", "int8", "-int8", "_int8"):
            if low.endswith(q) and len(low) > len(q):
                base, suffix = low[: -len(q)], "i8"
                break
        if base in _DTYPE_ALIASES:
            hint = _DTYPE_ALIASES[base] + suffix
            fail(f"invalid dtype '{tok}' in {where} (did you mean '{hint}'?); {expected}")
        if suffix and base in _TORCH_DTYPE_NAME:
            fail(f"invalid dtype '{tok}' in {where} (did you mean '{base}i8'?); {expected}")
        if low in ("i8", "int8", "uint8", "i4", "i3"):
            fail(f"invalid dtype '{tok}' in {where}: the quantization is a suffix of the dtype, "
                 f"e.g. 'fp16i8'; {expected}")
        if _COUNT_RE.fullmatch(tok):
            fail(f"{where} has no dtype before the layer count '{tok}'; {expected}")
        fail(f"invalid dtype '{tok}' in {where}; {expected}")
        raise AssertionError("unreachable")

    @staticmethod
    def _count(tok: str, where: str, fail):
        m = _COUNT_RE.fullmatch(tok)
        if m:
            try:
                return int(m.group(1)), m.group(2) == "+"
            except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
                fail(f"invalid layer count in {where}: '*' followed by {len(m.group(1))} digits is too "
                     "large a number; a layer count is at most the model's number of layers")
        allowed = ("expected '*N' (put N layers here) or '*N+' (put N layers here and stream the "
                   "remaining ones), N a whole number")
        if tok in ("i8", "i4", "i3"):
            fail(f"unexpected '{tok}' in {where}: write the quantization directly after the dtype "
                 f"without a space, e.g. 'fp16{tok}'")
        if re.fullmatch(r"\d+\+?", tok):
            fail(f"invalid layer count '{tok}' in {where}: it must start with '*', e.g. '*{tok}'; {allowed}")
        if tok == "*" or tok == "*+":
            fail(f"invalid layer count '{tok}' in {where}: missing the number of layers; {allowed}")
        fail(f"invalid layer count '{tok}' in {where}; {allowed}")
        raise AssertionError("unreachable")


def parse_strategy(text) -> Strategy:
    """Parse and validate a strategy string.

    >>> s = parse_strategy("cuda fp16i8 *10+ ->cpu fp32")
    >>> s.normalized
    'cuda fp16i8 *10+ -> cpu fp32'
    >>> [(g.device, g.dtype, g.quant, g.count, g.stream) for g in s.segments]
    [('cuda', 'fp16', 'i8', 10, True), ('cpu', 'fp32', None, None, False)]
    >>> try:
    ...     parse_strategy("cpu fp32 -> cpu fp8")
    ... except StrategyError as e:
    ...     print(e)
    invalid dtype 'fp8' in segment 2 'cpu fp8'; expected fp32, fp16 or bf16 (optionally followed by i8)
        cpu fp32 -> cpu fp8
                        ^^^

    A :class:`Strategy` is returned unchanged; anything that is not a ``str`` raises ``TypeError``.
    """
    if isinstance(text, Strategy):
        return text
    if not isinstance(text, str):
        raise TypeError(f"strategy must be a str such as 'cpu fp32', got {type(text).__name__}")
    return _Parser(text).parse()


# ------------------------------------------------------------------------------------------- plan


def _segment_position(strategy: Strategy, index: int) -> int:
    """Offset of segment ``index`` (0-based) in ``strategy.normalized``."""
    return sum(len(s.text) + len(" -> ") for s in strategy.segments[:index])


def _zero_count_error(strategy: Strategy, n_layer: int) -> StrategyError:
    zero = next(i for i, s in enumerate(strategy.segments) if s.count == 0 and not s.stream)
    free = next(i for i, s in enumerate(strategy.segments) if s.count is None)
    seg = strategy.segments[zero]
    pos = _segment_position(strategy, zero) + seg.text.rindex("*")
    return StrategyError(
        f"{_quote_segment(zero + 1, seg.text)} asks for 0 layers next to "
        f"{_quote_segment(free + 1, strategy.segments[free].text)}, which has no count: upstream rwkv "
        f"treats '*0' as 'not allocated yet', so the layers left over ({n_layer}+1 slots in all) would "
        f"be split among more segments than have no count and upstream crashes with "
        f"ZeroDivisionError; remove segment {zero + 1} or give it a positive count",
        strategy=strategy.normalized,
        segment_index=zero + 1,
        segment_text=seg.text,
        token="*0",
        position=pos,
        width=len(seg.text) - seg.text.rindex("*"),
    )


def plan_layers(strategy, n_layer: int) -> list:
    """Allocate ``n_layer + 1`` slots (blocks, then the head) exactly as upstream 0.8.32 does.

    ``strategy`` is a :class:`Strategy` or a string (parsed with :func:`parse_strategy`).  Returns a
    list of ``n_layer + 1`` :class:`LayerPlacement`; slot ``n_layer`` is the output head (ln_out +
    head); the embedding is not a slot.

    Rules (upstream's, quirks included): segments with ``*N`` are walked in order and get N slots;
    once the running total reaches ``n_layer + 1`` the segment that crossed it is cut down and all
    later segments stay unused.  With no ``*N+`` segment, the free segments (no count, and also any
    explicit ``*0``) split the rest by integer division, in order, so later ones get the larger share,
    and the last segment absorbs any remainder even if it had an explicit count.  With a ``*N+``
    segment (only the last one counts) free segments get nothing and the ``+`` segment takes
    everything left, streaming exactly those extra slots (its last ones, possibly the head).

    >>> [p.dtype for p in plan_layers("cpu fp32 -> cpu bf16", 4)]
    ['fp32', 'fp32', 'bf16', 'bf16', 'bf16']
    >>> [(p.dtype, p.stream) for p in plan_layers("cpu fp32 *2+ -> cpu bf16", 3)]
    [('fp32', False), ('fp32', False), ('fp32', True), ('fp32', True)]
    >>> [p.dtype for p in plan_layers("cpu fp32 *10 -> cpu bf16 *1", 3)]
    ['fp32', 'fp32', 'fp32', 'fp32']
    """
    strategy = parse_strategy(strategy)
    if isinstance(n_layer, bool) or not hasattr(type(n_layer), "__index__"):
        raise TypeError(f"n_layer must be an int, got {type(n_layer).__name__}")
    n_layer = operator.index(n_layer)
    if n_layer < 1:
        raise ValueError(f"n_layer must be at least 1, got {n_layer}")

    segs = strategy.segments
    plan = [0] * len(segs)
    to_allocate = n_layer + 1
    allocated = 0
    free = 0
    stream_i = -1
    stream_count = 0
    for i, seg in enumerate(segs):
        if seg.count is None:
            free += 1
            continue
        plan[i] = seg.count
        if seg.stream:
            stream_i = i
        allocated += seg.count
        if allocated >= to_allocate:
            plan[i] += to_allocate - allocated
            break
    if stream_i < 0:
        if free > 0 and to_allocate > allocated:
            # Upstream revisits every segment whose plan is still 0, explicit '*0' ones included.
            for i in range(len(segs)):
                if plan[i] == 0:
                    if free == 0:
                        raise _zero_count_error(strategy, n_layer)
                    plan[i] = (to_allocate - allocated) // free
                    allocated += plan[i]
                    free -= 1
        if to_allocate > allocated:
            plan[-1] += to_allocate - allocated
    elif to_allocate > allocated:
        stream_count = to_allocate - allocated
        plan[stream_i] += stream_count

    placements = []
    end = 0
    for i, seg in enumerate(segs):
        end += plan[i]
        while len(placements) < min(end, to_allocate):
            n = len(placements)
            placements.append(
                LayerPlacement(
                    device=seg.device,
                    dtype=seg.dtype,
                    quant=seg.quant,
                    stream=(i == stream_i and n >= end - stream_count),
                )
            )
    if len(placements) != to_allocate:
        raise RuntimeError(f"internal error: {len(placements)} of {to_allocate} slots for {strategy}")
    return placements
