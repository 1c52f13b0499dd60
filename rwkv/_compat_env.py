"""The settings ``RWKV(...)`` reads from the environment when it is built (never at import).

Our kernels are compiled ahead of time and the version is detected from the checkpoint, so
``RWKV_JIT_ON``, ``RWKV_CUDA_ON`` and ``RWKV_V7_ON`` change nothing (old scripts set them and must
keep working); nor does ``RWKV_DE_VERSION``: DeepEmbed checkpoints are detected from their keys
(rwkv/deep_embed.py). ``RWKV_RESCALE_LAYER`` keeps its upstream meaning. ``RWKV_KERNELS`` forces
a kernel path (auto, compiled, reference); the ``kernels=`` keyword wins over it. Every variable
is registered and parsed in ``rwkv.settings``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import settings

KERNEL_MODES = settings.setting("RWKV_KERNELS").choices


@dataclass(frozen=True)
class CompatEnv:
    jit_on: bool
    cuda_on: bool
    v7_on: bool
    rescale_layer: int | None  # None: use the strategy-dependent default
    kernels: str
    exact_int8: bool


def read_env() -> CompatEnv:
    """The environment's settings now (unparsable values warn and give the defaults)."""
    return CompatEnv(jit_on=settings.raw("RWKV_JIT_ON") != "0",
                     cuda_on=settings.raw("RWKV_CUDA_ON") == "1",
                     v7_on=settings.raw("RWKV_V7_ON") == "1",
                     rescale_layer=settings.value("RWKV_RESCALE_LAYER"),
                     kernels=settings.value("RWKV_KERNELS"),
                     exact_int8=settings.value("RWKV_EXACT_INT8"))


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
