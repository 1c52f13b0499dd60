// Int8 matrix products (mm8_one, mm8_seq) without materialising the dequantized matrix.
// With W = (q + 0.5)*ry*rx + my + mx and xs = x*ry (all fp32):
//   y[t, m] = rx[m]*(xs[t] . q[:, m] + 0.5*sum(xs[t])) + sum(x[t]*my) + mx[m]*sum(x[t])
// q is column-major (column m is N contiguous bytes at q + m*N), which is how the model stores
// int8 weights, so each dot product streams one column; B columns share every load of xs.
#pragma once

#include <cstdint>

#include "cpu/kernels/streams.h"
#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Adds a row's sums from index j on, one register at a time; returns where it stopped.
template <class V>
inline int64_t mm8_prepare_range(int64_t j, int64_t n, const float* x, const float* ry,
                                 const float* my, float* xs, float* s_xs, float* s_xmy,
                                 float* s_x) {
  using R = typename V::reg;
  R a = V::zero(), b = V::zero(), c = V::zero();
  for (; j + V::width <= n; j += V::width) {
    const R xv = V::load(x + j);
    const R xsv = V::mul(xv, V::load(ry + j));
    V::store(xs + j, xsv);
    a = V::add(a, xsv);
    b = V::fma(xv, V::load(my + j), b);
    c = V::add(c, xv);
  }
  *s_xs += V::reduce_add(a);
  *s_xmy += V::reduce_add(b);
  *s_x += V::reduce_add(c);
  return j;
}

template <class V>
void mm8_prepare(int64_t N, int64_t t0, int64_t t1, const float* x, const float* ry,
                 const float* my, float* xs, float* sums) {
  for (int64_t t = t0; t < t1; ++t) {
    float s_xs = 0.0f, s_xmy = 0.0f, s_x = 0.0f;
    const int64_t j = mm8_prepare_range<V>(0, N, x + t * N, ry, my, xs + t * N, &s_xs, &s_xmy,
                                           &s_x);
    mm8_prepare_range<typename V::Tail>(j, N, x + t * N, ry, my, xs + t * N, &s_xs, &s_xmy, &s_x);
    sums[3 * t + 0] = 0.5f * s_xs;
    sums[3 * t + 1] = s_xmy;
    sums[3 * t + 2] = s_x;
  }
}

// Columns [m, m + B) of one row (mm8_one): each byte is widened once and used once.
template <class V, int B>
inline void mm8_columns(int64_t N, int64_t M, int64_t m, const float* xs, const uint8_t* q,
                        const float* sums, const float* rx, const float* mx, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  const uint8_t* col[B];
  R acc[B];
  for (int b = 0; b < B; ++b) {
    col[b] = q + (m + b) * N;
    acc[b] = V::zero();
  }
  // Software prefetch a little ahead on every column stream: the widening work between loads
  // leaves the hardware prefetcher behind on weights that come from DRAM (a prefetch never faults,
  // so running past the last column is harmless).
  constexpr int64_t kAhead = 1024;
  int64_t n = 0;
  for (; n + W <= N; n += W) {
    if ((n & 63) == 0)
      for (int b = 0; b < B; ++b) __builtin_prefetch(col[b] + n + kAhead);
    const R xv = V::load(xs + n);
    for (int b = 0; b < B; ++b) acc[b] = V::fma(xv, V::load_u8(col[b] + n), acc[b]);
  }
  for (int b = 0; b < B; ++b) {
    float dot = V::reduce_add(acc[b]);
    for (int64_t j = n; j < N; ++j) dot += xs[j] * static_cast<float>(col[b][j]);
    y[m + b] = rx[m + b] * (dot + sums[0]) + sums[1] + mx[m + b] * sums[2];
  }
}

