// RWKV-7 recurrence (wkv7_forward), per head and token, state S [N, N] = [value i, key j]:
//   sa[i] = sum_j a[j]*S[i, j]                       (old state)
//   S[i, j] = S[i, j]*w[j] + sa[i]*b[j] + v[i]*k[j]
//   y[i] = sum_j S[i, j]*r[j]                        (new state)
// fp32 throughout. Rows are independent and contiguous along j, so registers run along j and
// each row is read twice per token (dot with a, then update + dot with r) while it is in L1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/kernels/group_norm.h"
#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// The dot product a . b over its whole registers (n - n % V::width values, two accumulators),
// as one register whose lanes sum to it (wkv7_rows reduces V::width rows' registers at once,
// reduce_add_columns).
template <class V>
inline typename V::reg wkv7_dot_lanes(const float* a, const float* b, int64_t n) {
  using R = typename V::reg;
  constexpr int W = V::width;
  R acc0 = V::zero(), acc1 = V::zero();
  int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    acc0 = V::fma(V::load(a + j), V::load(b + j), acc0);
    acc1 = V::fma(V::load(a + j + W), V::load(b + j + W), acc1);
  }
  if (j + W <= n) acc0 = V::fma(V::load(a + j), V::load(b + j), acc0);
  return V::add(acc0, acc1);
}

template <class V>
inline float wkv7_dot(const float* a, const float* b, int64_t n) {
  float s = V::reduce_add(wkv7_dot_lanes<V>(a, b, n));
  for (int64_t j = n - n % V::width; j < n; ++j) s += a[j] * b[j];
  return s;
}

// Writes the updated state row `src` to `row` (the same pointer: in place) over its whole
// registers (n - n % V::width values) and returns the register whose lanes sum to their dot
// product with r. kStream: the row is written past the caches (V::stream; row aligned), for a
// state not read again in this call.
template <class V, bool kStream>
inline typename V::reg wkv7_row_lanes(int64_t n, const float* src, float* row, const float* w,
                                      const float* b, const float* k, const float* r, float sa,
                                      float vi) {
  using R = typename V::reg;
  constexpr int W = V::width;
  const R sav = V::set1(sa), viv = V::set1(vi);
  R acc = V::zero();
  for (int64_t j = 0; j + W <= n; j += W) {
    const R add = V::fma(sav, V::load(b + j), V::mul(viv, V::load(k + j)));
    const R s = V::fma(V::load(src + j), V::load(w + j), add);
    if (kStream)
      V::stream(row + j, s);
    else
      V::store(row + j, s);
    acc = V::fma(s, V::load(r + j), acc);
  }
  return acc;
}

// The whole row (wkv7_row_lanes, then the values past the last register), returning its dot
// product with r (kStream: n whole registers).
template <class V, bool kStream = false>
inline float wkv7_row(int64_t n, const float* src, float* row, const float* w, const float* b,
                      const float* k, const float* r, float sa, float vi) {
  float y = V::reduce_add(wkv7_row_lanes<V, kStream>(n, src, row, w, b, k, r, sa, vi));
  for (int64_t j = n - n % V::width; j < n; ++j) {
    const float s = src[j] * w[j] + (sa * b[j] + vi * k[j]);
    row[j] = s;
    y += s * r[j];
  }
  return y;
}

