// Torch glue for wkv4_forward on CUDA (kernel: wkv4.cu): the shared input checks
// (csrc/common/op_checks.h, the words of rwkv/ops/_checks.py), device guard, current stream.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/op_checks.h"
#include "cuda/kernels.h"

namespace {

// w, u: [C]; k, v: [T, C]; aa, bb, pp: [C] in place; all fp32. Returns y [T, C] fp32.
at::Tensor wkv4_forward_cuda(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                             const at::Tensor& v, at::Tensor& aa, at::Tensor& bb,
                             at::Tensor& pp) {
  const auto [T, C] = rwkv::check_wkv4(w, u, k, v, aa, bb, pp);
  TORCH_INTERNAL_ASSERT(k.is_cuda());
  const c10::cuda::OptionalCUDAGuard guard(k.device());
  const at::Tensor wc = w.contiguous(), uc = u.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous();
  at::Tensor y = at::empty({T, C}, k.options());
  if (C == 0) return y;
  rwkv::cuda::wkv4_forward(T, C, wc.data_ptr<float>(), uc.data_ptr<float>(),
                           kc.data_ptr<float>(), vc.data_ptr<float>(), y.data_ptr<float>(),
                           aa.data_ptr<float>(), bb.data_ptr<float>(), pp.data_ptr<float>(),
                           c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) { m.impl("wkv4_forward", &wkv4_forward_cuda); }
