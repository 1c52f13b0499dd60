// Vec policy of width 1: plain floats. The scalar ISA uses it for everything; the SIMD policies
// use it (as their `Tail`) for the remainder that does not fill a register.
// Kernel headers live in namespace rwkv::cpu::RWKV_ISA, which the including isa_<isa>.cpp
// defines, so copies compiled for different instruction sets never share a symbol.
#pragma once

#include <cstdint>

#ifndef RWKV_ISA
#error "define RWKV_ISA (the instruction-set namespace) before including a kernel header"
#endif

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Whether a matrix state [.., N, N] at `state` can be written with V::stream row by row: every row
// starts on a 64-byte boundary (any ISA's register size) and holds whole registers.
inline bool rows_streamable(const float* state, int64_t N) {
  return reinterpret_cast<std::uintptr_t>(state) % 64 == 0 && N % 16 == 0;
}

struct VecScalar {
  using reg = float;
  static constexpr int width = 1;
  using Tail = VecScalar;

  static reg zero() { return 0.0f; }
  static reg set1(float a) { return a; }
  static reg load(const float* p) { return *p; }
  static void store(float* p, reg a) { *p = a; }
  // A store that bypasses the caches where the ISA has one (p aligned to the register size), for
  // results not read again soon; fence() orders such stores before later ones (call it before
  // the data is handed on). Here: a plain store, and nothing to order.
  static void stream(float* p, reg a) { *p = a; }
  static void fence() {}
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg max(reg a, reg b) { return a > b ? a : b; }
  // a * b + c
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg exp(reg a) { return __builtin_expf(a); }
  static reg abs(reg a) { return __builtin_fabsf(a); }
  static float reduce_add(reg a) { return a; }
  // The first n < width elements, the other lanes zero; never reads past them (linear.h's short
  // columns; with width 1 there is no such n, so this is never called).
  static reg load_partial(const float* p, int64_t n) { return n > 0 ? *p : 0.0f; }
  static reg load_bf16_partial(const uint16_t* p, int64_t n) { return n > 0 ? load_bf16(p) : 0.0f; }
  // width registers -> one register whose lane b is the sum of a[b]'s lanes.
  static reg reduce_add_columns(const reg* a) { return a[0]; }
  static float reduce_max(reg a) { return a; }
  // a rounded in the current rounding mode (nearest-even unless changed), saturated to int16, as
  // the SIMD conversions do.
  static void store_i16(int16_t* p, reg a) {
    const long r = __builtin_lrintf(a);
    *p = static_cast<int16_t>(r > 32767 ? 32767 : (r < -32768 ? -32768 : r));
  }
  static reg load_u8(const uint8_t* p) { return static_cast<float>(*p); }
  // bf16 is the high half of an fp32.
  static reg load_bf16(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
  }
  // The high half of a; exact for values with at most 8 significant bits (small integers).
  static void store_bf16_exact(uint16_t* p, reg a) {
    uint32_t bits;
    __builtin_memcpy(&bits, &a, sizeof bits);
    *p = static_cast<uint16_t>(bits >> 16);
  }
  // a rounded to bf16 as torch's c10::BFloat16(a) does: to nearest even (a carry past the largest
  // finite value gives inf), every NaN as 0x7FC0, subnormals kept (no flush to zero).
  static void store_bf16_round(uint16_t* p, reg a) {
    uint32_t u;
    __builtin_memcpy(&u, &a, sizeof u);
    *p = (u & 0x7FFFFFFFu) > 0x7F800000u
             ? uint16_t{0x7FC0}
             : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }

  // Exact dot products of int16 x with uint8 q (mm8_one_i16): add() takes kStep elements, whose
  // partial sums must be moved to 64 bits by flush() at least every kFlushRows elements (a
  // multiple of kStep).
  struct Dot16 {
    static constexpr int kStep = 64;
    static constexpr int64_t kFlushRows = 2048;
    int64_t total = 0;
    // x stays as int16 (VecAvx512Vnni::Dot16 repacks it).
    static void pack(int16_t*, int64_t) {}
    void add(const int16_t* x, const uint8_t* q) { add_tail(x, q, kStep); }
    void add_tail(const int16_t* x, const uint8_t* q, int64_t n) {
      int32_t s = 0;  // |s| <= 64 * 32768 * 255 < 2^31
      for (int64_t i = 0; i < n; ++i) s += static_cast<int32_t>(x[i]) * q[i];
      total += s;
    }
    void flush() {}
    int64_t sum() const { return total; }
  };
};

// One register of V from fp32 elements, or from bf16 ones widened (exact): for kernels that
// read weights of either type.
template <class V>
inline typename V::reg load_elems(const float* p) { return V::load(p); }
template <class V>
inline typename V::reg load_elems(const uint16_t* p) { return V::load_bf16(p); }
// The first n < V::width elements (the rest of the register zero), never reading past them.
template <class V>
inline typename V::reg load_elems_partial(const float* p, int64_t n) { return V::load_partial(p, n); }
template <class V>
inline typename V::reg load_elems_partial(const uint16_t* p, int64_t n) {
  return V::load_bf16_partial(p, n);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
