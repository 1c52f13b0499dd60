"""``PIPELINE`` and ``PIPELINE_ARGS``: drop-in for upstream ``rwkv.utils`` (0.8.32).

Same signatures, defaults and results as upstream (see docs/pipeline.md). This module never imports
``rwkv.model``: users set environment variables between ``import rwkv.utils`` and
``from rwkv.model import RWKV``.

Deliberate deviations from upstream:

* The World vocabulary (``'rwkv_vocab_v20230424'``) is loaded without touching ``sys.path`` (upstream
  prepends the package directory on every construction, which can shadow the user's own ``model.py``
  or ``utils.py``); ``type(pipeline.tokenizer).__module__`` is ``rwkv.rwkv_tokenizer``.
* A ``WORD_NAME`` that is neither a known name nor an existing file raises ``FileNotFoundError``
  listing what is accepted; an unreadable tokenizer file raises ``ValueError``; ``cl100k_base``
  without tiktoken raises ``ImportError`` saying how to install it.
* ``generate`` with a prompt that encodes to no tokens raises ``ValueError`` (upstream:
  ``UnboundLocalError``); ``sample_logits`` raises ``ValueError`` for logits that are not 1-D, do
  not match the model's vocabulary size, contain NaN or leave nothing to sample.

Extras, all keyword-only so upstream calls are unchanged: ``sample_logits(..., generator=)``,
``decode(..., strict=True)``, ``generate(..., stop=, generator=, cache=, return_state=)`` and
``generate_stream(...)`` (see ``rwkv.generation``).
"""

import operator
import os

import numpy as np

from .generation import GenerationStream
from .rwkv_tokenizer import WORLD_VOCAB_FILE, TRIE_TOKENIZER
from .sampling import sample_logits as _sample_logits

__all__ = ["PIPELINE", "PIPELINE_ARGS"]

WORLD_VOCAB_NAME = "rwkv_vocab_v20230424"
TIKTOKEN_NAME = "cl100k_base"


class PIPELINE_ARGS:
    """Sampling and penalty settings for ``PIPELINE.generate`` (upstream's class, same defaults).

    temperature: 0 is greedy; top_p: keep the smallest set of most likely tokens whose probability
    reaches top_p; top_k: also keep at most this many (0: off); alpha_frequency, alpha_presence:
    penalties subtracted from the logits of tokens already generated (per occurrence, and once);
    alpha_decay: multiplies every penalty count once per step; token_ban: ids never sampled;
    token_stop: ids that end generation (not emitted); chunk_len: the prompt is fed in chunks of
    this many tokens.

    >>> PIPELINE_ARGS(temperature=0.8, top_p=0.7, token_ban=[0])
    PIPELINE_ARGS(temperature=0.8, top_p=0.7, top_k=0, alpha_frequency=0.2, alpha_presence=0.2, alpha_decay=0.996, token_ban=[0], token_stop=[], chunk_len=256)
    """

    # The list defaults are shared between instances, exactly as upstream's are.
    def __init__(self, temperature=1.0, top_p=0.85, top_k=0, alpha_frequency=0.2, alpha_presence=0.2,
                 alpha_decay=0.996, token_ban=[], token_stop=[], chunk_len=256):  # noqa: B006
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.alpha_frequency = alpha_frequency  # frequency penalty (as in GPT-3)
        self.alpha_presence = alpha_presence    # presence penalty (as in GPT-3)
        self.alpha_decay = alpha_decay          # multiplies every penalty count once per step
        self.token_ban = token_ban              # logits of these ids are set to -inf
        self.token_stop = token_stop            # sampling one of these ids ends generation
        self.chunk_len = chunk_len              # the prompt is fed in chunks of this many tokens

    def __repr__(self):
        return "PIPELINE_ARGS(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items()) + ")"


def _load_tokenizer(word_name):
    if word_name == TIKTOKEN_NAME:
        try:
            import tiktoken
        except ImportError:
            raise ImportError("PIPELINE(model, 'cl100k_base') needs the tiktoken package: "
                              "pip install tiktoken") from None
        return tiktoken.get_encoding(word_name)
    if word_name == WORLD_VOCAB_NAME:
        return TRIE_TOKENIZER(WORLD_VOCAB_FILE)
    path = os.fspath(word_name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"PIPELINE: unknown tokenizer {word_name!r}: not a file (relative paths resolve against "
            f"the current directory {os.getcwd()!r}). Accepted: {WORLD_VOCAB_NAME!r} (the World "
            f"vocabulary shipped with rwkv), {TIKTOKEN_NAME!r} (needs tiktoken), or the path of a "
            "HuggingFace tokenizers JSON file such as 20B_tokenizer.json, or of a World-format .txt "
            "vocabulary")
    if path.endswith(".txt"):
        return TRIE_TOKENIZER(path)
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception for unreadable JSON
        raise ValueError(f"PIPELINE: {path!r} is not a valid tokenizers JSON file: {e}") from e


