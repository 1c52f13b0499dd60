// Results written into given tensors: a step plan (cpu/step_plan.cpp) reuses, from one
// token to the next, the result tensors of the ops whose results nothing reads after the token,
// instead of a new tensor per result per call (while decoding, each new tensor's allocation and
// release touch memory the streamed weights have evicted). The *_into forms of the block and mix
// ops take `into`: into[i] for result i (contiguous, of the result's shape and dtype: checked),
// or nullptr (or past the end) for a new tensor. Their computation is the op's own.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <vector>

namespace rwkv {
namespace cpu {

using Into = c10::ArrayRef<const at::Tensor*>;

inline const at::Tensor* into_at(Into into, size_t i) {
  return i < into.size() ? into[i] : nullptr;
}

std::vector<at::Tensor> ln_mix_split_into(const at::Tensor& x, const at::Tensor& sx,
                                          const at::Tensor& w, const at::Tensor& b,
                                          const at::Tensor& mix, bool lerp, double eps,
                                          Into into);
std::vector<at::Tensor> maa_lora_one_into(const at::Tensor& xx, const at::Tensor& sx,
                                          const at::Tensor& xw, const at::Tensor& w1,
                                          const at::Tensor& w2, const at::Tensor& maa,
                                          Into into);
at::Tensor wkv6_block_into(at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& w, const at::Tensor& g,
                           const at::Tensor& p, double eps,
                           const std::optional<at::Tensor>& state_in, Into into);
at::Tensor wkv7_block_into(at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                           const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                           const at::Tensor& g, const std::optional<at::Tensor>& v_first,
                           const std::optional<at::Tensor>& v_gate, const at::Tensor& p,
                           double eps, const std::optional<at::Tensor>& state_in, Into into);

}  // namespace cpu
}  // namespace rwkv
