"""Token sampling with upstream 0.8.32's exact rules (``PIPELINE.sample_logits``), plus validation and
an optional explicit random generator.

Upstream's rule, reproduced step by step so that the same numpy seed picks the same token:

1. ``temperature == 0`` means greedy: temperature 1 and ``top_p = 0`` (``top_k`` still applies).
2. ``probs = softmax(logits.float())``.
3. CPU (and DirectML ``privateuseone``) tensors: numpy float32. The cutoff is the probability of the
   first entry, in descending order, whose cumulative sum reaches ``top_p``; when none does (the
   float32 sum of a large vocabulary ends just below 1.0, so ``top_p = 1.0`` usually lands here), the
   first entry's, i.e. greedy. Entries below the cutoff are zeroed (ties kept); ``0 < top_k < V`` keeps
   the ``top_k`` last entries of ``np.argsort``; then ``probs ** (1 / temperature)`` (temperature acts
   on the truncated probabilities), normalise, ``np.random.choice`` on the global numpy RNG.
   Without ``top_k`` the cutoff is looked for among the few largest probabilities first
   (``np.partition``), else by sorting the values alone, not their order: the same value
   (``_nucleus_cutoff``); the draw runs over the kept entries only (``_legacy_choice``).
4. Other devices: the same in torch, drawn with ``torch.multinomial`` (the device's torch RNG).

Extras (keyword-only): ``generator`` — ``None`` (upstream: global RNG), an ``int`` seed (a fresh
``np.random.RandomState(seed)`` on CPU, so it equals ``np.random.seed(seed)`` + upstream; a
``torch.Generator`` seeded with it on other devices), a ``np.random.RandomState``/``Generator`` or a
``torch.Generator``; ``vocab_size`` — when given, logits must have exactly that many entries.
Errors are ``ValueError``: logits not 1-D, wrong size, NaN, nothing finite; a temperature that is
negative, NaN or infinite, a top_p outside [0, 1] (or NaN), a top_k that is negative or fractional.
Arguments that are not numbers are a ``TypeError``.
"""

import math
import operator

import numpy as np
import torch

__all__ = ["sample_logits", "resolve_generator", "check_logits", "check_sampling_args", "check_token_ban"]

_NUMPY_DEVICES = ("cpu", "privateuseone")


def check_logits(logits, vocab_size=None):
    """Validate a logits vector; returns it as a torch tensor (numpy arrays are accepted too)."""
    if isinstance(logits, np.ndarray):
        logits = torch.from_numpy(logits)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 1:
        raise ValueError(f"logits must be a 1-D tensor of vocabulary size, got shape {tuple(logits.shape)}"
                         " (for full_output=True results pick one row, e.g. out[-1])")
    if vocab_size is not None and logits.shape[0] != vocab_size:
        raise ValueError(f"logits have {logits.shape[0]} entries but the vocabulary has {vocab_size}")
    if logits.is_floating_point() and bool(torch.isnan(logits).any()):
        raise ValueError("logits contain NaN (the model output is broken, e.g. fp16 overflow)")
    if logits.shape[0] == 0:
        raise ValueError("logits are empty")
    return logits


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_, str, bytes)):  # float("1") would parse a string
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}") from None


def check_sampling_args(temperature, top_p, top_k) -> tuple[float, float, int]:
    """``(temperature, top_p, top_k)`` as float, float, int, or ValueError naming the argument:
    temperature must be finite and >= 0 (0 means greedy), top_p in [0, 1], top_k a whole number >= 0
    (0 means no top-k cut; 5.0 is taken as 5, 5.5 is refused)."""
    t, p, k = _real("temperature", temperature), _real("top_p", top_p), _real("top_k", top_k)
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if not 0 <= p <= 1:  # NaN fails too
        raise ValueError(f"top_p must be between 0 and 1 (the probability mass kept), got {top_p!r}")
    if not (math.isfinite(k) and k >= 0 and k == int(k)):
        raise ValueError(f"top_k must be a whole number >= 0 (0 means no top-k cut), got {top_k!r}")
    return t, p, int(k)


