// What the int8 product glue shares: cpu/mm8.cpp (mm8_one, mm8_seq) prepares with mm8_prepare
// (the checked inputs in fp32, w as column-major [N, M], xs = x*ry and the per-row sums of
// kernels/mm8.h) and runs the fp32 loop; cpu/one_token.cpp (mm8_one_i16, linear_one_group,
// linear_one_slabs) prepares per matrix or slab itself, with the same helpers and scratch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "common/op_checks.h"
#include "cpu/scratch.h"

namespace rwkv {
namespace cpu {

struct Mm8Prepared {
  int64_t T, N, M;
  at::Tensor x32, mx32, rx32, q;
  at::Tensor xs_t, sums_t;  // defined for sequences only
  float* xs;                // [T, N]
  float* sums;              // [T, 3]
};

// w [N, M] itself when column-major (w.t() contiguous, the model's layout), else a column-major
// copy: what the int8 kernels read.
inline at::Tensor as_column_major(const at::Tensor& w) {
  return column_major(w) ? w : w.t().contiguous().t();
}

// t itself when fp32 and contiguous, else an fp32 contiguous copy (bf16: cpu/float_io.h's
// widened(), a plain loop for the few thousand values of one token, where ATen's conversion
// costs more in dispatch and set-up than the copy).
at::Tensor fp32(const at::Tensor& t);

// Prepares arguments that passed check_mm8 (which gave d). Sequences (seq) keep xs and the sums
// in tensors (the tiled path hands them to at::mm); one token (x [N] or [1, N]) writes them to
// `one_token_buf`, which must hold mm8_one_token_floats(N) floats, 64-byte aligned.
Mm8Prepared mm8_prepare(const Mm8Dims& d, bool seq, const at::Tensor& x, const at::Tensor& w,
                        const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                        const at::Tensor& ry, float* one_token_buf);

// The floats mm8_prepare's one-token buffer needs: xs [N], padded to 64 bytes, then the 3 sums.
inline int64_t mm8_one_token_floats(int64_t N) { return (N + 15) / 16 * 16 + 16; }

// The fp32 loop of kernels/mm8.h on output columns [m0, m1) of every row of p; y [T, M] fp32.
void mm8_columns(const Mm8Prepared& p, int64_t m0, int64_t m1, float* y);

}  // namespace cpu
}  // namespace rwkv
