"""Row slabs: how big CPU matrices are stored for fast one-token products.

A one-token product reads each column of W [N, M] (N contiguous elements: the model keeps upstream's
(in, out) matrices column-major) against all N values of the activation. The kernels keep that
activation in the 32 KiB L1 cache beside the streaming weights only while it is small: int16 for
int8 weights (``mm8_one_i16``), fp32 for bf16/fp32 weights (``linear_one``). Past about 8 KiB it
gets evicted and the products slow down, to half the rate of short columns or less. Reading the
columns in other orders (pairs, row blocks of several columns) does not recover it on CPUs whose
hardware prefetcher follows one sequential stream best.

So a CPU matrix whose activation would exceed SLAB_BYTES is stored as row slabs, one after another:
a [S, K, M] tensor (strides (K*M, 1, K)) whose slab i is the column-major [K, M] matrix
W[i*K:(i+1)*K]. A slab is a plain matrix for every op, and since a product is linear in the rows,
``x @ W = sum_i x[:, rows_i] @ W_i``; for int8 each slab takes its rows of ``my`` and ``ry`` and all
of ``mx`` and ``rx`` (rwkv/models/common.py, Projection). One-token products on CPU hand the
whole [S, K, M] tensor to the ``linear_one_slabs`` op, which sums the slabs' products itself.
"""

from __future__ import annotations

import torch

SLAB_BYTES = 8192  # activation bytes per slab (int8 weights: 4096 rows; bf16/fp32 weights: 2048)

# The kernels' activation element size by weight dtype (weights of other dtypes are not split).
_ACTIVATION_BYTES = {torch.uint8: 2, torch.bfloat16: 4, torch.float32: 4}


def slab_count(n: int, max_rows: int) -> int:
    """How many equal slabs of at most max_rows rows (a multiple of 64) an n-row matrix is split
    into; 1 when it is short enough or no such split exists."""
    if n <= max_rows:
        return 1
    for s in range(-(-n // max_rows), n // 64 + 1):
        if n % s == 0 and (n // s) % 64 == 0:
            return s
    return 1


def split_rows(w: torch.Tensor, slabs: int) -> torch.Tensor:
    """w [N, M] as a [slabs, N/slabs, M] tensor whose slab i holds rows i*K..(i+1)*K-1 of w as a
    column-major [K, M] matrix, the slabs one after another in memory (strides (K*M, 1, K))."""
    n, m = w.shape
    k = n // slabs
    out = torch.empty(slabs, m, k, dtype=w.dtype, device=w.device)
    out.copy_(w.t().reshape(m, slabs, k).transpose(0, 1))
    return out.transpose(1, 2)


def for_decode(w: torch.Tensor) -> torch.Tensor:
    """A CPU matrix as row slabs when its one-token activation would not stay in L1 (see above);
    otherwise w itself. Only 2-D column-major matrices of int8, bf16 or fp32 are considered."""
    size = _ACTIVATION_BYTES.get(w.dtype)
    if size is None or w.dim() != 2 or not w.t().is_contiguous():
        return w
    slabs = slab_count(w.shape[0], SLAB_BYTES // size)
    return split_rows(w, slabs) if slabs > 1 else w
