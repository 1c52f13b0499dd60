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

struct VecScalar {
  using reg = float;
  static constexpr int width = 1;
  using Tail = VecScalar;

  static reg zero() { return 0.0f; }
  static reg set1(float a) { return a; }
  static reg load(const float* p) { return *p; }
  static void store(float* p, reg a) { *p = a; }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg max(reg a, reg b) { return a > b ? a : b; }
  // a * b + c
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg exp(reg a) { return __builtin_expf(a); }
  static float reduce_add(reg a) { return a; }
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
};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
