// A product op of a step plan (step_plan.cpp): linear_one_group, linear_one_chain,
// linear_one_residual or linear_one_ffn, with the op's checks and layout (cpu/one_token.cpp) done
// on its first call and kept. The plan calls it once per token with the same weights and the same
// shapes (each later call checks that its x have the first call's dtypes and shapes, and that
// its weight lists are the same); a call then only converts x, computes, and writes its
// results. With `reuse`, the results go into the tensors of the first call's, kept: the plan
// sets it where it knows that nothing reads them after the token (no graph result, read only by
// rwkv ops, which never return an input or a view of one). The computation is the op's own
// (the same layout and kernels, the same column split): the same bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace rwkv {
namespace cpu {

class ProductStep {
 public:
  // One call's arguments, as the op's schema has them (a single x or w as a list of one; act a
  // list of one for linear_one_residual).
  struct Call {
    at::TensorList x, w, side;
    c10::IntArrayRef act, src;
    const at::Tensor* residual = nullptr;
    const at::Tensor* gate = nullptr;  // linear_one_residual's gate tensor
    int64_t gate_index = -1;           // linear_one_ffn's gate: a product of x, or -1
  };

  // The planned form of rwkv::<op> ("rwkv::linear_one_chain", ...), or nullptr for other ops.
  static std::unique_ptr<ProductStep> make(const std::string& op, bool reuse);
  virtual ~ProductStep() = default;
  virtual std::vector<at::Tensor> run(const Call& c) = 0;
};

}  // namespace cpu
}  // namespace rwkv
