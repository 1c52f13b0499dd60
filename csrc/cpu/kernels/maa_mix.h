// maa_mix: RWKV-6's data-dependent token shift, after its first low-rank product. For xx [T, C]
// (the layer norm), sx [C] (the shift state), zt [T, n*D] (tanh of that product), w2 [n, D, C]
// and maa [n, C]:
//   d[t] = prev[t] - xx[t], prev[t] = sx for t = 0, else xx[t - 1]
//   out[i, t] = xx[t] + d[t] * (maa[i] + sum_j zt[t, i*D + j] * w2[i, j])
// w2 is fp32 or bf16 (W = float or uint16_t); everything else fp32. The kernels write out[i]
// [T, C] through outs[i] (n pointers: one [n, T, C] tensor or n tensors).
//
// The sum over j is taken in two halves, j < h and j >= h with h = ceil(D / 2), each an fma
// chain in j's order from zero, then added: (maa[i] + (lo + hi)). Both paths below do exactly
// that, so a sequence's rows equal one-row calls bit for bit, whatever the thread count.
//
// Sequences (maa_mix): on channels [c0, c1), in groups of two registers of channels (then one
// register, then single channels: a channel is summed in a register exactly when the one-token
// path sums it in one, so a row's bits do not depend on the path). For each group and mix, the
// kernel copies the mix's D rows of w2 for the group into a small fp32 block, which stays in L1
// for all the rows, and takes kMaaTokens rows at a time: each load of w2 feeds that many rows'
// fma chains, held in registers (a row at a time over chunks of channels would load and store
// its sums at every step, about three times slower).
//
// One token (maa_half_sums, then maa_finish): w2 seen as [n*D, C] is read by half-mixes (the
// rows of one half of one mix), so each thread reads one run of whole consecutive rows. Split by
// channels, each thread would read n*D short runs (1.3 MB in 160 runs of 4 KiB per layer at
// 1.5B), every one a fresh ramp-up for the hardware prefetcher: twice as slow from DRAM.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Rows per pass of the sequence kernel.
constexpr int64_t kMaaTokens = 4;

// acc[k][v] = the fma chain, from zero, of z_k[j] * w2 row j over rows [j0, j1), for K rows
// (z_k = z + k * zstride) and NV registers of channels at w (w2's row j at w + j * ws).
template <class V, int K, int NV, class W>
inline void maa_chains(int64_t ws, int64_t j0, int64_t j1, const float* z, int64_t zstride,
                       const W* w, typename V::reg (&acc)[K][NV]) {
  using R = typename V::reg;
  for (int k = 0; k < K; ++k)
    for (int v = 0; v < NV; ++v) acc[k][v] = V::zero();
  for (int64_t j = j0; j < j1; ++j) {
    R wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = load_elems<V>(w + j * ws + v * V::width);
    for (int k = 0; k < K; ++k) {
      const R zk = V::set1(z[k * zstride + j]);
      for (int v = 0; v < NV; ++v) acc[k][v] = V::fma(zk, wv[v], acc[k][v]);
    }
  }
}

// Rows [t, t + K) of mix i on NV registers of channels at c: out = xx + d * (maa + (lo + hi)),
// with mix i's D rows of w2 for these channels at w, ws apart.
template <class V, int K, int NV, class W>
inline void maa_mix_rows(int64_t C, int64_t n, int64_t D, int64_t i, int64_t t, int64_t c,
                         const float* xx, const float* sx, const float* zt, const W* w,
                         int64_t ws, const float* maa, float* out) {
  using R = typename V::reg;
  const int64_t h = (D + 1) / 2;
  const float* z = zt + (t * n + i) * D;
  R lo[K][NV], hi[K][NV];
  maa_chains<V, K, NV>(ws, 0, h, z, n * D, w, lo);
  maa_chains<V, K, NV>(ws, h, D, z, n * D, w, hi);
  const float* mi = maa + i * C + c;
  for (int k = 0; k < K; ++k) {
    const float* cur = xx + (t + k) * C + c;
    const float* prev = (t + k == 0 ? sx : xx + (t + k - 1) * C) + c;
    float* o = out + (t + k) * C + c;
    for (int v = 0; v < NV; ++v) {
      const int64_t e = v * V::width;
      const R xv = V::load(cur + e);
      const R dv = V::sub(V::load(prev + e), xv);
      const R sum = V::add(lo[k][v], hi[k][v]);
      V::store(o + e, V::add(xv, V::mul(dv, V::add(V::load(mi + e), sum))));
    }
  }
}

