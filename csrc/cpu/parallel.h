// Splitting a kernel's independent units (output columns, channels) between threads, for the
// CPU glue: blocks of `block` units, so the kernels' unit groups stay whole, and at least ~64k
// multiply-adds per task (`work_per_unit` of them per unit), so small ops stay on one thread.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace rwkv {
namespace cpu {

// Calls body(u0, u1) on sub-ranges of [0, n) whose bounds are multiples of `block` (or n).
template <class F>
void for_blocks(int64_t n, int64_t block, int64_t work_per_unit, const F& body) {
  const int64_t blocks = (n + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work_per_unit * block));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    body(b0 * block, std::min(n, b1 * block));
  });
}

}  // namespace cpu
}  // namespace rwkv
