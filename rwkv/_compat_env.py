"""Upstream's environment variables, read when ``RWKV(...)`` is built (never at import).

Our kernels are compiled ahead of time and the version is detected from the checkpoint, so
``RWKV_JIT_ON``, ``RWKV_CUDA_ON`` and ``RWKV_V7_ON`` change nothing (old scripts set them and must
keep working); nor does ``RWKV_DE_VERSION`` (never read): DeepEmbed checkpoints are detected from
their keys (rwkv/deep_embed.py). ``RWKV_RESCALE_LAYER`` keeps its upstream meaning.
``RWKV_KERNELS`` forces a kernel path (auto, compiled, reference); the ``kernels=`` keyword wins
over it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

KERNEL_MODES = ("auto", "compiled", "reference")


@dataclass(frozen=True)
class CompatEnv:
    jit_on: bool
    cuda_on: bool
    v7_on: bool
    rescale_layer: int | None  # None: use the strategy-dependent default
    kernels: str
    exact_int8: bool


def read_env() -> CompatEnv:
    rescale = os.environ.get("RWKV_RESCALE_LAYER")
    try:
        rescale_val = int(rescale) if rescale is not None else None
    except ValueError:  # upstream silently falls back to the default for unparsable values
        warnings.warn(f"RWKV_RESCALE_LAYER={rescale!r} is not an integer; using the default",
                      RuntimeWarning, stacklevel=3)
        rescale_val = None
    kernels = os.environ.get("RWKV_KERNELS", "auto").strip().lower() or "auto"
    if kernels not in KERNEL_MODES:
        warnings.warn(f"RWKV_KERNELS={kernels!r} is not one of {', '.join(KERNEL_MODES)}; using 'auto'",
                      RuntimeWarning, stacklevel=3)
        kernels = "auto"
    return CompatEnv(jit_on=os.environ.get("RWKV_JIT_ON") != "0",
                     cuda_on=os.environ.get("RWKV_CUDA_ON") == "1",
                     v7_on=os.environ.get("RWKV_V7_ON") == "1",
                     rescale_layer=rescale_val, kernels=kernels,
                     exact_int8=os.environ.get("RWKV_EXACT_INT8") == "1")


def resolve_rescale(env: CompatEnv, strategy_string: str, version: float, override: int | None) -> int:
    """Upstream: RWKV_RESCALE_LAYER if set, else 6 when 'fp16' appears anywhere in the strategy,
    else 0. RWKV-7 never rescales."""
    if version == 7:
        return 0
    if override is not None:
        return int(override)
    if env.rescale_layer is not None:
        return env.rescale_layer
    return 6 if "fp16" in strategy_string else 0


def resolve_kernels(env: CompatEnv, override: str | None) -> str:
    if override is None:
        return env.kernels
    if override not in KERNEL_MODES:
        raise ValueError(f"RWKV: kernels must be one of {', '.join(repr(m) for m in KERNEL_MODES)}, "
                         f"got {override!r}")
    return override
