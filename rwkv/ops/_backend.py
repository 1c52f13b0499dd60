"""Loading ``rwkv._C`` and choosing, per op and device, the compiled kernel or the reference.

``rwkv._C`` is imported once, on first use, and never compiled here. A load failure is kept and
reported (``backend_report()``, fallback warnings), never swallowed.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from typing import Callable, Optional

import torch

from .. import settings
from . import _schemas, reference

MODES = ("auto", "compiled", "reference")

# Ops whose kernel on that device type is the reference by design (docs/kernels.md): no warning.
_REFERENCE_BY_DESIGN = {("gemm_fp16", "cpu"), ("mm8_one_i16", "cuda"), ("mm8_rows_i16", "cuda"), ("wkv4_block", "cuda"),
                        ("wkv6_block", "cuda"),
                        ("maa_mix", "cuda"), ("maa_mix_split", "cuda"), ("maa_lora_one", "cuda"),
                        ("ln_mix_split", "cuda"),
                        ("linear_one_group", "cuda"), ("linear_rows", "cuda"),
                        ("ln_mix_rows", "cuda"), ("maa_mix_rows", "cuda"),
                        ("pooled_empty_like", "cuda")}

_lock = threading.Lock()
_loaded = False
_module = None
_load_error: Optional[str] = None
_version_warning: Optional[str] = None
_resolved: dict = {}
_warned: set = set()


def _load() -> None:
    """Imports rwkv._C once (its static initialisers register the kernels)."""
    global _loaded, _module, _load_error, _version_warning
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        try:
            _module = importlib.import_module("rwkv._C")
        except ImportError as e:
            if getattr(e, "name", None) == "rwkv._C":
                _load_error = ("rwkv._C is not built (pure-Python install or RWKV_BUILD_EXT=0); "
                               "build it with `python setup.py build_ext --inplace`")
            else:
                _load_error = f"rwkv._C failed to load: {type(e).__name__}: {e}"
        except Exception as e:  # a broken binary must not take the reference path down with it
            _load_error = f"rwkv._C failed to load: {type(e).__name__}: {e}"
        if _module is not None:
            # The ops' own Autograd kernel (csrc/inference_only.cpp), registered once.
            torch.ops.rwkv._inference_only(list(_schemas.OPS))
            _version_warning = _check_build_info()
            if _version_warning:
                warnings.warn(_version_warning, RuntimeWarning, stacklevel=3)
            _apply_cpu_settings()
        _loaded = True


def _apply_cpu_settings() -> None:
    """Hands the CPU kernels the RWKV_CPU_ISA cap and the RWKV_CPU_READ_ORDER choice (the C++ side
    reads no environment), as forced choices: a cap below the detected ISA forces the cap, a cap at
    or above it changes nothing."""
    if not has_kernel("_set_cpu_isa", "CompositeExplicitAutograd"):
        return
    cap = settings.value("RWKV_CPU_ISA")
    if cap is not None:
        isas = settings.setting("RWKV_CPU_ISA").choices
        detected = isas[int(torch.ops.rwkv._cpu_isa_tables()) - 1]
        if isas.index(cap) < isas.index(detected):
            torch.ops.rwkv._set_cpu_isa(cap)
    order = settings.value("RWKV_CPU_READ_ORDER")
    if order is not None:
        torch.ops.rwkv._set_cpu_read_order(order)


def _check_build_info() -> Optional[str]:
    try:
        from rwkv._build_info import BUILD_INFO
    except ImportError:
        return None
    built = BUILD_INFO.get("torch")
    if built and built != torch.__version__:
        return (f"rwkv._C was built against torch {built} but torch {torch.__version__} is "
                "installed; rebuild it if kernels misbehave")
    return None


def has_kernel(name: str, dispatch_key: str) -> bool:
    """Whether rwkv::<name> has a kernel registered for ``dispatch_key`` (private torch API,
    used only here)."""
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"rwkv::{name}", dispatch_key))
    except RuntimeError:
        return False


def _dispatch_key(device_type: str) -> str:
    return {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU", "meta": "Meta"}.get(
        device_type, device_type.upper())


def _why_missing(name: str, device_type: str) -> str:
    if _load_error is not None:
        return _load_error
    if device_type == "cuda" and not any(has_kernel(op, "CUDA") for op in _schemas.OPS):
        return ("rwkv._C was built without CUDA kernels (rebuild with RWKV_BUILD_CUDA=1 against "
                "a CUDA build of torch)")
    if (name, device_type) in _REFERENCE_BY_DESIGN:
        return f"{name} has no {device_type} kernel by design (its reference is the CPU path)"
    return f"rwkv._C has no {name} kernel for device type '{device_type}'"


def resolve(name: str, device_type, mode: str = "auto") -> Callable:
    """Returns the implementation of op ``name`` for ``device_type`` ("cpu", "cuda", ...).

    ``device_type`` may also be a ``torch.device``. mode "auto": the compiled kernel when one is registered, else the reference (warning once
    per op, device and reason); "compiled": the kernel or a RuntimeError saying why there is
    none; "reference": the pure-torch reference. The result has the op's signature."""
    if isinstance(device_type, torch.device):
        device_type = device_type.type
    key = (name, device_type, mode)
    fn = _resolved.get(key)
    if fn is not None:
        return fn
    if name not in _schemas.OPS:
        raise ValueError(f"resolve: name must be one of {', '.join(_schemas.OPS)}, got {name!r}")
    if mode not in MODES:
        raise ValueError(f"resolve: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(device_type, str):
        raise TypeError(f"resolve: device_type must be a str such as 'cpu', got {device_type!r}")
    if mode == "reference":
        fn = getattr(reference, name)
    else:
        _load()
        if has_kernel(name, _dispatch_key(device_type)):
            fn = getattr(torch.ops.rwkv, name).default
        else:
            reason = _why_missing(name, device_type)
            if mode == "compiled":
                raise RuntimeError(f"rwkv.ops: no compiled {name} kernel for device type "
                                   f"'{device_type}': {reason}; pass mode='reference' (or "
                                   "'auto') to use the pure-torch reference")
            if (name, device_type) not in _REFERENCE_BY_DESIGN and \
                    (name, device_type, reason) not in _warned:
                _warned.add((name, device_type, reason))
                warnings.warn(f"rwkv.ops: using the slow pure-torch reference for {name} on "
                              f"'{device_type}': {reason}", RuntimeWarning, stacklevel=2)
            fn = getattr(reference, name)
    _resolved[key] = fn
    return fn


def cpu_isa() -> str:
    """The instruction set the CPU kernels use now (scalar, avx2, avx512, avx512vnni,
    avx512bf16), or "none" without compiled CPU kernels.
    ``RWKV_CPU_ISA=scalar|avx2|avx512|avx512vnni|avx512bf16`` caps the automatic choice."""
    _load()
    if not has_kernel("_cpu_isa", "CompositeExplicitAutograd"):
        return "none"
    return torch.ops.rwkv._cpu_isa()


def pooled_kept() -> list:
    """Bytes the CPU ops' block pool keeps for reuse: [in blocks up to 1 MiB (a decoded token's
    results), in larger blocks (a prompt's)]; [0, 0] without compiled CPU kernels."""
    _load()
    if not has_kernel("_pooled_kept", "CompositeExplicitAutograd"):
        return [0, 0]
    return list(torch.ops.rwkv._pooled_kept())


def set_cpu_isa(isa: str) -> str:
    """Forces the CPU kernels' instruction set ("" = automatic); returns the previous one.
    Raises RuntimeError when this CPU cannot run ``isa`` or when no CPU kernels are compiled."""
    _load()
    if not has_kernel("_set_cpu_isa", "CompositeExplicitAutograd"):
        raise RuntimeError(f"rwkv.ops: cannot force the CPU ISA: {_load_error or 'no CPU kernels'}")
    return torch.ops.rwkv._set_cpu_isa(isa)


def cpu_read_order() -> str:
    """How one-token products (``mm8_one_i16``, ``linear_one``) read the matrix on CPU:
    "sequential" (column after column) or "streams" (4 streams over the quarters of a call's
    columns, sharing each load of x, with a software prefetch); "none" without compiled CPU kernels.
    Automatic by CPU (sequential on AMD CPUs with AVX-512, i.e. Zen 4; streams elsewhere);
    ``RWKV_CPU_READ_ORDER=sequential|streams`` overrides it ("pairs" is accepted as another name
    of streams)."""
    _load()
    if not has_kernel("_cpu_read_order", "CompositeExplicitAutograd"):
        return "none"
    return torch.ops.rwkv._cpu_read_order()


def set_cpu_read_order(order: str) -> str:
    """Forces the one-token read order ("" = automatic); returns the previously forced one."""
    _load()
    if not has_kernel("_set_cpu_read_order", "CompositeExplicitAutograd"):
        raise RuntimeError(f"rwkv.ops: cannot force the read order: {_load_error or 'no CPU kernels'}")
    return torch.ops.rwkv._set_cpu_read_order(order)


def backend_report() -> str:
    """What was loaded and why not. The first line is a one-line summary."""
    _load()
    lines = []
    if _load_error is not None:
        lines.append(f"reference only: {_load_error}")
    else:
        devices = [d for d in ("cpu", "cuda") if any(has_kernel(op, _dispatch_key(d))
                                                     for op in _schemas.OPS)]
        summary = ", ".join(f"{d}: {cpu_isa()}, {cpu_read_order()} reads" if d == "cpu" else d
                            for d in devices)
        lines.append(f"compiled ({summary or 'no kernels registered'})")
        lines.append(f"  module: {getattr(_module, '__file__', '?')}")
        if _version_warning:
            lines.append(f"  warning: {_version_warning}")
    for op in _schemas.OPS:
        per_device = []
        for d in ("cpu", "cuda"):
            if has_kernel(op, _dispatch_key(d)):
                per_device.append(f"{d}=compiled")
            elif (op, d) in _REFERENCE_BY_DESIGN:
                per_device.append(f"{d}=reference (by design)")
            else:
                per_device.append(f"{d}=reference")
        lines.append(f"  {op}: {', '.join(per_device)}")
    return "\n".join(lines)
