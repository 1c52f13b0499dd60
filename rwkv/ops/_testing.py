"""Test hooks: force the CPU kernels' instruction set or read order inside a ``with`` block."""

from __future__ import annotations

import contextlib
from typing import Iterator, List

from . import _backend

ISAS = ("scalar", "avx2", "avx512", "avx512vnni", "avx512bf16")
READ_ORDERS = ("sequential", "streams")


@contextlib.contextmanager
def force_cpu_isa(isa: str) -> Iterator[str]:
    """Runs the block with the CPU kernels forced to ``isa`` (one of ``ISAS``), bypassing
    the ``RWKV_CPU_ISA`` cap; restores the previous choice afterwards. Process-wide: not for use
    while other threads run CPU kernels. Raises RuntimeError when this CPU cannot run ``isa``."""
    if isa not in ISAS:
        raise ValueError(f"force_cpu_isa: isa must be one of {', '.join(ISAS)}, got {isa!r}")
    previous = _backend.set_cpu_isa(isa)
    try:
        yield isa
    finally:
        _backend.set_cpu_isa(previous)


def supported_cpu_isas() -> List[str]:
    """Every ISA this CPU (and OS) runs, lowest first; empty without compiled CPU kernels."""
    if _backend.cpu_isa() == "none":
        return []
    found = []
    for isa in ISAS:
        try:
            with force_cpu_isa(isa):
                found.append(isa)
        except RuntimeError:
            pass
    return found


@contextlib.contextmanager
def force_cpu_read_order(order: str) -> Iterator[str]:
    """Runs the block with mm8_one_i16 reading the matrix in ``order`` (sequential, streams);
    restores the previous choice afterwards. Process-wide, like force_cpu_isa."""
    if order not in READ_ORDERS:
        raise ValueError(f"force_cpu_read_order: order must be one of {', '.join(READ_ORDERS)}, "
                         f"got {order!r}")
    previous = _backend.set_cpu_read_order(order)
    try:
        yield order
    finally:
        _backend.set_cpu_read_order(previous)
