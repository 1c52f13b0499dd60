// ATen glue for linear_one on CPU: a dense matrix-vector product for column-major bf16 or fp32
// weights (how the model stores them), fp32 accumulation, threaded over output columns, with an
// optional activation of the output (common/activation.h). It exists
// because it beats torch's `x @ w` on CPU (docs/kernels.md has the measurements).
// Schema: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/linear.h.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>

#include "common/activation.h"
#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"

namespace rwkv {
namespace cpu {
namespace {

at::Tensor linear_one(const at::Tensor& x, const at::Tensor& w, int64_t act) {
  const LinearDims d = check_linear_one(x, w);
  const Act a = check_act("linear_one", act);
  // (Each conversion only when needed: a no-op .to() still costs a dispatch per product.)
  const at::Tensor x32 =
      x.scalar_type() == at::kFloat && x.is_contiguous() ? x : x.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({d.M}, x32.options());
  const KernelTable& kt = kernels();
  const bool sequential = read_sequential();
  // Blocks of 16 columns keep the kernel's 4-column groups whole.
  for_blocks(d.M, 16, d.N, [&](int64_t m0, int64_t m1) {
    if (w.scalar_type() == at::kFloat) {
      kt.linear_one_f32(d.N, m0, m1, x32.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(),
                        sequential);
    } else {
      const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
      kt.linear_one_bf16(d.N, m0, m1, x32.data_ptr<float>(), wp, y.data_ptr<float>(), sequential);
    }
    activate(a, y.data_ptr<float>() + m0, m1 - m0);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) { m.impl("linear_one", &rwkv::cpu::linear_one); }
