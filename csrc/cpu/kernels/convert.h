// fp32 -> bf16 rounding of the one-token ops' results (cpu/float_io.h's narrowed_values), a
// register at a time: c10::BFloat16's conversion one value at a time was ~0.2 ns a value, a
// third of a bf16 ln_mix_split's time with its seven 2048-value results.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// d[i] = y[i] rounded to bf16 (VecScalar::store_bf16_round's rule) for i < n.
template <class V>
void bf16_round(int64_t n, const float* y, uint16_t* d) {
  int64_t i = 0;
  for (; i + V::width <= n; i += V::width) V::store_bf16_round(d + i, V::load(y + i));
  for (; i < n; ++i) V::Tail::store_bf16_round(d + i, y[i]);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
