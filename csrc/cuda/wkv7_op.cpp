// Torch glue for wkv7_forward on CUDA (kernel: wkv7.cu).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/op_checks.h"
#include "cuda/kernels.h"

namespace {

// state [H, N, N] fp32 in place ([head, value, key]); r, w, k, v, a, b [T, H*N] fp32.
// Returns y [T, H*N] fp32.
at::Tensor wkv7_forward_cuda(at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                             const at::Tensor& b) {
  const char* op = "wkv7_forward";
  const auto [T, H, N] = rwkv::check_wkv7(state, r, w, k, v, a, b);
  TORCH_INTERNAL_ASSERT(state.is_cuda());
  rwkv::check_cuda_head_size(op, N, rwkv::cuda::kWkvMaxHeadSize);

  const c10::cuda::OptionalCUDAGuard guard(state.device());
  const at::Tensor rc = r.contiguous(), wc = w.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous(), ac = a.contiguous(), bc = b.contiguous();
  at::Tensor y = at::empty({T, H * N}, r.options());
  if (H == 0 || N == 0) return y;
  rwkv::cuda::wkv7_forward(T, H, N, state.data_ptr<float>(), rc.data_ptr<float>(),
                           wc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(),
                           ac.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(),
                           c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) { m.impl("wkv7_forward", &wkv7_forward_cuda); }
