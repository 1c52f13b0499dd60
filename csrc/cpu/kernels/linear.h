// Dense matrix-vector product (linear_one) for column-major weights: y[m] = x . w[:, m], with
// w [N, M] stored as column m = N contiguous elements at w + m*N (bf16 widened to fp32 in
// registers, or fp32), x fp32, fp32 accumulation. B columns share every load of x.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/kernel_table.h"
#include "cpu/kernels/streams.h"
#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// The B columns m, m + stride, ..., m + (B-1)*stride. kAhead > 0: a software prefetch of every
// 64-byte line that many bytes ahead on each column stream (streams.h).
template <class V, int B, class T, int64_t kAhead = 0>
inline void linear_columns(int64_t N, int64_t m, int64_t stride, const float* x, const T* w,
                           float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  constexpr int64_t E = sizeof(T);
  using S = typename V::Tail;
  const T* col[B];
  R acc[B];
  for (int b = 0; b < B; ++b) {
    col[b] = w + (m + b * stride) * N;
    acc[b] = V::zero();
  }
  int64_t n = 0;
  for (; n + W <= N; n += W) {
    if (kAhead > 0 && (n * E) % 64 == 0)  // once per line (a step of W elements may be less)
      for (int b = 0; b < B; ++b)
        __builtin_prefetch(reinterpret_cast<const char*>(col[b] + n) + kAhead);
    const R xv = V::load(x + n);
    for (int b = 0; b < B; ++b) acc[b] = V::fma(xv, load_elems<V>(col[b] + n), acc[b]);
  }
  float dot[B];
  for (int b = 0; b < B; ++b) dot[b] = V::reduce_add(acc[b]);
  for (; n < N; ++n)
    for (int b = 0; b < B; ++b) dot[b] += x[n] * load_elems<S>(col[b] + n);
  for (int b = 0; b < B; ++b) y[m + b * stride] = dot[b];
}

// Short columns (at most kShortColumnBytes, kernel_table.h): the second factors of the low-rank
// products (the rows are the rank: RWKV-6's time_decay_w2 64, RWKV-7's w2, a2, v2, g2 64-256 at
// 1.5B, 8-24 in the benchmark's checkpoints). Summing each column into one float costs a
// horizontal sum of a register (~8 instructions) plus a scalar loop over the rows past the last
// whole register, so per byte read such columns run compute-bound, far below the memory's rate.

// A short column's dot product, summed lane-wise in one register a step at a time: fp32 x with
// weights T (fp32, or bf16 widened in registers), V::width values a step; the last N % width
// rows by partial loads that read nothing past the column. (avx512bf16's bf16 x bf16 dot:
// VecAvx512Bf16::Bf16ShortDot.)
template <class V, class Elem>
struct ShortDot {
  using X = float;
  using T = Elem;
  using R = typename V::reg;
  static constexpr int kStep = V::width;
  static R step(R a, const float* x, const T* c) { return V::fma(V::load(x), load_elems<V>(c), a); }
  static R tail(R a, const float* x, const T* c, int64_t n) {
    return V::fma(V::load_partial(x, n), load_elems_partial<V>(c, n), a);
  }
};

// One short column's register (D's steps, then its tail).
template <class D, class R>
inline R short_column(int64_t N, const typename D::X* x, const typename D::T* col, R a) {
  const int64_t full = N - N % D::kStep;
  for (int64_t n = 0; n < full; n += D::kStep) a = D::step(a, x + n, col + n);
  if (full < N) a = D::tail(a, x + full, col + full, N - full);
  return a;
}

// Columns [m, m + W) of short columns, W = V::width: one column after the other (the W columns
// are one run of consecutive memory), each column's products summed lane-wise in one register
// (short_column), then the W registers' lanes summed all at once into one register of W results.
template <class V, class D>
inline void linear_short_columns(int64_t N, int64_t m, const typename D::X* x,
                                 const typename D::T* w, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  R acc[W];
  for (int b = 0; b < W; ++b) acc[b] = short_column<D>(N, x, w + (m + b) * N, V::zero());
  V::store(y + m, V::reduce_add_columns(acc));
}

