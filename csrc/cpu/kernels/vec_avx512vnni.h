// Vec policy for AVX-512 with VNNI: VecAvx512 with a Dot16 built on vpdpbusd (four byte products
// summed into each int32 lane per instruction). Include only from isa_avx512vnni.cpp, after its
// `#pragma GCC target`.
//
// vpdpbusd multiplies unsigned by signed bytes; q's bytes are the unsigned side, so the int16
// activation is split into two signed bytes: x = 256*h + l with l = ((x + 128) & 255) - 128 and
// h = (x + 128) >> 8 (arithmetic), both in [-128, 127] since |x| <= kXqMax = 127*256 + 127
// (kernels/mm8.h). Then sum(q*x) = 256*sum(q*h) + sum(q*l): two exact integer dots per 64 bytes
// of q where VecAvx512's Dot16 widens q to int16 first (2 widenings, 2 vpmaddwd, 2 adds): the
// same integer, so the same result to the bit.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/kernels/vec_avx512.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

struct VecAvx512Vnni : VecAvx512 {
  // See VecScalar::Dot16. x's layout (made by pack()): per block of 64 values, 64 bytes h then
  // 64 bytes l (128 bytes: the room of the 64 int16 values they replace, so x + n still
  // addresses value n's block). A step is two blocks, each with its own two accumulators
  // (vpdpbusd's latency would otherwise bound the loop). Every product q*h and q*l is at most
  // 255 * 128 in size, so over kFlushRows = 65536 rows |sum q*h| and |sum q*l| stay below
  // 65536 * 255 * 128 < 2^31, in any lane and in any sum of lanes: each is summed exactly in
  // int32, one horizontal sum per column, and only then combined as 256*h + l in 64 bits.
  // (Widening every lane to int64 every 2048 rows was ~8% of the main thread's samples while
  // decoding.) The tail is read with masked loads of q (bytes past N read as zero and add
  // nothing to either sum) and touches the second block only when it holds values: x is padded
  // to a multiple of 64, not of kStep (zeros split into h = l = 0).
  struct Dot16 {
    static constexpr int kStep = 128;
    static constexpr int64_t kFlushRows = 65536;
    __m512i acc[2][2];  // [block of the step][h, l]
    int64_t total = 0;
    // Written out: an implicit constructor would not get this file's target pragma (GCC).
    Dot16() {
      for (auto& a : acc) a[0] = a[1] = _mm512_setzero_si512();
    }

    // Rewrites xq [n_pad] int16 (n_pad a multiple of 64, |xq| <= kXqMax) in place into the
    // layout above.
    static void pack(int16_t* xq, int64_t n_pad) {
      const __m512i bias = _mm512_set1_epi16(128), flip = _mm512_set1_epi16(0x80);
      for (int64_t n = 0; n < n_pad; n += 64) {
        // t = x + 128 (no overflow: |x| <= kXqMax); h = t >> 8; l's byte = the low byte of t
        // xor 0x80, which read as a signed byte is (t & 255) - 128.
        const __m512i a = _mm512_add_epi16(_mm512_loadu_si512(xq + n), bias);
        const __m512i b = _mm512_add_epi16(_mm512_loadu_si512(xq + n + 32), bias);
        const __m512i hi = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(a, 8))),
            _mm512_cvtepi16_epi8(_mm512_srai_epi16(b, 8)), 1);
        const __m512i lo = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_xor_si512(a, flip))),
            _mm512_cvtepi16_epi8(_mm512_xor_si512(b, flip)), 1);
        auto* dst = reinterpret_cast<int8_t*>(xq + n);
        _mm512_storeu_si512(dst, hi);
        _mm512_storeu_si512(dst + 64, lo);
      }
    }
    // One block: 64 values of x (at x, in pack()'s layout) with 64 bytes w of q.
    static void add_block(__m512i* a, const int16_t* x, __m512i w) {
      const auto* b = reinterpret_cast<const int8_t*>(x);
      a[0] = _mm512_dpbusd_epi32(a[0], w, _mm512_loadu_si512(b));
      a[1] = _mm512_dpbusd_epi32(a[1], w, _mm512_loadu_si512(b + 64));
    }
    static __mmask64 first(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }
    void add(const int16_t* x, const uint8_t* q) {
      add_block(acc[0], x, _mm512_loadu_si512(q));
      add_block(acc[1], x + 64, _mm512_loadu_si512(q + 64));
    }
    void add_tail(const int16_t* x, const uint8_t* q, int64_t n) {
      add_block(acc[0], x, _mm512_maskz_loadu_epi8(first(n), q));
      if (n > 64) add_block(acc[1], x + 64, _mm512_maskz_loadu_epi8(first(n - 64), q + 64));
    }
    void flush() {
      const int64_t h = _mm512_reduce_add_epi32(_mm512_add_epi32(acc[0][0], acc[1][0]));
      const int64_t l = _mm512_reduce_add_epi32(_mm512_add_epi32(acc[0][1], acc[1][1]));
      total += 256 * h + l;
      for (auto& a : acc) a[0] = a[1] = _mm512_setzero_si512();
    }
    int64_t sum() {
      flush();
      return total;
    }
  };
};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