// Columns [m, m + B) for rows [t0, t0 + R) of a sequence (mm8_seq): the bytes of each chunk of
// kChunk rows of q are widened into an fp32 scratch once and reused by all R rows. Per lane the
// summation order equals mm8_columns', so a row gives bit-identical results either way.
template <class V, int B, int Rows>
inline void mm8_columns_rows(int64_t N, int64_t M, int64_t m, int64_t t0, const float* xs,
                             const uint8_t* q, const float* sums, const float* rx,
                             const float* mx, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  constexpr int64_t kChunk = 512;  // B * 2 KiB of scratch: stays in L1 with the x rows
  const uint8_t* col[B];
  for (int b = 0; b < B; ++b) col[b] = q + (m + b) * N;
  R acc[Rows][B];
  for (int r = 0; r < Rows; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = V::zero();
  float cols[B][kChunk];
  const int64_t full = N - N % W;  // the vector part; the rest is added after the reduction
  for (int64_t n0 = 0; n0 < full; n0 += kChunk) {
    const int64_t len = full - n0 < kChunk ? full - n0 : kChunk;
    for (int b = 0; b < B; ++b)
      for (int64_t j = 0; j < len; j += W) V::store(cols[b] + j, V::load_u8(col[b] + n0 + j));
    for (int r = 0; r < Rows; ++r) {
      const float* xt = xs + (t0 + r) * N + n0;
      R a[B];
      for (int b = 0; b < B; ++b) a[b] = acc[r][b];
      for (int64_t j = 0; j < len; j += W) {
        const R xv = V::load(xt + j);
        for (int b = 0; b < B; ++b) a[b] = V::fma(xv, V::load(cols[b] + j), a[b]);
      }
      for (int b = 0; b < B; ++b) acc[r][b] = a[b];
    }
  }
  for (int r = 0; r < Rows; ++r) {
    const float* xt = xs + (t0 + r) * N;
    const float* s = sums + 3 * (t0 + r);
    for (int b = 0; b < B; ++b) {
      float dot = V::reduce_add(acc[r][b]);
      for (int64_t j = full; j < N; ++j) dot += xt[j] * static_cast<float>(col[b][j]);
      y[(t0 + r) * M + m + b] = rx[m + b] * (dot + s[0]) + s[1] + mx[m + b] * s[2];
    }
  }
}

// Columns [m, m + B) for every row, in groups of 4 rows, then 2, then 1.
template <class V, int B>
inline void mm8_columns_seq(int64_t T, int64_t N, int64_t M, int64_t m, const float* xs,
                            const uint8_t* q, const float* sums, const float* rx,
                            const float* mx, float* y) {
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) mm8_columns_rows<V, B, 4>(N, M, m, t, xs, q, sums, rx, mx, y);
  for (; t + 2 <= T; t += 2) mm8_columns_rows<V, B, 2>(N, M, m, t, xs, q, sums, rx, mx, y);
  for (; t < T; ++t) mm8_columns_rows<V, B, 1>(N, M, m, t, xs, q, sums, rx, mx, y);
}

// The largest |xq| of mm8_one_i16's activation: 127 * 256 + 127, so that every xq is 256*h + l
// with h and l signed bytes (the avx512vnni Dot16 multiplies those with vpdpbusd: two
// instructions per 64 weights where the full int16 range needs three). rwkv/ops/reference.py
// has the same constant (XQ_MAX).
constexpr float kXqMax = 32639.0f;

