// Vec policy for AVX2 + FMA: 8 floats per register. Include only from isa_avx2.cpp, after its
// `#pragma GCC target`.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

struct VecAvx2 {
  using reg = __m256;
  static constexpr int width = 8;
  using Tail = VecScalar;

  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float a) { return _mm256_set1_ps(a); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg a) { _mm256_storeu_ps(p, a); }
  static void stream(float* p, reg a) { _mm256_stream_ps(p, a); }  // see VecScalar::stream
  static void fence() { _mm_sfence(); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }

  // e^a for a <= 88 (relative error ~2 ulp): a = n*ln2 + r, e^r by a degree-6 polynomial
  // (Cephes expf coefficients), 2^n through the exponent bits; a < -87.3 gives 0.
  static reg exp(reg a) {
    const reg lo = _mm256_set1_ps(-87.33654f);
    const reg underflow = _mm256_cmp_ps(a, lo, _CMP_LT_OQ);
    reg x = _mm256_min_ps(_mm256_max_ps(a, lo), _mm256_set1_ps(88.0f));
    const reg n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    reg p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }

  static reg abs(reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static float reduce_max(reg a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  // See VecScalar::store_i16.
  static void store_i16(int16_t* p, reg a) {
    const __m256i i = _mm256_cvtps_epi32(a);
    const __m128i s = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), s);
  }
  static float reduce_add(reg a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // See VecScalar::load_partial (0 < n < 8): fp32 by a masked load; bf16 through a zeroed copy
  // (AVX2 has no 16-bit masked load).
  static reg load_partial(const float* p, int64_t n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes));
  }
  static reg load_bf16_partial(const uint16_t* p, int64_t n) {
    alignas(16) uint16_t t[8] = {};
    for (int64_t i = 0; i < n; ++i) t[i] = p[i];
    return load_bf16(t);
  }
  // See VecScalar::reduce_add_columns: pairs of registers interleaved and added within 128-bit
  // halves, then quadruples, then the two halves.
  static reg reduce_add_columns(const reg* a) {
    __m256 u[4];
    for (int i = 0; i < 4; ++i)
      u[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                           _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    const __m256 v0 = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0x44), _mm256_shuffle_ps(u[0], u[1], 0xEE));
    const __m256 v1 = _mm256_add_ps(_mm256_shuffle_ps(u[2], u[3], 0x44), _mm256_shuffle_ps(u[2], u[3], 0xEE));
    return _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
  }
  // 8 bytes -> 8 floats.
  static reg load_u8(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // a rounded to bf16 (see VecScalar::store_bf16_round), the same integer steps lane by lane.
  static void store_bf16_round(uint16_t* p, reg a) {
    const __m256i u = _mm256_castps_si256(a);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i v = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
  }
  // The high halves of a (see VecScalar::store_bf16_exact).
  static void store_bf16_exact(uint16_t* p, reg a) {
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(a), 16);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }

  // See VecScalar::Dot16. Each add() puts at most 2 * 2 * 32768 * 255 into an int32 lane, so
  // 2048 elements (32 steps) stay below 2^31.
  struct Dot16 {
    static constexpr int kStep = 64;
    static constexpr int64_t kFlushRows = 2048;
    __m256i a0, a1, wide;  // wide: 4 x int64
    int64_t rest = 0;
    static void pack(int16_t*, int64_t) {}  // x stays as int16
    // Written out: an implicit constructor would not get this file's target pragma (GCC).
    Dot16() : a0(_mm256_setzero_si256()), a1(a0), wide(a0) {}
    static __m256i madd(const int16_t* x, const uint8_t* q) {
      const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), w);
    }
    void add(const int16_t* x, const uint8_t* q) {
      a0 = _mm256_add_epi32(a0, madd(x, q));
      a1 = _mm256_add_epi32(a1, madd(x + 16, q + 16));
      a0 = _mm256_add_epi32(a0, madd(x + 32, q + 32));
      a1 = _mm256_add_epi32(a1, madd(x + 48, q + 48));
    }
    void add_tail(const int16_t* x, const uint8_t* q, int64_t n) {
      for (int64_t i = 0; i < n; ++i) rest += static_cast<int32_t>(x[i]) * q[i];
    }
    void flush() {
      const __m256i lo = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(a0)),
                                          _mm256_cvtepi32_epi64(_mm256_extracti128_si256(a0, 1)));
      const __m256i hi = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(a1)),
                                          _mm256_cvtepi32_epi64(_mm256_extracti128_si256(a1, 1)));
      wide = _mm256_add_epi64(wide, _mm256_add_epi64(lo, hi));
      a0 = a1 = _mm256_setzero_si256();
    }
    int64_t sum() {
      flush();
      alignas(32) int64_t lanes[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), wide);
      return lanes[0] + lanes[1] + lanes[2] + lanes[3] + rest;
    }
  };
};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
