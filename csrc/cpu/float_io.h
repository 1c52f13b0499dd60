// The fused CPU ops' activations in either dtype the model uses (fp32 or bf16) for kernels that
// compute in fp32: widened() gives a bf16 tensor's values as a new contiguous fp32 tensor (exact),
// narrowed() an fp32 result in the op's output dtype (bf16: rounded to nearest even, as torch's
// .to() does). While decoding these are a few thousand values, where an ATen conversion's
// dispatch and TensorIterator set-up would cost more than the copy: a plain loop. Long inputs
// (prefill: millions of values) use ATen's conversion, vectorized and threaded (the same values).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

#include "cpu/pooled.h"

namespace rwkv {
namespace cpu {

// Below this many values, the plain loop.
constexpr int64_t kAtenConvertFrom = 1 << 15;

// y (contiguous fp32) in dtype dt: y itself when dt is fp32, else its values rounded to bf16.
inline at::Tensor narrowed(const at::Tensor& y, at::ScalarType dt) {
  if (dt == at::kFloat) return y;
  if (y.numel() >= kAtenConvertFrom) return y.to(dt);
  at::Tensor out = pooled_empty(y.sizes(), dt);
  const float* s = y.data_ptr<float>();
  c10::BFloat16* d = out.data_ptr<c10::BFloat16>();
  for (int64_t i = 0, n = y.numel(); i < n; ++i) d[i] = c10::BFloat16(s[i]);
  return out;
}

// t's values in fp32 for a kernel that only reads them: t's own memory when it is contiguous
// fp32 (valid while t lives), else its values converted into buf (t.numel() floats; bf16 by a
// plain loop, other dtypes through ATen). For one token's activations, where a widened() tensor
// per input costs more than the copy.
inline const float* fp32_values(const at::Tensor& t, float* buf) {
  if (t.scalar_type() == at::kFloat && t.is_contiguous()) return t.data_ptr<float>();
  const int64_t n = t.numel();
  if (t.scalar_type() == at::kBFloat16) {
    const at::Tensor src = t.contiguous();
    const c10::BFloat16* s = src.data_ptr<c10::BFloat16>();
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(s[i]);
  } else {  // fp32 with strides, or another dtype (fp16): ATen's conversion, then a copy
    const at::Tensor src = t.to(at::kFloat).contiguous();
    const float* s = src.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) buf[i] = s[i];
  }
  return buf;
}

// t's values as a contiguous fp32 tensor: t itself (made contiguous) when it is fp32.
inline at::Tensor widened(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return t.contiguous();
  if (t.numel() >= kAtenConvertFrom) return t.to(at::kFloat).contiguous();
  at::Tensor out = pooled_empty(t.sizes(), at::kFloat);
  fp32_values(t, out.data_ptr<float>());
  return out;
}

}  // namespace cpu
}  // namespace rwkv
