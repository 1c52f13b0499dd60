// Int8 matrix products (mm8_one, mm8_seq) without materialising the dequantized matrix.
// With W = (q + 0.5)*ry*rx + my + mx and xs = x*ry (all fp32):
//   y[t, m] = rx[m]*(xs[t] . q[:, m] + 0.5*sum(xs[t])) + sum(x[t]*my) + mx[m]*sum(x[t])
// q is column-major (column m is N contiguous bytes at q + m*N), which is how the model stores
// int8 weights, so each dot product streams one column; B columns share every load of xs.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Partial sums over [j0, j1) of one row; returns the index where it stopped.
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

// Columns [m, m + B) for every row t.
template <class V, int B>
inline void mm8_columns(int64_t T, int64_t N, int64_t M, int64_t m, const float* xs,
                        const uint8_t* q, const float* sums, const float* rx, const float* mx,
                        float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  const uint8_t* col[B];
  for (int b = 0; b < B; ++b) col[b] = q + (m + b) * N;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = xs + t * N;
    R acc[B];
    for (int b = 0; b < B; ++b) acc[b] = V::zero();
    int64_t n = 0;
    for (; n + W <= N; n += W) {
      const R xv = V::load(xt + n);
      for (int b = 0; b < B; ++b) acc[b] = V::fma(xv, V::load_u8(col[b] + n), acc[b]);
    }
    float dot[B];
    for (int b = 0; b < B; ++b) dot[b] = V::reduce_add(acc[b]);
    for (; n < N; ++n)
      for (int b = 0; b < B; ++b) dot[b] += xt[n] * static_cast<float>(col[b][n]);
    const float* s = sums + 3 * t;
    for (int b = 0; b < B; ++b)
      y[t * M + m + b] = rx[m + b] * (dot[b] + s[0]) + s[1] + mx[m + b] * s[2];
  }
}

template <class V>
void mm8(int64_t T, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* xs,
         const uint8_t* q, const float* sums, const float* rx, const float* mx, float* y) {
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) mm8_columns<V, 4>(T, N, M, m, xs, q, sums, rx, mx, y);
  for (; m < m1; ++m) mm8_columns<V, 1>(T, N, M, m, xs, q, sums, rx, mx, y);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
