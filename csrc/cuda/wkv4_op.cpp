// Torch glue for wkv4_forward on CUDA (kernel: wkv4.cu): the checks of rwkv/ops/_checks.py in
// the same order and words (csrc/common/checks.h), device guard, current stream, launch check.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/checks.h"
#include "cuda/kernels.h"

namespace {

// w, u: [C]; k, v: [T, C]; aa, bb, pp: [C] in place; all fp32. Returns y [T, C] fp32.
at::Tensor wkv4_forward_cuda(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                             const at::Tensor& v, at::Tensor& aa, at::Tensor& bb,
                             at::Tensor& pp) {
  const char* op = "wkv4_forward";
  RWKV_CHECK_SAME_DEVICE(op, k, w);
  RWKV_CHECK_SAME_DEVICE(op, k, u);
  RWKV_CHECK_SAME_DEVICE(op, k, v);
  RWKV_CHECK_SAME_DEVICE(op, k, aa);
  RWKV_CHECK_SAME_DEVICE(op, k, bb);
  RWKV_CHECK_SAME_DEVICE(op, k, pp);
  TORCH_INTERNAL_ASSERT(k.is_cuda());
  RWKV_CHECK_DTYPE(op, k, at::kFloat);
  RWKV_CHECK_DIM(op, k, "[T, C]", 2);
  const int64_t T = k.size(0), C = k.size(1);
  RWKV_CHECK_DTYPE(op, v, at::kFloat);
  RWKV_CHECK_SHAPE(op, v, "[T, C]", T, C);
  RWKV_CHECK_DTYPE(op, w, at::kFloat);
  RWKV_CHECK_SHAPE(op, w, "[C]", C);
  RWKV_CHECK_DTYPE(op, u, at::kFloat);
  RWKV_CHECK_SHAPE(op, u, "[C]", C);
  RWKV_CHECK_DTYPE(op, aa, at::kFloat);
  RWKV_CHECK_SHAPE(op, aa, "[C]", C);
  RWKV_CHECK_DTYPE(op, bb, at::kFloat);
  RWKV_CHECK_SHAPE(op, bb, "[C]", C);
  RWKV_CHECK_DTYPE(op, pp, at::kFloat);
  RWKV_CHECK_SHAPE(op, pp, "[C]", C);
  RWKV_CHECK_CONTIGUOUS(op, aa);
  RWKV_CHECK_CONTIGUOUS(op, bb);
  RWKV_CHECK_CONTIGUOUS(op, pp);

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
