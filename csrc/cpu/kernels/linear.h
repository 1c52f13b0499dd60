// Dense matrix-vector product (linear_one) for column-major bf16 weights: y[m] = x . w[:, m],
// with w [N, M] stored as column m = N contiguous bf16 at w + m*N, widened to fp32 in registers;
// x fp32, fp32 accumulation. B columns share every load of x. (For fp32 weights torch's own
// matrix-vector product is as fast, so there is no fp32 variant.)
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Columns [m, m + B).
template <class V, int B>
inline void linear_columns(int64_t N, int64_t m, const float* x, const uint16_t* w, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  using S = typename V::Tail;
  const uint16_t* col[B];
  R acc[B];
  for (int b = 0; b < B; ++b) {
    col[b] = w + (m + b) * N;
    acc[b] = V::zero();
  }
  int64_t n = 0;
  for (; n + W <= N; n += W) {
    const R xv = V::load(x + n);
    for (int b = 0; b < B; ++b) acc[b] = V::fma(xv, V::load_bf16(col[b] + n), acc[b]);
  }
  float dot[B];
  for (int b = 0; b < B; ++b) dot[b] = V::reduce_add(acc[b]);
  for (; n < N; ++n)
    for (int b = 0; b < B; ++b) dot[b] += x[n] * S::load_bf16(col[b] + n);
  for (int b = 0; b < B; ++b) y[m + b] = dot[b];
}

// Output columns [m0, m1).
template <class V>
void linear_one(int64_t N, int64_t m0, int64_t m1, const float* x, const uint16_t* w, float* y) {
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) linear_columns<V, 4>(N, m, x, w, y);
  for (; m < m1; ++m) linear_columns<V, 1>(N, m, x, w, y);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
