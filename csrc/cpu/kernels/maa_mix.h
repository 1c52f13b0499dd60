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
// Sequences (maa_mix): on channels [c0, c1), in chunks of up to kMaaChunk channels. For each
// chunk, mix and row, the kernel streams the chunk's part of every w2 row in order (runs of up
// to 2 KiB), accumulating into buffers that stay in L1; w2's chunk stays in L2 for the next rows.
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

constexpr int64_t kMaaChunk = 512;

template <class V, class W>
void maa_mix(int64_t T, int64_t C, int64_t n, int64_t D, int64_t c0, int64_t c1, const float* xx,
             const float* sx, const float* zt, const W* w2, const float* maa, float* const* outs) {
  using S = typename V::Tail;
  using R = typename V::reg;
  alignas(64) float lo[kMaaChunk];
  alignas(64) float hi[kMaaChunk];
  const int64_t h = (D + 1) / 2;
  for (int64_t a = c0; a < c1; a += kMaaChunk) {
    const int64_t len = c1 - a < kMaaChunk ? c1 - a : kMaaChunk;
    const int64_t full = len - len % V::width;
    for (int64_t i = 0; i < n; ++i) {
      const W* wi = w2 + i * D * C + a;
      const float* mi = maa + i * C + a;
      for (int64_t t = 0; t < T; ++t) {
        const float* z = zt + (t * n + i) * D;
        for (int64_t c = 0; c < len; ++c) lo[c] = hi[c] = 0.0f;
        for (int64_t j = 0; j < D; ++j) {
          float* acc = j < h ? lo : hi;
          const W* row = wi + j * C;
          const R zj = V::set1(z[j]);
          for (int64_t c = 0; c < full; c += V::width)
            V::store(acc + c, V::fma(zj, load_elems<V>(row + c), V::load(acc + c)));
          for (int64_t c = full; c < len; ++c) acc[c] = S::fma(z[j], load_elems<S>(row + c), acc[c]);
        }
        const float* cur = xx + t * C + a;
        const float* prev = (t == 0 ? sx : xx + (t - 1) * C) + a;
        float* o = outs[i] + t * C + a;
        for (int64_t c = 0; c < full; c += V::width) {
          const R xv = V::load(cur + c);
          const R dv = V::sub(V::load(prev + c), xv);
          const R sum = V::add(V::load(lo + c), V::load(hi + c));
          V::store(o + c, V::add(xv, V::mul(dv, V::add(V::load(mi + c), sum))));
        }
        for (int64_t c = full; c < len; ++c)
          o[c] = cur[c] + (prev[c] - cur[c]) * (mi[c] + (lo[c] + hi[c]));
      }
    }
  }
}

// maa_half_sums' software prefetch distance on each of its row streams (from DRAM, with
// 1.5B RWKV-6 shapes, maa_lora_one: bf16 66-67 -> 60-61 us, fp32 98-101 -> 94-97 us a call;
// the hardware prefetchers start afresh on every 4 KiB page of the four rows).
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
