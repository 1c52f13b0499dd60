"""CPU weights in transparent huge pages (Linux).

Decoding one token streams every weight matrix from memory once. With 4 KiB pages that stream
crosses a page boundary every 4 KiB: the hardware prefetchers stop at each one and every page costs
a TLB miss. Linux backs anonymous memory with 2 MiB pages only where a program asks for them (THP
mode "madvise", the usual default), and torch's allocator asks only when ``THP_MEM_ALLOC_ENABLE=1``
was set before it started. So after placement the model copies its CPU weights into one anonymous
mapping advised ``MADV_HUGEPAGE``, tensor by tensor (peak memory: the model plus one tensor).
Streaming the weights, and a plain read, then run faster (benchmarks/RESULTS.md has measurements).

Where memory is fragmented (other programs, the page cache, models loaded before), some of those
faults get 4 KiB pages anyway; the model then asks the kernel to collapse the mapping into huge
pages (``MADV_COLLAPSE``, Linux 6.1+; best effort, skipped elsewhere), since the weights left in
4 KiB pages read markedly slower (a process that loads several models at once fragments memory).

``RWKV_CPU_HUGEPAGES=0`` turns this off; it is skipped where the OS has no transparent huge pages.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

from . import settings

HUGE_PAGE = 2 << 20
_MADV_COLLAPSE = 25  # linux/mman.h (Python's mmap module names it from 3.13 on)
_ALIGN = 64  # each tensor starts on its own cache line
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def available() -> bool:
    """Whether anonymous memory can be advised into transparent huge pages here (and it is wanted)."""
    if not settings.value("RWKV_CPU_HUGEPAGES") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _dense(t: torch.Tensor) -> bool:
    """Row-major, or a view with its last two dims swapped (how upstream keeps (in, out) weights,
    and how row slabs are kept, rwkv/slabs.py)."""
    return t.is_contiguous() or (t.dim() >= 2 and t.transpose(-1, -2).is_contiguous())


def _eligible(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() > 0 and _dense(t)


def collapse(address: int, length: int) -> bool:
    """Asks Linux to back [address, address + length) with huge pages now (MADV_COLLAPSE: the
    ranges already in huge pages stay; 4 KiB ones are copied into new huge pages where memory can
    be found). Best effort: False where the call is unavailable or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise(address, length, _MADV_COLLAPSE) == 0


def pack(w: dict, keys) -> int:
    """Moves the CPU tensors ``w[k]`` for ``keys`` (dense ones; others stay) into one mapping advised
    MADV_HUGEPAGE, keeping shape, strides and values. Returns the number of bytes moved (0 when
    nothing qualified or huge pages are unavailable)."""
    if not available():
        return 0
    chosen, offsets, total = [], [], 0
    for k in keys:
        t = w[k]
        if _eligible(t):
            chosen.append(k)
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    if not chosen:
        return 0
    try:
        # Private: shared anonymous memory is shmem, which has its own (usually off) THP setting.
        buf = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # e.g. the kernel refuses to overcommit that much address space at once
        return 0
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        buf.close()
        return 0
    base = torch.frombuffer(buf, dtype=torch.uint8)  # keeps buf alive as long as any view lives
    start = (-base.data_ptr()) % HUGE_PAGE  # whole huge pages from the first tensor on
    for k, off in zip(chosen, offsets):
        t = w[k]
        nbytes = t.numel() * t.element_size()
        region = base[start + off:start + off + nbytes].view(t.dtype)
        moved = region.as_strided(t.shape, t.stride())
        moved.copy_(t)
        w[k] = moved  # the old tensor is freed here unless someone else holds it
    # Whole huge pages from the first tensor to the end of the last.
    collapse(base.data_ptr() + start, -(-total // HUGE_PAGE) * HUGE_PAGE)
    return total