// mm8_one_i16's activation: xq = round(xs * kXqMax / max|xs|) as int16, zero from N up to n_pad
// (a multiple of Dot16::kStep), then in the layout V::Dot16 reads (Dot16::pack). Returns the
// scale max|xs| / kXqMax that undoes it, or 0 when the
// integer path cannot represent xs (all zero, or a maximum that is not finite or too small to
// invert); the caller then uses the fp32 path. NaN is not seen by the max: the caller checks
// that sum(xs) is finite first.
template <class V>
float mm8_quantize_i16(int64_t N, int64_t n_pad, const float* xs, int16_t* xq) {
  using S = typename V::Tail;
  typename V::reg m = V::zero();
  int64_t n = 0;
  for (; n + V::width <= N; n += V::width) m = V::max(m, V::abs(V::load(xs + n)));
  float amax = V::reduce_max(m);
  for (; n < N; ++n) amax = S::max(amax, S::abs(xs[n]));
  const float inv = kXqMax / amax;
  if (!(amax > 0.0f) || !__builtin_isfinite(amax) || !__builtin_isfinite(inv)) return 0.0f;
  const typename V::reg iv = V::set1(inv);
  for (n = 0; n + V::width <= N; n += V::width) V::store_i16(xq + n, V::mul(V::load(xs + n), iv));
  for (; n < N; ++n) S::store_i16(xq + n, xs[n] * inv);
  for (; n < n_pad; ++n) xq[n] = 0;
  V::Dot16::pack(xq, n_pad);  // into the layout V's Dot16 reads (most: as it is)
  return amax / kXqMax;
}

// mm8_one_i16 on the B columns m, m + stride, ..., m + (B-1)*stride: exact integer dots
// xq . q[:, c], Dot16::kStep bytes per step, then the same epilogue as mm8_columns with dot =
// scale * (float)sum. kAhead > 0 adds a software prefetch that many bytes ahead on each column
// stream, one per 64-byte line of the step (with avx512vnni's 128-byte steps a prefetch of only
// the first line per step leaves every other line to the hardware and reads slower); past a
// column's end it reaches into the next column, which mm8_i16's streams read next.
template <class V, int B, int64_t kAhead>
inline void mm8_i16_columns(int64_t N, int64_t m, int64_t stride, const int16_t* xq,
                            const uint8_t* q, float scale, const float* sums, const float* rx,
                            const float* mx, float* y) {
  using D = typename V::Dot16;
  constexpr int64_t kStep = D::kStep, kFlush = D::kFlushRows;
  const uint8_t* col[B];
  D d[B];
  for (int b = 0; b < B; ++b) col[b] = q + (m + b * stride) * N;
  const int64_t full = N - N % kStep;
  for (int64_t n0 = 0; n0 < full; n0 += kFlush) {
    const int64_t n1 = full - n0 < kFlush ? full : n0 + kFlush;
    for (int64_t n = n0; n < n1; n += kStep) {
      if (kAhead > 0)
        for (int b = 0; b < B; ++b)
          for (int64_t line = 0; line < kStep; line += 64)
            __builtin_prefetch(col[b] + n + kAhead + line);
      for (int b = 0; b < B; ++b) d[b].add(xq + n, col[b] + n);
    }
    for (int b = 0; b < B; ++b) d[b].flush();
  }
  for (int b = 0; b < B; ++b) {
    if (full < N) d[b].add_tail(xq + full, col[b] + full, N - full);
    const float dot = scale * static_cast<float>(d[b].sum());
    const int64_t c = m + b * stride;
    y[c] = rx[c] * (dot + sums[0]) + sums[1] + mx[c] * sums[2];
  }
}

// mm8_one_i16 of rows [t, t + R) on column m: each row's activation xq (row r at xq + r*n_pad,
// in Dot16's layout, made by mm8_quantize_i16) dotted with the column, whose bytes are loaded
// once per step for the R rows; the same exact integer dots and epilogue as mm8_i16_columns, so
// each row's result is the bits mm8_one_i16 gives for that row alone. scale [T] (a row's 0:
// left for the caller's fp32 path), sums [T, 3]; y row stride ldy. The column is prefetched
// kRowsAhead bytes ahead (streams.h).
template <class V, int R>
inline void mm8_i16_rows_column(int64_t N, int64_t n_pad, int64_t m, int64_t t, const int16_t* xq,
                                const uint8_t* q, const float* scale, const float* sums,
                                const float* rx, const float* mx, float* y, int64_t ldy) {
  using D = typename V::Dot16;
  constexpr int64_t kStep = D::kStep, kFlush = D::kFlushRows;
  const uint8_t* col = q + m * N;
  const int16_t* row[R];
  D d[R];
  for (int r = 0; r < R; ++r) row[r] = xq + (t + r) * n_pad;
  const int64_t full = N - N % kStep;
  for (int64_t n0 = 0; n0 < full; n0 += kFlush) {
    const int64_t n1 = full - n0 < kFlush ? full : n0 + kFlush;
    for (int64_t n = n0; n < n1; n += kStep) {
      if (kStep >= 64 || n % 64 == 0)
        for (int64_t line = 0; line < kStep; line += 64) __builtin_prefetch(col + n + kRowsAhead + line);
      for (int r = 0; r < R; ++r) d[r].add(row[r] + n, col + n);
    }
    for (int r = 0; r < R; ++r) d[r].flush();
  }
  for (int r = 0; r < R; ++r) {
    if (full < N) d[r].add_tail(row[r] + full, col + full, N - full);
    const float dot = scale[t + r] * static_cast<float>(d[r].sum());
    const float* s = sums + (t + r) * 3;
    y[(t + r) * ldy + m] = rx[m] * (dot + s[0]) + s[1] + mx[m] * s[2];
  }
}

