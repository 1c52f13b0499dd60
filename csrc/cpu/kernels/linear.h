// Dense matrix-vector product (linear_one) for column-major weights: y[m] = x . w[:, m], with
// w [N, M] stored as column m = N contiguous elements at w + m*N (bf16 widened to fp32 in
// registers, or fp32), x fp32, fp32 accumulation. B columns share every load of x.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Columns [m, m + B).
template <class V, int B, class T>
inline void linear_columns(int64_t N, int64_t m, const float* x, const T* w, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  using S = typename V::Tail;
  const T* col[B];
  R acc[B];
  for (int b = 0; b < B; ++b) {
    col[b] = w + (m + b) * N;
    acc[b] = V::zero();
  }
  int64_t n = 0;
  for (; n + W <= N; n += W) {
    const R xv = V::load(x + n);
    for (int b = 0; b < B; ++b) acc[b] = V::fma(xv, load_elems<V>(col[b] + n), acc[b]);
  }
  float dot[B];
  for (int b = 0; b < B; ++b) dot[b] = V::reduce_add(acc[b]);
  for (; n < N; ++n)
    for (int b = 0; b < B; ++b) dot[b] += x[n] * load_elems<S>(col[b] + n);
  for (int b = 0; b < B; ++b) y[m + b] = dot[b];
}

// Output columns [m0, m1): one column after another (sequential: one sequential stream per
// thread, what AMD Zen 4 streams fastest, e.g. bf16 2048x8192 on one thread 20-22 vs 14-16 GB/s)
// or 4 columns at a time (4 streams sharing each load of x).
template <class V, class T>
void linear_one(int64_t N, int64_t m0, int64_t m1, const float* x, const T* w, float* y,
                bool sequential) {
  int64_t m = m0;
  if (!sequential)
    for (; m + 4 <= m1; m += 4) linear_columns<V, 4>(N, m, x, w, y);
  for (; m < m1; ++m) linear_columns<V, 1>(N, m, x, w, y);
}

// linear_one with bf16 x and bf16 weights, for Vec policies with bf16 dot products
// (V::bf16_columns): the same column orders as above.
template <class V>
void linear_one_bf16x(int64_t N, int64_t m0, int64_t m1, const uint16_t* x, const uint16_t* w,
                      float* y, bool sequential) {
  int64_t m = m0;
  if (!sequential)
    for (; m + 4 <= m1; m += 4) V::template bf16_columns<4>(N, m, x, w, y);
  for (; m < m1; ++m) V::template bf16_columns<1>(N, m, x, w, y);
}

// Whether the Vec policy V has bf16 dot products (V::bf16_columns).
template <class V, class = void>
struct HasBf16Dot : std::false_type {};
template <class V>
struct HasBf16Dot<V, std::void_t<decltype(&V::template bf16_columns<1>)>> : std::true_type {};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