class PIPELINE:
    """A model with its tokenizer: encode, decode, sample and generate (upstream's class).

    ``PIPELINE(model, WORD_NAME)``: model is an ``RWKV`` (or anything with upstream's ``forward``);
    WORD_NAME is ``"rwkv_vocab_v20230424"`` (the World vocabulary), ``"cl100k_base"`` (tiktoken), a
    World-format ``.txt`` vocabulary or a HuggingFace ``tokenizers`` JSON file (e.g. the
    ``tokenizer.json`` beside the shipped model). Unknown names raise ``FileNotFoundError`` listing
    what is accepted.

    >>> pipeline = PIPELINE(model, "models/rwkv7-tiny/tokenizer.json")       # doctest: +SKIP
    >>> pipeline.generate("Once upon a time", token_count=20)                 # doctest: +SKIP
    """

    def __init__(self, model, WORD_NAME):
        self.model = model
        self.tokenizer = _load_tokenizer(WORD_NAME)

    def refine_context(self, context):
        """Upstream's prompt cleanup: strip each line, drop empty lines, start with a newline."""
        lines = (line.strip().strip("\u3000").strip("\r") for line in context.strip().split("\n"))
        context = "\n" + "\n".join(line for line in lines if line != "").strip()
        return context

    def _is_hf(self):
        return "Tokenizer" in str(type(self.tokenizer))  # upstream's dispatch rule

    def encode(self, x):
        """Text -> list of token ids."""
        if not isinstance(x, str):
            raise TypeError(f"PIPELINE.encode: expected a str, got {type(x).__name__}")
        if self._is_hf():
            x.encode("utf-8")  # a lone surrogate: UnicodeEncodeError (a ValueError), as the World tokenizer
            return self.tokenizer.encode(x).ids
        return self.tokenizer.encode(x)

    def decode(self, x, *, strict=False):
        """Token ids -> text. ``strict=True``: ``ValueError`` for ids outside the vocabulary (and,
        for the World tokenizer, for invalid UTF-8) instead of upstream's lenient result. A Hugging
        Face tokenizer always gets checked ids (it would raise OverflowError or TypeError, or skip
        an id silently)."""
        if strict and hasattr(self.tokenizer, "decode_strict"):
            return self.tokenizer.decode_strict(x)
        if strict or self._is_hf():
            x = self._checked_ids(x)
        return self.tokenizer.decode(x)

    def _checked_ids(self, x) -> list:
        size = self.vocab_size_of_tokenizer()
        if isinstance(x, (str, bytes, dict, set)) or not hasattr(x, "__iter__"):
            raise TypeError(f"token ids must be a list of ints, got {type(x).__name__}")
        x = list(x)
        for pos, i in enumerate(x):
            try:
                ok = not isinstance(i, (bool, np.bool_)) and 0 <= operator.index(i) < size
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(f"token id {i!r} at position {pos} is outside the vocabulary "
                                 f"(valid ids: 0..{size - 1})")
        return [operator.index(i) for i in x]

    def vocab_size_of_tokenizer(self):
        """How many ids the tokenizer can produce (its largest id + 1)."""
        tok = self.tokenizer
        if hasattr(tok, "idx2token"):
            return max(tok.idx2token) + 1
        if hasattr(tok, "get_vocab_size"):
            return tok.get_vocab_size()
        return tok.n_vocab

    def model_vocab_size(self):
        """The model's vocabulary size (logits length) when the model tells it, else None."""
        args = getattr(self.model, "args", None)
        size = getattr(args, "vocab_size", None)
        if size is None:
            weights = getattr(self.model, "w", None) or getattr(self.model, "z", None)
            emb = weights.get("emb.weight") if isinstance(weights, dict) else None
            size = emb.shape[0] if emb is not None else None
        return int(size) if size is not None else None

    def sample_logits(self, logits, temperature=1.0, top_p=0.85, top_k=0, *, generator=None):
        """One token id drawn from ``logits`` (1-D, the model's vocabulary size) by upstream's rule,
        so the same ``np.random.seed`` draws the same token. ``generator``: an int seed, a numpy
        ``RandomState``/``Generator`` or a ``torch.Generator`` instead of the global RNG. Raises
        ``ValueError`` for logits of the wrong shape, with NaN, or leaving nothing to sample."""
        return _sample_logits(logits, temperature, top_p, top_k, generator=generator,
                              vocab_size=self.model_vocab_size())

    def generate(self, ctx, token_count=100, args=PIPELINE_ARGS(), callback=None, state=None, *,  # noqa: B008
                 stop=None, generator=None, cache=None, return_state=False):
        """Continue ``ctx`` (text, or a list of token ids) by up to ``token_count`` tokens and return
        the text, as upstream does: ``args`` (``PIPELINE_ARGS``) sets sampling, penalties, bans and
        stop tokens; ``callback(piece)`` receives each piece of text as it is released; ``state``
        continues from a state instead of from scratch.

        Keyword-only additions: ``stop=["\\n\\n", ...]`` stop strings (never emitted);
        ``generator=`` a seed or RNG (see ``sample_logits``); ``cache=PrefixCache()`` reuses the
        state of the longest cached prefix of the prompt and stores the new ones;
        ``return_state=True`` returns ``(text, state)``, where the state covers the prompt and
        every generated token. A prompt that encodes to no tokens raises ``ValueError``."""
        args = args if args is not None else PIPELINE_ARGS()
        stream = GenerationStream(self, ctx, token_count, args, callback, state, stop=stop,
                                  generator=generator, cache=cache, complete_state=return_state)
        result = stream.run()
        return (result.text, result.state) if return_state else result.text

    def generate_stream(self, ctx, token_count=100, args=None, callback=None, state=None, *, stop=None,
                        generator=None, cache=None):
        """``generate`` as an iterator of text pieces, each yielded as soon as it is valid UTF-8
        (and cannot be the start of a stop string). Once exhausted, ``.result`` is a
        ``GenerationResult``: text, tokens, the state and logits after the prompt and the tokens,
        the stop reason, and the prompt's token counts (cached and fed).

        >>> stream = pipeline.generate_stream("Hello", token_count=20, generator=0)  # doctest: +SKIP
        >>> text = "".join(stream); stream.result.stop_reason                       # doctest: +SKIP
        'length'
        """
        return GenerationStream(self, ctx, token_count, args if args is not None else PIPELINE_ARGS(),
                                callback, state, stop=stop, generator=generator, cache=cache)
