// maa_mix: RWKV-6's data-dependent token shift, after its first low-rank product. For xx [T, C]
// (the layer norm), sx [C] (the shift state), zt [T, n*D] (tanh of that product), w2 [n, D, C]
// and maa [n, C]:
//   d[t] = prev[t] - xx[t], prev[t] = sx for t = 0, else xx[t - 1]
//   out[i, t] = xx[t] + d[t] * (maa[i] + sum_j zt[t, i*D + j] * w2[i, j])
// w2 is fp32 or bf16 (W = float or uint16_t); everything else fp32. On channels [c0, c1), in chunks of up to kChunk channels. For each chunk, mix and row, the
// kernel streams the chunk's part of every w2 row in order (n*D sequential runs of up to 2 KiB:
// w2 is most of what the op reads, 1.3 MB per layer at 1.5B, and read across the rows it would
// be latency-bound), accumulating into a buffer that stays in L1; w2's chunk (n*D*kChunk floats)
// stays in L2 for the next rows.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

constexpr int64_t kMaaChunk = 512;

template <class V, class W>
void maa_mix(int64_t T, int64_t C, int64_t n, int64_t D, int64_t c0, int64_t c1, const float* xx,
             const float* sx, const float* zt, const W* w2, const float* maa, float* out) {
  using S = typename V::Tail;
  using R = typename V::reg;
  alignas(64) float acc[kMaaChunk];
  for (int64_t a = c0; a < c1; a += kMaaChunk) {
    const int64_t len = c1 - a < kMaaChunk ? c1 - a : kMaaChunk;
    const int64_t full = len - len % V::width;
    for (int64_t i = 0; i < n; ++i) {
      const W* wi = w2 + i * D * C + a;
      const float* mi = maa + i * C + a;
      for (int64_t t = 0; t < T; ++t) {
        const float* z = zt + (t * n + i) * D;
        for (int64_t c = 0; c < len; ++c) acc[c] = 0.0f;
        for (int64_t j = 0; j < D; ++j) {
          const W* row = wi + j * C;
          const R zj = V::set1(z[j]);
          for (int64_t c = 0; c < full; c += V::width)
            V::store(acc + c, V::fma(zj, load_elems<V>(row + c), V::load(acc + c)));
          for (int64_t c = full; c < len; ++c) acc[c] = S::fma(z[j], load_elems<S>(row + c), acc[c]);
        }
        const float* cur = xx + t * C + a;
        const float* prev = (t == 0 ? sx : xx + (t - 1) * C) + a;
        float* o = out + (i * T + t) * C + a;
        for (int64_t c = 0; c < full; c += V::width) {
          const R xv = V::load(cur + c);
          const R dv = V::sub(V::load(prev + c), xv);
          V::store(o + c, V::add(xv, V::mul(dv, V::add(V::load(mi + c), V::load(acc + c)))));
        }
        for (int64_t c = full; c < len; ++c) o[c] = cur[c] + (prev[c] - cur[c]) * (mi[c] + acc[c]);
      }
    }
  }
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
