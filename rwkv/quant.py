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