// Rows of mm8_i16_rows' groups (R = 1, 2, 3 or 4) on columns [m0, m1).
template <class V>
inline void mm8_i16_group(int R, int64_t N, int64_t n_pad, int64_t m0, int64_t m1, int64_t t,
                          const int16_t* xq, const uint8_t* q, const float* scale,
                          const float* sums, const float* rx, const float* mx, float* y,
                          int64_t ldy) {
  for (int64_t m = m0; m < m1; ++m) {
    switch (R) {
      case 4: mm8_i16_rows_column<V, 4>(N, n_pad, m, t, xq, q, scale, sums, rx, mx, y, ldy); break;
      case 3: mm8_i16_rows_column<V, 3>(N, n_pad, m, t, xq, q, scale, sums, rx, mx, y, ldy); break;
      case 2: mm8_i16_rows_column<V, 2>(N, n_pad, m, t, xq, q, scale, sums, rx, mx, y, ldy); break;
      default: mm8_i16_rows_column<V, 1>(N, n_pad, m, t, xq, q, scale, sums, rx, mx, y, ldy); break;
    }
  }
}

// The bytes of a group's activations (R rows of 2*N bytes) that stay in the L1 cache while
// the group reads a block's columns, and the bytes of a block of columns, which stay in L2 while
// each group reads them in turn.
constexpr int64_t kI16GroupBytes = 16384;
constexpr int64_t kI16BlockBytes = 131072;

// mm8_one_i16 of T rows on output columns [m0, m1) of y [T, M], in blocks of columns (about
// kI16BlockBytes of q): each group of up to 4 rows (as many as fit kI16GroupBytes, a Dot16 holds
// up to four registers: 4 rows fill 16 of them) dots every column of the block in turn, its
// activations staying in L1; the block's columns are read from memory by the first group and
// from L2 by the others. (One group over all columns instead reads every row's activations again
// for each column: from L2 once T rows outgrow L1.)
template <class V>
void mm8_i16_rows(int64_t T, int64_t N, int64_t n_pad, int64_t M, int64_t m0, int64_t m1,
                  const int16_t* xq, const uint8_t* q, const float* scale, const float* sums,
                  const float* rx, const float* mx, float* y) {
  const int64_t row_bytes = 2 * N;
  const int R = 4 * row_bytes <= kI16GroupBytes ? 4 : 2 * row_bytes <= kI16GroupBytes ? 2 : 1;
  const int64_t block = T > R && N > 0 ? (kI16BlockBytes + N - 1) / N : m1 - m0;
  for (int64_t mb = m0; mb < m1; mb += block) {
    const int64_t me = m1 - mb < block ? m1 : mb + block;
    int64_t t = 0;
    for (; t + R <= T; t += R) mm8_i16_group<V>(R, N, n_pad, mb, me, t, xq, q, scale, sums, rx, mx, y, M);
    if (t < T) mm8_i16_group<V>(static_cast<int>(T - t), N, n_pad, mb, me, t, xq, q, scale, sums, rx, mx, y, M);
  }
}

