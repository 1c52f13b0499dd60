// RWKV-5.x / 6 recurrence (wkv5_forward, wkv6_forward), per head, state S [N, N] = [key i, value j]:
//   y[t, j] = v[t, j] * sum_i r[t, i]*u[i]*k[t, i]  +  sum_i r[t, i]*S[i, j]     (old S)
//   S[i, j] = w[i]*S[i, j] + k[t, i]*v[t, j]          (wkv6: w[t, i], a decay per token)
// fp32 throughout. The value axis j is contiguous, so registers run along j; one pass over S
// per token both reads it for y and updates it. A head's S (16 KiB at N = 64) stays in L1.
#pragma once

#include <cstdint>

#include "cpu/kernels/group_norm.h"
#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Value columns [j, j + B*V::width) of one head and token: reads the state from src, writes the
// updated state to S (the same pointer: in place); kStream: past the caches (V::stream).
template <class V, int B, bool kStream = false>
inline void wkv56_columns(int64_t N, int64_t j, const float* src, float* S, const float* r,
                          const float* k, const float* v, const float* w, float ruk, float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  R acc[B], vj[B];
  for (int b = 0; b < B; ++b) {
    acc[b] = V::zero();
    vj[b] = V::load(v + j + b * W);
  }
  for (int64_t i = 0; i < N; ++i) {
    const R ri = V::set1(r[i]), wi = V::set1(w[i]), ki = V::set1(k[i]);
    const float* from = src + i * N + j;
    float* row = S + i * N + j;
    for (int b = 0; b < B; ++b) {
      const R s = V::load(from + b * W);
      acc[b] = V::fma(ri, s, acc[b]);
      const R out = V::fma(wi, s, V::mul(ki, vj[b]));
      if (kStream)
        V::stream(row + b * W, out);
      else
        V::store(row + b * W, out);
    }
  }
  const R c = V::set1(ruk);
  for (int b = 0; b < B; ++b) V::store(y + j + b * W, V::fma(c, vj[b], acc[b]));
}

// One head and token: y [N] from the state src [N, N], written updated to S (may be src), with
// decay wt and bonus u of the head. kStream: S written past the caches (rows_streamable(S, N)).
template <class V, bool kStream = false>
inline void wkv56_token(int64_t N, const float* src, float* S, const float* r, const float* k,
                        const float* v, const float* wt, const float* uh, float* y) {
  constexpr int W = V::width;
  float ruk = 0.0f;
  for (int64_t i = 0; i < N; ++i) ruk += r[i] * uh[i] * k[i];
  int64_t j = 0;
  for (; j + 4 * W <= N; j += 4 * W)
    wkv56_columns<V, 4, kStream>(N, j, src, S, r, k, v, wt, ruk, y);
  for (; j + W <= N; j += W) wkv56_columns<V, 1, kStream>(N, j, src, S, r, k, v, wt, ruk, y);
  for (; j < N; ++j) wkv56_columns<typename V::Tail, 1>(N, j, src, S, r, k, v, wt, ruk, y);
}

template <class V>
void wkv56(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
           const float* r, const float* k, const float* v, const float* w, int64_t w_step,
           const float* u, float* y) {
  const int64_t HN = H * N;
  for (int64_t h = h0; h < h1; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t o = t * HN + h * N;
      float* S = state + h * N * N;
      wkv56_token<V>(N, S, S, r + o, k + o, v + o, w + t * w_step + h * N, u + h * N, y + o);
    }
  }
}

// wkv6_block (one RWKV-6 layer's time mix between its projections and the output projection,
// per head and token; all fp32 [T, H*N] rows, p [4, H*N] = decay base, u, lx_w, lx_b):
//   decay = exp(-exp(base + w)), recurrence as wkv6, y = group_norm_head(y; lx_w, lx_b, eps) * g
// scratch holds N floats for each head in [h0, h1). The first step reads the old state from
// state_in when it is not null (state is then only written).
template <class V>
void wkv6_block(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
                const float* state_in, const float* r, const float* k, const float* v,
                const float* w, const float* g, const float* p, float eps, float* scratch,
                float* y) {
  using R = typename V::reg;
  using S = typename V::Tail;
  constexpr int W = V::width;
  const int64_t HN = H * N;
  const float *base = p, *u = p + HN, *lx_w = p + 2 * HN, *lx_b = p + 3 * HN;
  // The last step's new state is written past the caches (as in wkv7_block).
  const bool stream = rows_streamable(state, N);
  for (int64_t h = h0; h < h1; ++h) {
    float* dec = scratch + (h - h0) * N;
    const int64_t c = h * N;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t o = t * HN + c;
      int64_t j = 0;
      for (; j + W <= N; j += W) {
        const R z = V::exp(V::add(V::load(base + c + j), V::load(w + o + j)));
        V::store(dec + j, V::exp(V::sub(V::zero(), z)));
      }
      for (; j < N; ++j) dec[j] = S::exp(-S::exp(base[c + j] + w[o + j]));
      float* S = state + h * N * N;
      const float* src = t == 0 && state_in != nullptr ? state_in + h * N * N : S;
      if (stream && t == T - 1)
        wkv56_token<V, true>(N, src, S, r + o, k + o, v + o, dec, u + c, y + o);
      else
        wkv56_token<V>(N, src, S, r + o, k + o, v + o, dec, u + c, y + o);
      group_norm_gate(N, y + o, lx_w + c, lx_b + c, eps, g + o);
    }
  }
  if (stream) V::fence();
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
