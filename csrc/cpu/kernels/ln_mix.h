// ln_mix: how each half of every RWKV block begins. For x [T, C]:
//   xx = layer_norm(x; w, b, eps)                         (mean and biased variance per row)
//   prev[t] = sx for t = 0, else xx[t - 1]                (token shift)
//   out[i, t] = xx[t] * mix[i] + prev[t] * (1 - mix[i])   (lerp: RWKV-4/5)
//   out[i, t] = xx[t] + (prev[t] - xx[t]) * mix[i]        (delta: RWKV-6/7)
// Two steps, so that rows can be split between threads: the layer norm of rows [t0, t1), then
// (after every row's layer norm) the mixes of rows [t0, t1), which read the row before.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

template <class V>
void layer_norm_rows(int64_t C, int64_t t0, int64_t t1, const float* x, const float* w,
                     const float* b, float eps, float* y) {
  using S = typename V::Tail;
  using R = typename V::reg;
  const int64_t full = C - C % V::width;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * C;
    float* yt = y + t * C;
    R acc = V::zero();
    for (int64_t c = 0; c < full; c += V::width) acc = V::add(acc, V::load(xt + c));
    float sum = V::reduce_add(acc);
    for (int64_t c = full; c < C; ++c) sum += xt[c];
    const float mean = sum / static_cast<float>(C);
    const R mv = V::set1(mean);
    acc = V::zero();
    for (int64_t c = 0; c < full; c += V::width) {
      const R d = V::sub(V::load(xt + c), mv);
      acc = V::fma(d, d, acc);
    }
    float var = V::reduce_add(acc);
    for (int64_t c = full; c < C; ++c) var += (xt[c] - mean) * (xt[c] - mean);
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
    const R rv = V::set1(rstd);
    for (int64_t c = 0; c < full; c += V::width)
      V::store(yt + c, V::fma(V::mul(V::sub(V::load(xt + c), mv), rv), V::load(w + c), V::load(b + c)));
    for (int64_t c = full; c < C; ++c) yt[c] = S::fma((xt[c] - mean) * rstd, w[c], b[c]);
  }
}

// out[i, t] for the n mix rows and rows t in [t0, t1) (outs: n pointers, to out[i] [T, C] each;
// mix [n, C]).
template <class V>
void shift_mix_rows(int64_t T, int64_t C, int64_t n, int64_t t0, int64_t t1, const float* xx,
                    const float* sx, const float* mix, bool lerp, float* const* outs) {
  using S = typename V::Tail;
  using R = typename V::reg;
  const int64_t full = C - C % V::width;
  const R one = V::set1(1.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* cur = xx + t * C;
    const float* prev = t == 0 ? sx : xx + (t - 1) * C;
    for (int64_t i = 0; i < n; ++i) {
      const float* m = mix + i * C;
      float* o = outs[i] + t * C;
      int64_t c = 0;
      if (lerp) {
        for (; c < full; c += V::width) {
          const R mv = V::load(m + c);
          V::store(o + c, V::add(V::mul(V::load(cur + c), mv),
                                 V::mul(V::load(prev + c), V::sub(one, mv))));
        }
        for (; c < C; ++c) o[c] = S::add(S::mul(cur[c], m[c]), S::mul(prev[c], 1.0f - m[c]));
      } else {
        for (; c < full; c += V::width) {
          const R xv = V::load(cur + c);
          V::store(o + c, V::add(xv, V::mul(V::sub(V::load(prev + c), xv), V::load(m + c))));
        }
        for (; c < C; ++c) o[c] = S::add(cur[c], S::mul(prev[c] - cur[c], m[c]));
      }
    }
  }
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