// mm8_i16's columns [m0, m1) in its read order (streams.h), the streams prefetching kAhead bytes
// ahead.
template <class V, int64_t kAhead>
inline void mm8_i16_ordered(int64_t N, int64_t m0, int64_t m1, const int16_t* xq, const uint8_t* q,
                            float scale, const float* sums, const float* rx, const float* mx,
                            float* y, bool sequential) {
  column_streams<4>(
      m0, m1, sequential,
      [&](int64_t m, int64_t L) {
        mm8_i16_columns<V, 4, kAhead>(N, m, L, xq, q, scale, sums, rx, mx, y);
      },
      [&](int64_t m) { mm8_i16_columns<V, 1, 0>(N, m, 1, xq, q, scale, sums, rx, mx, y); });
}

// Columns [m0, m1) in one of two memory orders (the results are identical: the dots are exact).
// sequential: one column after another, no software prefetch, so each thread reads one
// sequential stream (what AMD Zen 4's hardware prefetcher streams best). Otherwise 4 streams over
// the range's quarters (streams.h) with a software prefetch 1 KiB ahead, or 3 KiB for columns
// longer than 2 KiB (the FFN value's row slabs, K = 3584 or 4096), so each prefetch lands in the
// stream's own next column. docs/kernels.md describes the orders and why.
template <class V>
void mm8_i16(int64_t N, int64_t m0, int64_t m1, const int16_t* xq, const uint8_t* q, float scale,
             const float* sums, const float* rx, const float* mx, float* y, bool sequential) {
  if (N <= 2048) {
    mm8_i16_ordered<V, 1024>(N, m0, m1, xq, q, scale, sums, rx, mx, y, sequential);
  } else {
    mm8_i16_ordered<V, 3072>(N, m0, m1, xq, q, scale, sums, rx, mx, y, sequential);
  }
}

// Tiles for mm8_seq's BLAS path: columns [m0, m1) of q as rows of out [m1 - m0, N], either as
// fp32 or, for bf16 GEMMs, as bf16 q - 128 (integers in [-128, 127], exact in bf16).
template <class V>
void mm8_tile_f32(int64_t N, int64_t m0, int64_t m1, const uint8_t* q, float* out) {
  using S = typename V::Tail;
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* src = q + m * N;
    float* dst = out + (m - m0) * N;
    int64_t n = 0;
    for (; n + V::width <= N; n += V::width) V::store(dst + n, V::load_u8(src + n));
    for (; n < N; ++n) S::store(dst + n, S::load_u8(src + n));
  }
}

template <class V>
void mm8_tile_bf16(int64_t N, int64_t m0, int64_t m1, const uint8_t* q, uint16_t* out) {
  using S = typename V::Tail;
  const typename V::reg c = V::set1(128.0f);
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* src = q + m * N;
    uint16_t* dst = out + (m - m0) * N;
    int64_t n = 0;
    for (; n + V::width <= N; n += V::width)
      V::store_bf16_exact(dst + n, V::sub(V::load_u8(src + n), c));
    for (; n < N; ++n) S::store_bf16_exact(dst + n, S::sub(S::load_u8(src + n), 128.0f));
  }
}

template <class V>
void mm8(int64_t T, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* xs,
         const uint8_t* q, const float* sums, const float* rx, const float* mx, float* y) {
  int64_t m = m0;
  if (T == 1) {
    for (; m + 4 <= m1; m += 4) mm8_columns<V, 4>(N, M, m, xs, q, sums, rx, mx, y);
    for (; m < m1; ++m) mm8_columns<V, 1>(N, M, m, xs, q, sums, rx, mx, y);
    return;
  }
  for (; m + 4 <= m1; m += 4) mm8_columns_seq<V, 4>(T, N, M, m, xs, q, sums, rx, mx, y);
  for (; m < m1; ++m) mm8_columns_seq<V, 1>(T, N, M, m, xs, q, sums, rx, mx, y);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
