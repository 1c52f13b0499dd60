// Dense products of several rows (linear_rows): y[t, m] = x[t] . w[:, m] for rows t < T and output
// columns [m0, m1), w column-major (column m = N contiguous elements at w + m*N; bf16 widened to
// fp32 in registers, or fp32), x fp32 with row stride ldx, fp32 accumulation. Blocks of 2 columns
// by 4 rows share every load: each column pair streams from memory once, for its first row
// group, and is then read from the cache by the others, so a step of the batched engine reads
// each weight once for all its rows.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Rows [t, t + R) by columns [m, m + C): y[(t + r)*ldy + m + c] (=, or += with accumulate).
template <class V, int R, int C, class T>
inline void rows_block(int64_t N, int64_t t, int64_t m, const float* x, int64_t ldx, const T* w,
                       float* y, int64_t ldy, bool accumulate) {
  using Reg = typename V::reg;
  using S = typename V::Tail;
  constexpr int W = V::width;
  const T* col[C];
  const float* row[R];
  Reg acc[R][C];
  for (int c = 0; c < C; ++c) col[c] = w + (m + c) * N;
  for (int r = 0; r < R; ++r) {
    row[r] = x + (t + r) * ldx;
    for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
  }
  int64_t n = 0;
  for (; n + W <= N; n += W) {
    Reg wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_elems<V>(col[c] + n);
    for (int r = 0; r < R; ++r) {
      const Reg xv = V::load(row[r] + n);
      for (int c = 0; c < C; ++c) acc[r][c] = V::fma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float dot = V::reduce_add(acc[r][c]);
      for (int64_t k = n; k < N; ++k) dot += row[r][k] * load_elems<S>(col[c] + k);
      float* out = y + (t + r) * ldy + m + c;
      *out = accumulate ? *out + dot : dot;
    }
  }
}

// Every row of columns [m, m + C): groups of 4 rows, then the rows left.
template <class V, int C, class T>
inline void rows_columns(int64_t T_, int64_t N, int64_t m, const float* x, int64_t ldx, const T* w,
                         float* y, int64_t ldy, bool accumulate) {
  int64_t t = 0;
  for (; t + 4 <= T_; t += 4) rows_block<V, 4, C>(N, t, m, x, ldx, w, y, ldy, accumulate);
  switch (T_ - t) {
    case 3: rows_block<V, 3, C>(N, t, m, x, ldx, w, y, ldy, accumulate); break;
    case 2: rows_block<V, 2, C>(N, t, m, x, ldx, w, y, ldy, accumulate); break;
    case 1: rows_block<V, 1, C>(N, t, m, x, ldx, w, y, ldy, accumulate); break;
    default: break;
  }
}

// linear_rows on output columns [m0, m1) of y [T, M] (row stride M).
template <class V, class T>
void linear_rows(int64_t T_, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* x,
                 int64_t ldx, const T* w, float* y, bool accumulate) {
  int64_t m = m0;
  for (; m + 2 <= m1; m += 2) rows_columns<V, 2>(T_, N, m, x, ldx, w, y, M, accumulate);
  if (m < m1) rows_columns<V, 1>(T_, N, m, x, ldx, w, y, M, accumulate);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