// Every row of mix i on NV registers of channels at c, kMaaTokens at a time, from the mix's rows
// of w2 for these channels at w, ws apart. (A function, not a lambda in maa_mix_column: a
// lambda's code would be a symbol outside this ISA's namespace, tests/ops/test_isa_symbols.py.)
template <class V, int NV, class W>
inline void maa_mix_all_rows(int64_t T, int64_t C, int64_t n, int64_t D, int64_t i, int64_t c,
                             const float* xx, const float* sx, const float* zt, const W* w,
                             int64_t ws, const float* maa, float* out) {
  int64_t t = 0;
  for (; t + kMaaTokens <= T; t += kMaaTokens)
    maa_mix_rows<V, kMaaTokens, NV>(C, n, D, i, t, c, xx, sx, zt, w, ws, maa, out);
  for (; t < T; ++t) maa_mix_rows<V, 1, NV>(C, n, D, i, t, c, xx, sx, zt, w, ws, maa, out);
}

// The most rows of w2 a mix may have for maa_mix_column to copy its columns (else they are read
// where they are).
constexpr int64_t kMaaPackRows = 128;

// Every row of mix i on NV registers of channels at c. Mix i's rows of w2 for these channels
// are first copied next to each other, in fp32: in place they lie C elements apart, and with C
// a multiple of 1024 they all fall in the same set of the L1 cache, which holds 8 or 12 of the
// D rows, so each would come from L2 again for every kMaaTokens rows.
template <class V, int NV, class W>
inline void maa_mix_column(int64_t T, int64_t C, int64_t n, int64_t D, int64_t i, int64_t c,
                           const float* xx, const float* sx, const float* zt, const W* w2,
                           const float* maa, float* out) {
  using S = typename V::Tail;
  constexpr int64_t kRow = NV * V::width;
  const W* w = w2 + i * D * C + c;
  if (D > kMaaPackRows) {
    maa_mix_all_rows<V, NV>(T, C, n, D, i, c, xx, sx, zt, w, C, maa, out);
    return;
  }
  // In fp32 (bf16 widens exactly), so the loops read plain floats.
  alignas(64) float packed[kMaaPackRows * kRow];
  for (int64_t j = 0; j < D; ++j)
    for (int64_t e = 0; e < kRow; ++e) packed[j * kRow + e] = load_elems<S>(w + j * C + e);
  maa_mix_all_rows<V, NV>(T, C, n, D, i, c, xx, sx, zt, static_cast<const float*>(packed), kRow,
                          maa, out);
}

template <class V, class W>
void maa_mix(int64_t T, int64_t C, int64_t n, int64_t D, int64_t c0, int64_t c1, const float* xx,
             const float* sx, const float* zt, const W* w2, const float* maa, float* const* outs) {
  using S = typename V::Tail;
  const int64_t full = C - C % V::width;  // channels below it are summed in registers
  const int64_t vend = c1 < full ? c1 : full;
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = c0;
    for (; c + 2 * V::width <= vend; c += 2 * V::width)
      maa_mix_column<V, 2>(T, C, n, D, i, c, xx, sx, zt, w2, maa, outs[i]);
    for (; c + V::width <= vend; c += V::width)
      maa_mix_column<V, 1>(T, C, n, D, i, c, xx, sx, zt, w2, maa, outs[i]);
    // The channels past the last whole register (fewer than V::width), a row at a time, in the
    // loops of maa_half_sums' and maa_finish's tails: the compiler contracts a*b + c into an fma
    // in those, but may leave a chain carried in a register from one j to the next uncontracted
    // (GCC's tuning against fma chains), and a row's bits would then depend on the path.
    if (c >= c1) continue;
    const int64_t h = (D + 1) / 2, tail = c1 - c;
    float lo[V::width], hi[V::width];
    for (int64_t t = 0; t < T; ++t) {
      const float* z = zt + (t * n + i) * D;
      for (int64_t e = 0; e < tail; ++e) lo[e] = hi[e] = 0.0f;
      for (int64_t j = 0; j < D; ++j) {
        float* acc = j < h ? lo : hi;
        const W* row = w2 + (i * D + j) * C + c;
        for (int64_t e = 0; e < tail; ++e) acc[e] = S::fma(z[j], load_elems<S>(row + e), acc[e]);
      }
      const float* cur = xx + t * C + c;
      const float* prev = (t == 0 ? sx : xx + (t - 1) * C) + c;
      const float* mi = maa + i * C + c;
      float* o = outs[i] + t * C + c;
      for (int64_t e = 0; e < tail; ++e)
        o[e] = cur[e] + (prev[e] - cur[e]) * (mi[e] + (lo[e] + hi[e]));
    }
  }
}

