"""The RWKV "World" tokenizer: greedy longest match over a byte trie.

Drop-in for upstream ``rwkv.rwkv_tokenizer`` (0.8.32): same names (``TRIE``, ``TRIE_TOKENIZER``), same
attributes (``idx2token``, ``token2idx``, ``root``) and methods (``encodeBytes``, ``decodeBytes``,
``encode``, ``decode``, ``printTokens``) with identical results. Differences, all deliberate:

* The vocabulary file is parsed with ``ast.literal_eval`` (never ``eval``) and every line is checked;
  a malformed line raises ``ValueError`` naming the file and line number.
* ``encodeBytes``/``decodeBytes`` use the C++ extension ``rwkv._tokenizer`` when it is built
  (identical output, much faster); the pure-Python code below is the reference it is tested against.
  Pass ``native=False`` to force the Python path, ``native=True`` to require the extension.
* ``root`` (the Python trie) is built lazily, on first access, when the extension serves encoding.
* ``decode`` keeps upstream's "return one U+FFFD on any failure" rule for compatibility;
  ``decode_strict`` raises ``ValueError`` naming the unknown id or the invalid byte position.
* A vocabulary that has no token for some byte raises ``ValueError`` on such input (upstream dies with
  ``UnboundLocalError``); the shipped vocabulary has every single byte, so this never happens there.
"""

import ast
import os

__all__ = ["TRIE", "TRIE_TOKENIZER", "load_vocab", "WORLD_VOCAB_FILE"]

WORLD_VOCAB_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rwkv_vocab_v20230424.txt")

_NATIVE_MAX_ID = 1 << 24  # the C++ decoder keeps a dense table of this many ids at most
_MAX_LINE = 1 << 16  # no real token line is anywhere near this; bounds literal_eval's work


def _native_module():
    try:
        from . import _tokenizer
    except ImportError:
        return None
    return _tokenizer


