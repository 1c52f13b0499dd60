// Torch glue for linear_one on CUDA (kernel: linear.cu): shared input checks, device guard,
// current stream, launch check.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tanh.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "common/activation.h"
#include "common/op_checks.h"
#include "cuda/kernels.h"

namespace {

// The activation as torch ops on y (fp32 from the kernel's bf16 output, then back): the same
// values a CPU caller gets, up to the bf16 rounding of the product.
at::Tensor activated(const at::Tensor& y, rwkv::Act a) {
  if (a == rwkv::Act::none) return y;
  const at::Tensor f = y.to(at::kFloat);
  at::Tensor r;
  switch (a) {
    case rwkv::Act::sigmoid: r = at::sigmoid(f); break;
    case rwkv::Act::relu2: r = at::relu(f); r = at::mul(r, r); break;
    case rwkv::Act::tanh: r = at::tanh(f); break;
    default: r = at::silu(f); break;
  }
  return r.to(y.scalar_type());
}

// x [N] or [1, N] bf16; w [N, M] bf16 column-major (w.t() contiguous). Returns y [M] or [1, M]
// bf16.
at::Tensor linear_one_cuda(const at::Tensor& x, const at::Tensor& w, int64_t act) {
  const auto [N, M] = rwkv::check_linear_one(x, w);
  const rwkv::Act a = rwkv::check_act("linear_one", act);
  TORCH_INTERNAL_ASSERT(x.is_cuda());
  // float32 is a CPU kernel only (on CUDA, torch's own matmul is the fast path for it).
  TORCH_CHECK(x.scalar_type() == at::kBFloat16,
              "linear_one: float32 is implemented on CPU only; on CUDA pass bfloat16 or use x @ w");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(rwkv::one_row_shape(x, M), x.options());
  if (M == 0) return y;
  const auto aligned16 = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  };
  const bool vec = N % 8 == 0 && aligned16(xc.data_ptr()) && aligned16(w.data_ptr());
  rwkv::cuda::linear_one_bf16(N, M, xc.data_ptr(), w.data_ptr(), y.data_ptr(), vec,
                              c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return activated(y, a);
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) { m.impl("linear_one", &linear_one_cuda); }
