// RWKV-7 recurrence (wkv7_forward), per head and token, state S [N, N] = [value i, key j]:
//   sa[i] = sum_j a[j]*S[i, j]                       (old state)
//   S[i, j] = S[i, j]*w[j] + sa[i]*b[j] + v[i]*k[j]
//   y[i] = sum_j S[i, j]*r[j]                        (new state)
// fp32 throughout. Rows are independent and contiguous along j, so registers run along j and
// each row is read twice per token (dot with a, then update + dot with r) while it is in L1.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

template <class V>
inline float wkv7_dot(const float* a, const float* b, int64_t n) {
  using R = typename V::reg;
  constexpr int W = V::width;
  R acc0 = V::zero(), acc1 = V::zero();
  int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    acc0 = V::fma(V::load(a + j), V::load(b + j), acc0);
    acc1 = V::fma(V::load(a + j + W), V::load(b + j + W), acc1);
  }
  for (; j + W <= n; j += W) acc0 = V::fma(V::load(a + j), V::load(b + j), acc0);
  float s = V::reduce_add(V::add(acc0, acc1));
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

// Updates one state row in place and returns its dot product with r.
template <class V>
inline float wkv7_row(int64_t n, float* row, const float* w, const float* b, const float* k,
                      const float* r, float sa, float vi) {
  using R = typename V::reg;
  constexpr int W = V::width;
  const R sav = V::set1(sa), viv = V::set1(vi);
  R acc = V::zero();
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const R add = V::fma(sav, V::load(b + j), V::mul(viv, V::load(k + j)));
    const R s = V::fma(V::load(row + j), V::load(w + j), add);
    V::store(row + j, s);
    acc = V::fma(s, V::load(r + j), acc);
  }
  float y = V::reduce_add(acc);
  for (; j < n; ++j) {
    const float s = row[j] * w[j] + (sa * b[j] + vi * k[j]);
    row[j] = s;
    y += s * r[j];
  }
  return y;
}

template <class V>
void wkv7(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
          const float* r, const float* w, const float* k, const float* v, const float* a,
          const float* b, float* y) {
  const int64_t HN = H * N;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = state + h * N * N;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t o = t * HN + h * N;
      for (int64_t i = 0; i < N; ++i) {
        float* row = S + i * N;
        const float sa = wkv7_dot<V>(a + o, row, N);
        y[o + i] = wkv7_row<V>(N, row, w + o, b + o, k + o, r + o, sa, v[o + i]);
      }
    }
  }
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