def load_vocab(file_name):
    """Parse a World-format vocabulary file into a list of ``(id, token_bytes)`` in file order.

    Line format: ``<id> <python str or bytes literal> <byte length>``. Blank lines are skipped;
    LF and CRLF line endings are both accepted (upstream's own copy is CRLF).
    """
    entries = []
    with open(file_name, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            entries.append(_parse_line(line, file_name, lineno))
    return entries


def _parse_line(line, file_name, lineno):
    def bad(why):
        shown = line if len(line) <= 80 else line[:77] + "..."
        return ValueError(f"{file_name}:{lineno}: malformed vocabulary line ({why}): {shown!r}")

    if len(line) > _MAX_LINE:
        raise bad(f"longer than {_MAX_LINE} characters")
    first, last = line.find(" "), line.rfind(" ")
    if first <= 0 or last == first:
        raise bad("expected '<id> <literal> <length>'")
    id_text, literal, len_text = line[:first], line[first + 1:last].strip(), line[last + 1:]
    if not id_text.isdigit() or not id_text.isascii():
        raise bad("the id is not a non-negative integer")
    if not len_text.isdigit() or not len_text.isascii():
        raise bad("the length field is not a non-negative integer")
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise bad(f"the token is not a Python literal: {type(e).__name__}") from None
    if isinstance(value, str):
        try:
            value = value.encode("utf-8")
        except UnicodeEncodeError:
            raise bad("the token string is not encodable as UTF-8") from None
    elif not isinstance(value, bytes):
        raise bad(f"the token is a {type(value).__name__}, expected str or bytes")
    if len(value) != int(len_text):
        raise bad(f"the token has {len(value)} bytes but the length field says {int(len_text)}")
    return int(id_text), value


class TRIE:
    """A byte trie node (upstream-compatible). ``to`` has 256 slots; ``values`` holds what was added."""

    __slots__ = ("ch", "to", "values", "front")

    def __init__(self, front=None, ch=None):
        self.ch = ch
        self.to = [None] * 256
        self.values = set()
        self.front = front

    def __repr__(self):
        path, node = [], self
        while node is not None:
            if node.ch is not None:
                path.append(node.ch)
            node = node.front
        return f"<TRIE {path[::-1]} {self.values}>"

    def add(self, key: bytes, idx: int = 0, val=None):
        """Insert ``key[idx:]`` below this node, store ``val`` (default: ``key``) at its end node."""
        node = self
        for ch in key[idx:]:
            nxt = node.to[ch]
            if nxt is None:
                nxt = node.to[ch] = TRIE(front=node, ch=ch)
            node = nxt
        node.values.add(key if val is None else val)
        return node

    def find_longest(self, key: bytes, idx: int = 0):
        """Longest stored key starting at ``key[idx]``: returns ``(end_index, node, node.values)``."""
        node, found, n, start = self, None, len(key), idx
        while idx < n:
            node = node.to[key[idx]]
            if node is None:
                break
            idx += 1
            if node.values:
                found = (idx, node, node.values)
        if found is None:
            raise ValueError(f"no vocabulary token matches the bytes at position {start}")
        return found


class TRIE_TOKENIZER:
    """World tokenizer built from a vocabulary file (see ``load_vocab``)."""

    def __init__(self, file_name, *, native=None):
        self.idx2token = {}
        for idx, token in load_vocab(file_name):
            self.idx2token[idx] = token
        self.token2idx = {token: idx for idx, token in self.idx2token.items()}
        self._root = None
        self._native = None
        if native is not False:
            mod = _native_module()
            if mod is None:
                if native:
                    raise ImportError("TRIE_TOKENIZER(native=True): the C++ extension rwkv._tokenizer "
                                      "is not built (run: python setup.py build_ext --inplace)")
            elif self.idx2token and max(self.idx2token) >= _NATIVE_MAX_ID:
                if native:
                    raise ValueError(f"TRIE_TOKENIZER(native=True): ids must be below {_NATIVE_MAX_ID}")
            else:
                self._native = mod.Tokenizer(list(self.token2idx.items()), list(self.idx2token.items()))

    # -- the Python trie (upstream attribute); built on first use when the extension encodes ----------
    @property
    def root(self):
        """The Python byte trie (upstream's ``TRIE``), built on first access."""
        if self._root is None:
            root = TRIE()
            for token, idx in self.token2idx.items():
                root.add(token, val=(token, idx))
            self._root = root
        return self._root

    @root.setter
    def root(self, value):
        self._root = value

    @property
    def native(self):
        """True when encodeBytes/decodeBytes run in the C++ extension."""
        return self._native is not None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_native"] = state["_native"] is not None
        state["_root"] = None
        return state

    def __setstate__(self, state):
        use_native = state.pop("_native")
        self.__dict__.update(state, _native=None)
        mod = _native_module() if use_native else None
        if mod is not None:
            self._native = mod.Tokenizer(list(self.token2idx.items()), list(self.idx2token.items()))

    # -- the upstream API -------------------------------------------------------------------------------
    def encodeBytes(self, src: bytes):
        """UTF-8 bytes -> token ids (greedy longest match)."""
        if isinstance(src, memoryview):
            # Its bytes, whatever its item format or shape (as bytes(src) and the C++ path read it),
            # not its items: an int32 view's items are not bytes.
            src = src.tobytes()
        if self._native is not None and isinstance(src, (bytes, bytearray)):
            return self._native.encode(src)
        return self._encode_bytes_py(src)

    def decodeBytes(self, tokens):
        """Token ids -> bytes; ``KeyError`` for an unknown id, as upstream."""
        if isinstance(tokens, memoryview):
            if tokens.ndim != 1:
                raise TypeError(f"decodeBytes: a memoryview of ids must be 1-D, got {tokens.ndim}-D")
            tokens = tokens.tolist()
        if self._native is not None:
            if not isinstance(tokens, (list, tuple)):
                tokens = list(tokens)
            out = self._native.decode(tokens)
            if out is not None:  # None: an element is not a Python int; the dict lookup decides
                return out
        return self._decode_bytes_py(tokens)

    def encode(self, src):
        """Text -> token ids."""
        return self.encodeBytes(src.encode("utf-8"))

    def decode(self, tokens):
        """Token ids -> text; a single U+FFFD for unknown ids or invalid UTF-8, as upstream
        (``decode_strict`` raises instead)."""
        try:
            return self.decodeBytes(tokens).decode("utf-8")
        except Exception:  # upstream compatibility: any failure (unknown id, bad UTF-8) -> one U+FFFD
            return "\ufffd"

    def decode_strict(self, tokens):
        """Like ``decode`` but raises ``ValueError`` for an unknown id or invalid UTF-8."""
        if not isinstance(tokens, (list, tuple)):
            tokens = list(tokens)
        for pos, i in enumerate(tokens):
            if not _is_known(self.idx2token, i):
                raise ValueError(f"token id {i!r} at position {pos} is not in the vocabulary "
                                 f"(known ids: {min(self.idx2token)}..{max(self.idx2token)}, "
                                 f"{len(self.idx2token)} tokens)")
        data = self.decodeBytes(tokens)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"tokens do not decode to valid UTF-8: {e.reason} at byte {e.start} "
                             f"of {len(data)}") from None

    def printTokens(self, tokens):
        """Print each token's text (or bytes) with its id, as upstream."""
        parts = []
        for i in tokens:
            s = self.idx2token[i]
            try:
                s = s.decode("utf-8")
            except UnicodeDecodeError:
                pass
            parts.append(f"{s!r}{i}")
        print(" ".join(parts), end=" \n" if parts else "\n")

    # -- pure-Python reference implementations -----------------------------------------------------------
    def _encode_bytes_py(self, src):
        tokens, idx, n, root = [], 0, len(src), self.root
        while idx < n:
            idx, _, values = root.find_longest(src, idx)
            tokens.append(next(iter(values))[1])
        return tokens

    def _decode_bytes_py(self, tokens):
        idx2token = self.idx2token
        return b"".join([idx2token[i] for i in tokens])


def _is_known(idx2token, i):
    try:
        return i in idx2token
    except TypeError:  # unhashable element
        return False