// One head's rows for one token (the recurrence's core in wkv7_block), V::width rows at a time
// when N is a multiple of it: the rows' dot products with -kk, then their updates and dot
// products with r, each set of V::width sums reduced in one go (reduce_add_columns) rather
// than one horizontal sum per row. y[i] for each row i.
template <class V, bool kStream>
inline void wkv7_rows(int64_t N, const float* from, float* S, const float* dec, const float* b,
                      const float* k2, const float* nk, const float* r, const float* v2,
                      float* y) {
  using R = typename V::reg;
  constexpr int W = V::width;
  if (N % W != 0) {
    for (int64_t i = 0; i < N; ++i) {
      const float* src = from + i * N;
      const float sa = wkv7_dot<V>(nk, src, N);
      y[i] = wkv7_row<V, kStream>(N, src, S + i * N, dec, b, k2, r, sa, v2[i]);
    }
    return;
  }
  for (int64_t i0 = 0; i0 < N; i0 += W) {
    R acc[W];
    alignas(64) float sa[W];
    for (int q = 0; q < W; ++q) acc[q] = wkv7_dot_lanes<V>(nk, from + (i0 + q) * N, N);
    V::store(sa, V::reduce_add_columns(acc));
    for (int q = 0; q < W; ++q) {
      const int64_t i = i0 + q;
      acc[q] = wkv7_row_lanes<V, kStream>(N, from + i * N, S + i * N, dec, b, k2, r, sa[q], v2[i]);
    }
    V::store(y + i0, V::reduce_add_columns(acc));
  }
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
        y[o + i] = wkv7_row<V>(N, row, row, w + o, b + o, k + o, r + o, sa, v[o + i]);
      }
    }
  }
}

// wkv7_block (one layer's time mix around the recurrence, per head and token; all fp32 [T, H*N]
// rows, the 8 parameter rows of p as listed in kernel_table.h):
//   a' = sigmoid(a0 + a)      kk = k*k_k / max(|k*k_k|_head, 1e-12)      k' = k*(1 + (a' - 1)*k_a)
//   v' = v + (v_first - v)*sigmoid(v0 + v_gate)   (v' = v without v_first)
//   w' = exp(-0.606531*sigmoid(w0 + w))           recurrence as wkv7 with (w', k', v', -kk, kk*a')
//   y = (group_norm_head(y_wkv; lx_w, lx_b, eps) + sum_head(r*k'*r_k)*v') * g
// scratch holds 6*N floats for each head in [h0, h1).
template <class V>
inline void wkv7_sigmoid_sum(int64_t n, const float* x0, const float* x, float scale, float* out) {
  // out = sigmoid(x0 + x), or exp(scale * sigmoid(x0 + x)) when scale != 1 (the decay: -0.606531).
  using R = typename V::reg;
  using S = typename V::Tail;
  constexpr int W = V::width;
  int64_t j = 0;
  const R one = V::set1(1.0f), zero = V::zero(), sc = V::set1(scale);
  for (; j + W <= n; j += W) {
    const R z = V::add(V::load(x0 + j), V::load(x + j));
    R s = V::div(one, V::add(one, V::exp(V::sub(zero, z))));
    if (scale != 1.0f) s = V::exp(V::mul(sc, s));
    V::store(out + j, s);
  }
  for (; j < n; ++j) {
    float s = 1.0f / (1.0f + S::exp(-(x0[j] + x[j])));
    if (scale != 1.0f) s = S::exp(scale * s);
    out[j] = s;
  }
}

