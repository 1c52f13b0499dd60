"""Upstream's int8 weight format (reference-behaviour section 7), bit for bit.

A matrix W of shape (n, m) = (in, out) becomes uint8 Q plus four side tensors so that
``W ~= (Q + 0.5) * ry * rx + my + mx`` with ``rx, ry`` already divided by 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Int8Weight:
    """A quantized matrix. ``q`` is (in, out) uint8, keeping the source's strides (column-major for
    checkpoint matrices); ``mx, rx`` are (out,), ``my, ry`` are (in, 1), all in the activation dtype."""

    q: torch.Tensor
    mx: torch.Tensor
    rx: torch.Tensor
    my: torch.Tensor
    ry: torch.Tensor

    def to(self, device) -> "Int8Weight":
        return Int8Weight(*(t.to(device) for t in (self.q, self.mx, self.rx, self.my, self.ry)))

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """The full matrix, evaluated as upstream's torch path does (left to right in ``dtype``)."""
        return (((self.q.to(dtype) + 0.5) * self.ry.to(dtype)) * self.rx.to(dtype)
                + self.my.to(dtype) + self.mx.to(dtype))

    @property
    def shape(self):
        return self.q.shape


def quantize_int8(w: torch.Tensor, atype: torch.dtype) -> tuple[Int8Weight, tuple[str, ...]]:
    """Quantize an (in, out) matrix like upstream does at load time (in fp32 on CPU).

    Returns the weight and the order in which upstream inserts the side tensors into its weight dict
    (``_my, _mx, _rx, _ry`` when in > out, else ``_mx, _my, _rx, _ry``), needed to write converted
    files with upstream's key order.
    """
    w = w.float()
    n, m = w.shape
    if n > m:
        my = torch.amin(w, dim=1).unsqueeze(1)
        w = w - my
        mx = torch.amin(w, dim=0)
        w = w - mx
        order = ("_my", "_mx", "_rx", "_ry")
    else:
        mx = torch.amin(w, dim=0)
        w = w - mx
        my = torch.amin(w, dim=1).unsqueeze(1)
        w = w - my
        order = ("_mx", "_my", "_rx", "_ry")
    rx = torch.amax(w, dim=0)
    w = w / rx
    ry = torch.amax(w, dim=1).unsqueeze(1)
    w = w / ry
    q = torch.clip(torch.floor(w * 256), min=0, max=255).to(dtype=torch.uint8)
    side = [t.to(dtype=atype).contiguous() for t in (mx, rx / 16, my, ry / 16)]
    return Int8Weight(q, *side), order


# Row slabs for CPU decode. The one-token int8 kernel reads each column of q [N, M] (N contiguous
# bytes) against all N values of the activation, kept as int16. Past about 4096 rows that activation
# (8 KiB) no longer stays in the 32 KiB L1 cache beside the streaming weights, and the kernel slows
# down: on the Zen 4 development machine, one thread, 2048x8192 streams 24 GB/s, 8192x2048 13-18
# and 16384x1024 9-11 (benchmarks/RESULTS.md). Reading the columns in other orders (pairs, row
# blocks of several columns) is slower still there, because the hardware prefetcher follows one
# sequential stream best. So CPU int8 matrices with more rows are stored as row slabs, one after
# another, each a column-major [K, M] matrix with K <= SLAB_ROWS: a slab is a plain int8 matrix for
# every op, and since the int8 product is linear in the rows, y = sum over slabs of each slab's
# product (with that slab's rows of my and ry, and all of mx and rx).
SLAB_ROWS = 4096


def slab_count(n: int) -> int:
    """How many equal slabs of at most SLAB_ROWS rows (a multiple of 64) an n-row matrix is split
    into; 1 when it is short enough or no such split exists."""
    if n <= SLAB_ROWS:
        return 1
    for s in range(-(-n // SLAB_ROWS), n // 64 + 1):
        if n % s == 0 and (n // s) % 64 == 0:
            return s
    return 1


def split_rows(q: torch.Tensor, slabs: int) -> torch.Tensor:
    """q [N, M] as a [slabs, N/slabs, M] tensor whose slab i holds rows i*K..(i+1)*K-1 of q as a
    column-major [K, M] matrix, the slabs one after another in memory (strides (K*M, 1, K))."""
    n, m = q.shape
    k = n // slabs
    out = torch.empty(slabs, m, k, dtype=q.dtype, device=q.device)
    out.copy_(q.t().reshape(m, slabs, k).transpose(0, 1))
    return out.transpose(1, 2)
