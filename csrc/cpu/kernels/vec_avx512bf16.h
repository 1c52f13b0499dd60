// Vec policy for AVX-512 with VNNI and BF16: VecAvx512Vnni plus linear_one's bf16 x bf16 dot
// (vdpbf16ps). Include only from isa_avx512bf16.cpp, after its `#pragma GCC target`.
//
// With bf16 weights the activation is bf16 too (linear_one takes both in one dtype), so the
// kernel reads x as it is: per 32 weights one load of w, one of x and one vdpbf16ps, which adds
// the two products of each pair of bf16 values to one fp32 lane (each product exact in fp32,
// each addition rounded to nearest even, as an FMA would). avx512 widens each weight to fp32 and
// multiplies in fp32, three times the instructions, which bounds `cpu bf16` decode where
// memory is fast. The sums differ from avx512's in their order (fp32-accurate
// either way), and vdpbf16ps treats subnormal inputs and results as zero.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/kernels/streams.h"
#include "cpu/kernels/vec_avx512vnni.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

struct VecAvx512Bf16 : VecAvx512Vnni {
  // y[m + b] = x . w[:, m + b] for b < B, x and w bf16, N elements per column (column m at
  // w + m*N). Each column sums in two fp32 accumulators, 32 values each per step of 64 (one
  // would bound the loop by the instruction's latency; four, or steps of 128, read memory
  // slower), then a last block of 32 into the first and the tail, by masked loads
  // (no element past N is read), into the next; then the two added: the same order for every B,
  // so the read orders give the same bits. The B columns are m, m + stride, ...; kAhead > 0: a
  // software prefetch of both lines of each step that many bytes ahead on each column stream.
  template <int B, int64_t kAhead = 0>
  static void bf16_columns(int64_t N, int64_t m, int64_t stride, const uint16_t* x,
                           const uint16_t* w, float* y) {
    const uint16_t* col[B];
    __m512 acc[B][2];
    for (int b = 0; b < B; ++b) {
      col[b] = w + (m + b * stride) * N;
      acc[b][0] = acc[b][1] = _mm512_setzero_ps();
    }
    const auto add = [&](int k, __m512bh xv, int64_t n) {
      for (int b = 0; b < B; ++b)
        acc[b][k] = _mm512_dpbf16_ps(acc[b][k], xv, (__m512bh)_mm512_loadu_si512(col[b] + n));
    };
    int64_t n = 0;
    for (; n + 64 <= N; n += 64) {
      if (kAhead > 0) {  // a step is 128 bytes of each column: its two lines
        for (int b = 0; b < B; ++b) {
          const char* at = reinterpret_cast<const char*>(col[b] + n) + kAhead;
          __builtin_prefetch(at);
          __builtin_prefetch(at + 64);
        }
      }
      add(0, (__m512bh)_mm512_loadu_si512(x + n), n);
      add(1, (__m512bh)_mm512_loadu_si512(x + n + 32), n + 32);
    }
    int k = 0;
    if (n + 32 <= N) {
      add(0, (__m512bh)_mm512_loadu_si512(x + n), n);
      n += 32;
      k = 1;
    }
    if (n < N) {
      const __mmask32 mask = _cvtu32_mask32((1u << (N - n)) - 1);
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + n);
      for (int b = 0; b < B; ++b)
        acc[b][k] = _mm512_dpbf16_ps(acc[b][k], xv,
                                     (__m512bh)_mm512_maskz_loadu_epi16(mask, col[b] + n));
    }
    for (int b = 0; b < B; ++b)
      y[m + b * stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]));
  }

  // linear_rows' block with bf16 rows of x (row r at x + (t + r)*ldx) and bf16 columns: rows
  // [t, t + R) by columns [m, m + C), 32 values a step with one vdpbf16ps per row and column (the
  // weights loaded once for the R rows), the last N % 32 by masked loads; y[(t + r)*ldy + m + c]
  // (=, or += with accumulate).
  template <int R, int C>
  static void bf16_rows_block(int64_t N, int64_t t, int64_t m, const uint16_t* x, int64_t ldx,
                              const uint16_t* w, float* y, int64_t ldy, bool accumulate) {
    const uint16_t* col[C];
    const uint16_t* row[R];
    __m512 acc[R][C];
    for (int c = 0; c < C; ++c) col[c] = w + (m + c) * N;
    for (int r = 0; r < R; ++r) {
      row[r] = x + (t + r) * ldx;
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    int64_t n = 0;
    for (; n + 32 <= N; n += 32) {
      __m512bh wv[C];
      for (int c = 0; c < C; ++c) {
        __builtin_prefetch(reinterpret_cast<const char*>(col[c] + n) + kRowsAhead);  // streams.h
        wv[c] = (__m512bh)_mm512_loadu_si512(col[c] + n);
      }
      for (int r = 0; r < R; ++r) {
        __m512i xv = _mm512_loadu_si512(row[r] + n);
        if constexpr (C > 1) asm("" : "+v"(xv));  // one load of x for all columns (rows_block)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv, wv[c]);
      }
    }
    if (n < N) {
      const __mmask32 mask = _cvtu32_mask32((1u << (N - n)) - 1);
      __m512bh wv[C];
      for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, col[c] + n);
      for (int r = 0; r < R; ++r) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, row[r] + n);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        const float dot = _mm512_reduce_add_ps(acc[r][c]);
        float* out = y + (t + r) * ldy + m + c;
        *out = accumulate ? *out + dot : dot;
      }
    }
  }

  // A short column's dot with bf16 x (linear.h, ShortDot): 32 values a step, summed in one
  // register; the last N % 32 by masked loads.
  struct Bf16ShortDot {
    using X = uint16_t;
    using T = uint16_t;
    static constexpr int kStep = 32;
    static __m512 step(__m512 a, const uint16_t* x, const uint16_t* c) {
      return _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(x), (__m512bh)_mm512_loadu_si512(c));
    }
    static __m512 tail(__m512 a, const uint16_t* x, const uint16_t* c, int64_t n) {
      const __mmask32 mask = _cvtu32_mask32((1u << n) - 1);
      return _mm512_dpbf16_ps(a, (__m512bh)_mm512_maskz_loadu_epi16(mask, x),
                              (__m512bh)_mm512_maskz_loadu_epi16(mask, c));
    }
  };
};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