// One head's vectors for one token of wkv7_block, from its rows of k, v, r (and v_first, or
// nullptr) and of the parameters k_k, k_a, r_k, with as = sigmoid(a0 + a) and, with v_first, v2 =
// sigmoid(v0 + v_gate) on entry: kk = k*k_k, nk = -kk/|kk|, b = kk/|kk|*as, k2 = k*(1 + (as -
// 1)*k_a), v2 = v + (v_first - v)*v2 (or v). Returns the bonus's sum(r*k2*r_k). Whole registers,
// then the rest one value at a time.
template <class V>
inline float wkv7_head(int64_t N, const float* k, const float* v, const float* r,
                       const float* vf, const float* k_k, const float* k_a, const float* r_k,
                       const float* as, float* k2, float* v2, float* nk, float* b) {
  using R = typename V::reg;
  constexpr int W = V::width;
  const int64_t full = N - N % W;
  const R one = V::set1(1.0f);
  R ssv = V::zero();
  for (int64_t j = 0; j < full; j += W) {
    const R kv = V::load(k + j), kk = V::mul(kv, V::load(k_k + j));
    ssv = V::fma(kk, kk, ssv);
    V::store(nk + j, kk);
    V::store(k2 + j, V::mul(kv, V::add(one, V::mul(V::sub(V::load(as + j), one), V::load(k_a + j)))));
    const R vv = V::load(v + j);
    V::store(v2 + j, vf != nullptr ? V::add(vv, V::mul(V::sub(V::load(vf + j), vv), V::load(v2 + j)))
                                   : vv);
  }
  float ss = V::reduce_add(ssv);
  for (int64_t j = full; j < N; ++j) {
    const float kk = k[j] * k_k[j];
    ss += kk * kk;
    nk[j] = kk;
    k2[j] = k[j] * (1.0f + (as[j] - 1.0f) * k_a[j]);
    v2[j] = vf != nullptr ? v[j] + (vf[j] - v[j]) * v2[j] : v[j];
  }
  const float inv = 1.0f / std::max(std::sqrt(ss), 1e-12f);
  const R invv = V::set1(inv);
  R bon = V::zero();
  for (int64_t j = 0; j < full; j += W) {
    const R n = V::mul(V::load(nk + j), invv);
    V::store(b + j, V::mul(n, V::load(as + j)));
    V::store(nk + j, V::sub(V::zero(), n));
    bon = V::fma(V::mul(V::load(r + j), V::load(k2 + j)), V::load(r_k + j), bon);
  }
  float bonus = V::reduce_add(bon);
  for (int64_t j = full; j < N; ++j) {
    nk[j] *= inv;
    b[j] = nk[j] * as[j];
    nk[j] = -nk[j];
    bonus += r[j] * k2[j] * r_k[j];
  }
  return bonus;
}

template <class V>
void wkv7_block(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
                const float* state_in, const float* r, const float* w, const float* k,
                const float* v, const float* a, const float* g, const float* v_first,
                const float* v_gate, const float* p, float eps, float* scratch, float* y) {
  const int64_t HN = H * N;
  // The last step's new state is not read again here (and the weights streamed before the next
  // token evict it anyway): written past the caches, it costs no read of the fresh memory first.
  const bool stream = rows_streamable(state, N);
  const float *w0 = p, *a0 = p + HN, *v0 = p + 2 * HN, *k_k = p + 3 * HN, *k_a = p + 4 * HN,
              *r_k = p + 5 * HN, *lx_w = p + 6 * HN, *lx_b = p + 7 * HN;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = state + h * N * N;
    // The first step reads the old state from state_in when given (then state's old contents
    // are never read), later steps the state they wrote.
    const float* S0 = (state_in != nullptr ? state_in : state) + h * N * N;
    float* dec = scratch + (h - h0) * 6 * N;
    float *as = dec + N, *k2 = dec + 2 * N, *v2 = dec + 3 * N, *nk = dec + 4 * N, *b = dec + 5 * N;
    const int64_t c = h * N;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t o = t * HN + c;
      wkv7_sigmoid_sum<V>(N, w0 + c, w + o, -0.606531f, dec);
      wkv7_sigmoid_sum<V>(N, a0 + c, a + o, 1.0f, as);
      if (v_first != nullptr) wkv7_sigmoid_sum<V>(N, v0 + c, v_gate + o, 1.0f, v2);
      const float bonus = wkv7_head<V>(N, k + o, v + o, r + o,
                                       v_first != nullptr ? v_first + o : nullptr, k_k + c,
                                       k_a + c, r_k + c, as, k2, v2, nk, b);
      const float* from = t == 0 ? S0 : S;
      if (stream && t == T - 1)
        wkv7_rows<V, true>(N, from, S, dec, b, k2, nk, r + o, v2, y + o);
      else
        wkv7_rows<V, false>(N, from, S, dec, b, k2, nk, r + o, v2, y + o);
      group_norm_gate(N, y + o, lx_w + c, lx_b + c, eps, g + o, bonus, v2);
    }
  }
  if (stream) V::fence();
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
