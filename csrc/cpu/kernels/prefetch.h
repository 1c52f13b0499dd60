// The software prefetch of the multi-column matrix-vector loops (linear.h's linear_columns,
// VecAvx512Bf16::bf16_columns): each of B column streams prefetches every 64-byte line
// kLinearAhead bytes ahead, and within the last kLinearAhead bytes of its column the same place
// in the column B further on (the stream that will read it; the bytes right after its own column
// belong to the stream beside it). mm8.h's int8 loop does the same with its own distance.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"  // (which checks that RWKV_ISA is defined)

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

constexpr int64_t kLinearAhead = 2048;

// The offset in bytes, from byte `at` of a column of `bytes` bytes, that a stream of a B-column
// loop prefetches.
template <int B>
inline int64_t wrapped_ahead(int64_t at, int64_t bytes) {
  return at + kLinearAhead >= bytes ? kLinearAhead + (B - 1) * bytes : kLinearAhead;
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
