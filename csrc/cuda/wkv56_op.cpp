// Torch glue for wkv5_forward and wkv6_forward on CUDA (kernels: wkv5.cu, wkv6.cu, wkv56.cuh).
// The two ops differ only in w: [H, N] for wkv5 (constant decay), [T, H*N] for wkv6 (per token).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/op_checks.h"
#include "cuda/kernels.h"

namespace {

// state [H, N, N] fp32 in place ([head, key, value]); r, k, v [T, H*N]; u [H, N]; w [H, N]
// (wkv5) or [T, H*N] (wkv6); all fp32. Returns y [T, H*N] fp32.
template <bool kPerTokenW>
at::Tensor wkv56_forward_cuda(at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& w, const at::Tensor& u) {
  const char* op = kPerTokenW ? "wkv6_forward" : "wkv5_forward";
  const auto [T, H, N] = rwkv::check_wkv56(op, kPerTokenW, state, r, k, v, w, u);
  TORCH_INTERNAL_ASSERT(state.is_cuda());
  rwkv::check_cuda_head_size(op, N, rwkv::cuda::kWkvMaxHeadSize);

  const c10::cuda::OptionalCUDAGuard guard(state.device());
  const at::Tensor rc = r.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
                   wc = w.contiguous(), uc = u.contiguous();
  at::Tensor y = at::empty({T, H * N}, r.options());
  if (H == 0 || N == 0) return y;
  const auto launch = kPerTokenW ? &rwkv::cuda::wkv6_forward : &rwkv::cuda::wkv5_forward;
  launch(T, H, N, state.data_ptr<float>(), rc.data_ptr<float>(), kc.data_ptr<float>(),
         vc.data_ptr<float>(), wc.data_ptr<float>(), uc.data_ptr<float>(), y.data_ptr<float>(),
         c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) {
  m.impl("wkv5_forward", &wkv56_forward_cuda<false>);
  m.impl("wkv6_forward", &wkv56_forward_cuda<true>);
}
