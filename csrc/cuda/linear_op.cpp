// Torch glue for linear_one on CUDA (kernel: linear.cu): shared input checks, device guard,
// current stream, launch check.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "common/op_checks.h"
#include "cuda/kernels.h"

namespace {

// x [N] bf16; w [N, M] bf16 column-major (w.t() contiguous). Returns y [M] bf16.
at::Tensor linear_one_cuda(const at::Tensor& x, const at::Tensor& w) {
  const auto [N, M] = rwkv::check_linear_one(x, w);
  TORCH_INTERNAL_ASSERT(x.is_cuda());
  // float32 is a CPU kernel only (on CUDA, torch's own matmul is the fast path for it).
  TORCH_CHECK(x.scalar_type() == at::kBFloat16,
              "linear_one: float32 is implemented on CPU only; on CUDA pass bfloat16 or use x @ w");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M}, x.options());
  if (M == 0) return y;
  const auto aligned16 = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  };
  const bool vec = N % 8 == 0 && aligned16(xc.data_ptr()) && aligned16(w.data_ptr());
  rwkv::cuda::linear_one_bf16(N, M, xc.data_ptr(), w.data_ptr(), y.data_ptr(), vec,
                              c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) { m.impl("linear_one", &linear_one_cuda); }