def check_token_ban(token_ban, vocab_size: int) -> list:
    """The banned ids as ints, each in [-vocab_size, vocab_size) (negative ids count from the end, as
    indexing does); ValueError naming the first bad one."""
    try:
        ids = list(token_ban)
    except TypeError:
        raise TypeError(f"token_ban must be a list of token ids, got {type(token_ban).__name__}") from None
    out = []
    for pos, n in enumerate(ids):
        try:
            i = operator.index(n)
        except TypeError:
            raise ValueError(f"token_ban[{pos}] must be an int token id, got {n!r}") from None
        if not -vocab_size <= i < vocab_size:
            raise ValueError(f"token_ban[{pos}] = {i} is outside the vocabulary (valid ids are "
                             f"0..{vocab_size - 1})")
        out.append(i)
    return out


def resolve_generator(generator, device):
    """Turn an int seed into a generator suited to ``device``; pass other generators through."""
    if generator is None or isinstance(generator, (np.random.RandomState, np.random.Generator,
                                                   torch.Generator)):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        device = torch.device(device)
        if device.type in _NUMPY_DEVICES:
            return np.random.RandomState(int(generator) % 2**32)
        return torch.Generator(device=device).manual_seed(int(generator))
    raise TypeError("generator must be None, an int seed, a numpy RandomState/Generator or a "
                    f"torch.Generator, got {type(generator).__name__}")


def sample_logits(logits, temperature=1.0, top_p=0.85, top_k=0, *, generator=None, vocab_size=None):
    """Sample one token id from ``logits`` (see the module docstring for the exact rule)."""
    logits = check_logits(logits, vocab_size)
    temperature, top_p, top_k = check_sampling_args(temperature, top_p, top_k)
    if temperature == 0:
        temperature, top_p = 1.0, 0
    probs = torch.softmax(logits.float(), dim=-1)
    generator = resolve_generator(generator, probs.device)
    if probs.device.type in _NUMPY_DEVICES:
        return _sample_numpy(probs.cpu().numpy(), temperature, top_p, top_k, generator)
    return _sample_torch(probs, temperature, top_p, top_k, generator)


def _truncate_numpy(probs, temperature, top_p, top_k):
    """Upstream's CPU rule on a float32 numpy vector (modified in place): cut, top_k, temperature."""
    if not 0 < top_k < len(probs):  # no top_k: only the cutoff's value is needed, not the order
        probs[probs < _nucleus_cutoff(probs, top_p)] = 0
        return _with_temperature(probs, temperature)
    order = np.argsort(probs)
    descending = probs[order][::-1]
    return _cut(probs, order, descending, np.cumsum(descending), temperature, top_p, top_k)


def _nucleus_cutoff(probs, top_p):
    """The cutoff's value under upstream's rule: among the largest entries when they reach top_p,
    else from all of them sorted (values only: np.sort is several times faster than np.argsort)."""
    cutoff = _cutoff_among_largest(probs, top_p)
    if cutoff is None:
        descending = np.sort(probs)[::-1]
        cutoff = _cutoff(descending, np.cumsum(descending), top_p)
    return cutoff


def _cutoff(descending, cumulative, top_p):
    """The first entry whose cumulative sum reaches top_p; none does -> index 0 -> greedy."""
    return float(descending[int(np.argmax(cumulative >= top_p))])