// maa_half_sums' software prefetch distance on each of its row streams: the hardware
// prefetchers start afresh on every 4 KiB page of the four rows, so a prefetch ahead covers
// each page's start.
constexpr int64_t kAheadBytes = 2048;

// One token: for half-mixes [u0, u1) (u = 2i + half), acc[u, :] = the fma chain, from zero, of
// zt[i*D + j] * w2[i, j, :] over the half's rows j ([0, h) or [h, D)); acc [2n, C]. Four rows per
// pass over the unit's acc row, so it is loaded and stored once per four rows read.
template <class V, class W>
void maa_half_sums(int64_t C, int64_t D, int64_t u0, int64_t u1, const float* zt, const W* w2,
                   float* acc) {
  using S = typename V::Tail;
  using R = typename V::reg;
  const int64_t h = (D + 1) / 2;
  const int64_t full = C - C % V::width;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t i = u / 2, j0 = u % 2 == 0 ? 0 : h, j1 = u % 2 == 0 ? h : D;
    float* a = acc + u * C;
    for (int64_t c = 0; c < C; ++c) a[c] = 0.0f;
    for (int64_t j = j0; j < j1;) {
      const W* w = w2 + (i * D + j) * C;
      const float* z = zt + i * D + j;
      if (j + 4 <= j1) {
        const R z0 = V::set1(z[0]), z1 = V::set1(z[1]), z2 = V::set1(z[2]), z3 = V::set1(z[3]);
        for (int64_t c = 0; c < full; c += V::width) {
          if ((c * static_cast<int64_t>(sizeof(W))) % 64 == 0) {
            // Each of the 4 row streams asks for its line kAheadBytes on, past a row's end in
            // the row it reads next (4 rows on: the next pass).
            const int64_t f = c + kAheadBytes / static_cast<int64_t>(sizeof(W));
            const W* at = f < C ? w + f : w + 4 * C + (f - C);
            for (int q = 0; q < 4; ++q) __builtin_prefetch(at + q * C);
          }
          R s = V::fma(z0, load_elems<V>(w + c), V::load(a + c));
          s = V::fma(z1, load_elems<V>(w + C + c), s);
          s = V::fma(z2, load_elems<V>(w + 2 * C + c), s);
          V::store(a + c, V::fma(z3, load_elems<V>(w + 3 * C + c), s));
        }
        for (int64_t c = full; c < C; ++c) {
          float s = S::fma(z[0], load_elems<S>(w + c), a[c]);
          s = S::fma(z[1], load_elems<S>(w + C + c), s);
          s = S::fma(z[2], load_elems<S>(w + 2 * C + c), s);
          a[c] = S::fma(z[3], load_elems<S>(w + 3 * C + c), s);
        }
        j += 4;
      } else {
        const R zj = V::set1(z[0]);
        for (int64_t c = 0; c < full; c += V::width)
          V::store(a + c, V::fma(zj, load_elems<V>(w + c), V::load(a + c)));
        for (int64_t c = full; c < C; ++c) a[c] = S::fma(z[0], load_elems<S>(w + c), a[c]);
        j += 1;
      }
    }
  }
}

// One token, after maa_half_sums: out[i] = xx + (sx - xx) * (maa[i] + (acc[2i] + acc[2i + 1]))
// on channels [c0, c1); out[i] [C] at outs[i].
template <class V>
void maa_finish(int64_t C, int64_t n, int64_t c0, int64_t c1, const float* xx, const float* sx,
                const float* acc, const float* maa, float* const* outs) {
  using R = typename V::reg;
  const int64_t full = c0 + (c1 - c0) - (c1 - c0) % V::width;
  for (int64_t i = 0; i < n; ++i) {
    const float *lo = acc + 2 * i * C, *hi = lo + C, *mi = maa + i * C;
    float* o = outs[i];
    for (int64_t c = c0; c < full; c += V::width) {
      const R xv = V::load(xx + c);
      const R dv = V::sub(V::load(sx + c), xv);
      const R sum = V::add(V::load(lo + c), V::load(hi + c));
      V::store(o + c, V::add(xv, V::mul(dv, V::add(V::load(mi + c), sum))));
    }
    for (int64_t c = full; c < c1; ++c) o[c] = xx[c] + (sx[c] - xx[c]) * (mi[c] + (lo[c] + hi[c]));
  }
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