// The 4L groups of W short columns from m as 4 streams, the long columns' read order
// (streams.h): stream s reads groups s*L .. s*L + L - 1 one column after another, the 4 streams
// a step each in turn, sharing each load of x and prefetching kAhead bytes ahead (once per
// 64-byte line). Each column's register and each group's reduction as linear_short_columns
// forms them: the same bits. One stream per thread without software prefetch reads these short
// columns well below the long columns' rate; the 4 streams bring them close to it (docs/kernels.md).
template <class V, class D, int64_t kAhead>
inline void linear_short_streams(int64_t N, int64_t m, int64_t L, const typename D::X* x,
                                 const typename D::T* w, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width, S = 4;
  constexpr int64_t E = sizeof(typename D::T);
  const int64_t full = N - N % D::kStep;
  R acc[S][W];
  for (int64_t g = 0; g < L; ++g) {
    for (int b = 0; b < W; ++b) {
      const typename D::T* col[S];
      R a[S];
      for (int s = 0; s < S; ++s) {
        col[s] = w + (m + (s * L + g) * W + b) * N;
        a[s] = V::zero();
      }
      for (int64_t n = 0; n < full; n += D::kStep) {
        if ((n * E) % 64 == 0)
          for (int s = 0; s < S; ++s)
            __builtin_prefetch(reinterpret_cast<const char*>(col[s] + n) + kAhead);
        for (int s = 0; s < S; ++s) a[s] = D::step(a[s], x + n, col[s] + n);
      }
      if (full < N)
        for (int s = 0; s < S; ++s) a[s] = D::tail(a[s], x + full, col[s] + full, N - full);
      for (int s = 0; s < S; ++s) acc[s][b] = a[s];
    }
    for (int s = 0; s < S; ++s) V::store(y + m + (s * L + g) * W, V::reduce_add_columns(acc[s]));
  }
}

// Short columns [m0, m1) in whole groups of W from m0 (sequential: one group after another;
// otherwise as 4 streams over the groups' quarters, then the groups left); returns the first
// column past the last whole group.
template <class V, class D, int64_t kAhead>
inline int64_t short_column_groups(int64_t N, int64_t m0, int64_t m1, bool sequential,
                                   const typename D::X* x, const typename D::T* w, float* y) {
  constexpr int W = V::width;
  const int64_t L = sequential ? 0 : (m1 - m0) / W / 4;
  if (L > 0) linear_short_streams<V, D, kAhead>(N, m0, L, x, w, y);
  int64_t m = m0 + 4 * L * W;
  for (; m + W <= m1; m += W) linear_short_columns<V, D>(N, m, x, w, y);
  return m;
}

// Output columns [m0, m1): short columns in groups of W (short_column_groups; a last partial
// group as below), else one column after another (sequential: one sequential stream per thread,
// what AMD Zen 4's hardware prefetcher streams fastest) or 4 streams (streams.h) with a software
// prefetch 2 KiB ahead (faster than 4 adjacent columns elsewhere, since each stream's prefetch
// then runs on into its own next column; docs/kernels.md).
template <class V, class T>
void linear_one(int64_t N, int64_t m0, int64_t m1, const float* x, const T* w, float* y,
                bool sequential) {
  int64_t m = m0;
  if (N * static_cast<int64_t>(sizeof(T)) <= kShortColumnBytes)
    m = short_column_groups<V, ShortDot<V, T>, 2048>(N, m0, m1, sequential, x, w, y);
  column_streams<4>(
      m, m1, sequential,
      [&](int64_t c, int64_t L) { linear_columns<V, 4, T, 2048>(N, c, L, x, w, y); },
      [&](int64_t c) { linear_columns<V, 1, T>(N, c, 1, x, w, y); });
}

// linear_one with bf16 x and bf16 weights, for Vec policies with bf16 dot products
// (V::bf16_columns, V::Bf16ShortDot): the same orders, the streams prefetching 1 KiB ahead (half
// the fp32 distance: a bf16 step covers half the bytes).
template <class V>
void linear_one_bf16x(int64_t N, int64_t m0, int64_t m1, const uint16_t* x, const uint16_t* w,
                      float* y, bool sequential) {
  int64_t m = m0;
  if (N * 2 <= kShortColumnBytes)
    m = short_column_groups<V, typename V::Bf16ShortDot, 2048>(N, m0, m1, sequential, x, w, y);
  column_streams<4>(
      m, m1, sequential,
      [&](int64_t c, int64_t L) { V::template bf16_columns<4, 1024>(N, c, L, x, w, y); },
      [&](int64_t c) { V::template bf16_columns<1>(N, c, 1, x, w, y); });
}

// Whether the Vec policy V has bf16 dot products (V::bf16_columns).
template <class V, class = void>
struct HasBf16Dot : std::false_type {};
template <class V>
struct HasBf16Dot<V, std::void_t<decltype(&V::template bf16_columns<1>)>> : std::true_type {};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