def _cutoff_among_largest(probs, top_p, first=64):
    """The cutoff of upstream's rule found among the k largest probabilities (k = 64, 512, ...
    up to an eighth of the vocabulary), or None when no prefix of them reaches top_p. Their
    descending order and float32 running sums are the full sort's first k, value for value (a
    running sum adds in order), so the cutoff is the same value. A partition of 64 of 65536
    entries costs a fraction of a full sort."""
    n = len(probs)
    largest = float(probs.max())
    if not largest > 0:  # NaN or nothing: the full sort's rule
        return None
    need = top_p / largest  # each entry is at most the largest: at least this many entries
    if not need < n:  # NaN, inf, or more than there are: the full sort's rule (greedy)
        return None
    k = max(first, int(need))
    while k * 8 <= n:
        descending = np.sort(np.partition(probs, n - k)[n - k:])[::-1]
        cumulative = np.cumsum(descending)
        reached = cumulative >= top_p
        if reached.any():
            return float(descending[int(np.argmax(reached))])
        # The entries left are each at most the smallest of these: at least this many more.
        smallest = float(descending[-1])
        if smallest <= 0:
            return None
        k = max(8 * k, k + int((top_p - float(cumulative[-1])) / smallest))
    return None


def _truncate_torch(probs, temperature, top_p, top_k):
    """Upstream's non-CPU rule, in torch on the tensor's device (modified in place)."""
    order = torch.argsort(probs)
    descending = torch.flip(probs[order], dims=(0,))
    cumulative = torch.cumsum(descending, dim=-1).cpu().numpy()
    return _cut(probs, order, descending, cumulative, temperature, top_p, top_k)


def _cut(probs, order, descending, cumulative, temperature, top_p, top_k):
    probs[probs < _cutoff(descending, cumulative, top_p)] = 0
    if 0 < top_k < len(probs):
        probs[order[:-top_k]] = 0
    return _with_temperature(probs, temperature)


def _with_temperature(probs, temperature):
    return probs ** (1.0 / temperature) if temperature != 1.0 else probs


def _check_total(total, temperature):
    if not np.isfinite(total) or total <= 0:
        raise ValueError("no token has a usable probability (all logits -inf, or the temperature is "
                         f"so small that the kept probabilities underflow: temperature={temperature})")


def _sample_numpy(probs, temperature, top_p, top_k, generator):
    probs = _truncate_numpy(probs, temperature, top_p, top_k)
    total = np.sum(probs)
    _check_total(total, temperature)
    probs = probs / total
    if generator is None:
        return _legacy_choice(probs, np.random.random_sample)
    if isinstance(generator, np.random.RandomState):
        return _legacy_choice(probs, generator.random_sample)
    if isinstance(generator, np.random.Generator):
        return int(generator.choice(len(probs), p=probs))
    return _draw_from_cdf(np.cumsum(probs, dtype=np.float64), generator)


def _legacy_choice(probs, random_sample):
    """``RandomState.choice(len(probs), p=probs)`` (numpy's legacy rule: the float64 running sum of
    p, divided by its last value, searched for one ``random_sample()`` draw, side='right') on the
    nonzero entries only: adding a zero leaves a running sum as it was, and the first sum above
    the draw is always at a nonzero entry, so the token and the RNG's draws are the same. After
    the nucleus cut most of a 65536-entry vocabulary is zero, and choice's sums and checks over all
    of it would dominate a token's sampling."""
    # A wide nucleus: all of it, as choice does (gathering the kept entries would cost more).
    kept = None if np.count_nonzero(probs) * 4 > len(probs) else np.flatnonzero(probs)
    cdf = np.cumsum(probs if kept is None else probs[kept], dtype=np.float64)
    cdf /= cdf[-1]
    i = int(np.searchsorted(cdf, random_sample(), side="right"))
    return i if kept is None else int(kept[i])


def _sample_torch(probs, temperature, top_p, top_k, generator):
    probs = _truncate_torch(probs, temperature, top_p, top_k)
    _check_total(float(probs.sum()), temperature)
    if generator is None or isinstance(generator, torch.Generator):
        return int(torch.multinomial(probs, num_samples=1, generator=generator)[0])
    cdf = np.cumsum(probs.double().cpu().numpy())
    return _draw_from_cdf(cdf, generator)


def _draw_from_cdf(cdf, generator):
    """One uniform draw from ``generator`` mapped through a (not yet normalised) float64 CDF."""
    if isinstance(generator, torch.Generator):
        u = float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))
    else:
        u = float(generator.random())
    cdf = cdf / cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))
