// Vec policy for AVX-512 (F, BW, VL, DQ): 16 floats per register. Include only from
// isa_avx512.cpp, after its `#pragma GCC target`.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

struct VecAvx512 {
  using reg = __m512;
  static constexpr int width = 16;
  using Tail = VecScalar;

  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float a) { return _mm512_set1_ps(a); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg a) { _mm512_storeu_ps(p, a); }
  static void stream(float* p, reg a) { _mm512_stream_ps(p, a); }  // see VecScalar::stream
  static void fence() { _mm_sfence(); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }

  // e^a as in VecAvx2::exp, with 2^n applied by scalef.
  static reg exp(reg a) {
    const reg lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 underflow = _mm512_cmp_ps_mask(a, lo, _CMP_LT_OQ);
    reg x = _mm512_min_ps(_mm512_max_ps(a, lo), _mm512_set1_ps(88.0f));
    const reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    reg p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
  }

  static reg abs(reg a) { return _mm512_abs_ps(a); }
  static float reduce_add(reg a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(reg a) { return _mm512_reduce_max_ps(a); }
  // See VecScalar::store_i16.
  static void store_i16(int16_t* p, reg a) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(a)));
  }
  // See VecScalar::load_partial (0 < n < 16): masked loads.
  static reg load_partial(const float* p, int64_t n) {
    return _mm512_maskz_loadu_ps(_cvtu32_mask16((1u << n) - 1), p);
  }
  static reg load_bf16_partial(const uint16_t* p, int64_t n) {
    const __m256i h = _mm256_maskz_loadu_epi16(_cvtu32_mask16((1u << n) - 1), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // See VecScalar::reduce_add_columns: pairs of registers interleaved and added within 128-bit
  // lanes, then quadruples (each 128-bit lane then holds 4 registers' partial sums), then the
  // 128-bit lanes in pairs, twice.
  static reg reduce_add_columns(const reg* a) {
    __m512 u[8], v[4];
    for (int i = 0; i < 8; ++i)
      u[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                           _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i)
      v[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x88), _mm512_shuffle_f32x4(v[2], v[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
  }
  // 16 bytes -> 16 floats.
  static reg load_u8(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // a rounded to bf16 (see VecScalar::store_bf16_round), the same integer steps lane by lane
  // (not vcvtneps2bf16, which flushes subnormals and keeps NaN payloads).
  static void store_bf16_round(uint16_t* p, reg a) {
    const __m512i u = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    const __m512i v = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  // The high halves of a (see VecScalar::store_bf16_exact).
  static void store_bf16_exact(uint16_t* p, reg a) {
    const __m512i hi = _mm512_srli_epi32(_mm512_castps_si512(a), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(hi));
  }

  // See VecScalar::Dot16. Each add() puts at most 2 * 32768 * 255 into an int32 lane, so 2048
  // elements (32 steps) stay far below 2^31. The tail is a masked load (no byte past q + n is
  // read); x must hold kStep readable values there (mm8_one_i16 pads it with zeros).
  struct Dot16 {
    static constexpr int kStep = 64;
    static constexpr int64_t kFlushRows = 2048;
    __m512i a0, a1, wide;  // wide: 8 x int64
    // Written out: an implicit constructor would not get this file's target pragma (GCC).
    Dot16() : a0(_mm512_setzero_si512()), a1(a0), wide(a0) {}
    static void pack(int16_t*, int64_t) {}  // x stays as int16
    void add_bytes(const int16_t* x, __m512i w) {
      a0 = _mm512_add_epi32(a0, _mm512_madd_epi16(_mm512_loadu_si512(x),
                                                   _mm512_cvtepu8_epi16(_mm512_castsi512_si256(w))));
      a1 = _mm512_add_epi32(a1, _mm512_madd_epi16(_mm512_loadu_si512(x + 32),
                                                   _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(w, 1))));
    }
    void add(const int16_t* x, const uint8_t* q) { add_bytes(x, _mm512_loadu_si512(q)); }
    void add_tail(const int16_t* x, const uint8_t* q, int64_t n) {
      const __mmask64 m = n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
      add_bytes(x, _mm512_maskz_loadu_epi8(m, q));
    }
    // a's 16 int32 lanes summed in pairs, as 8 x int64 (exact).
    static __m512i widened(__m512i a) {
      return _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(a)),
                              _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(a, 1)));
    }
    void flush() {
      wide = _mm512_add_epi64(wide, _mm512_add_epi64(widened(a0), widened(a1)));
      a0 = a1 = _mm512_setzero_si512();
    }
    int64_t sum() {
      flush();
      return _mm512_reduce_add_epi64(wide);
    }
  };
};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
