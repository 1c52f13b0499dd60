// Helpers shared by the CUDA torch glue (csrc/cuda/*_op.cpp); the .cu kernels never include it.
#pragma once

#include <ATen/core/Tensor.h>

#include "cuda/kernels.h"

namespace rwkv {
namespace cuda {

// The kernels' activation type for x's dtype (float32, float16 or bfloat16; checked before).
inline Act act_of(const at::Tensor& x) {
  const auto dt = x.scalar_type();
  return dt == at::kFloat ? Act::f32 : dt == at::kHalf ? Act::f16 : Act::bf16;
}

}  // namespace cuda
}  // namespace rwkv
