// Torch glue for mm8_one and mm8_seq on CUDA (kernels: mm8.cu).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "common/op_checks.h"
#include "cuda/glue.h"
#include "cuda/kernels.h"

namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// x [T, N] (seq) or [N] / [1, N] (one) fp32/fp16/bf16; w [N, M] uint8, any strides (column-major, i.e.
// w.t() contiguous, is used as is; other layouts are copied once into that layout); mx, rx [M]
// and my, ry [N, 1] in x's dtype. Returns y [T, M] or [M] / [1, M] in x's dtype.
at::Tensor mm8_cuda(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                    const at::Tensor& ry) {
  const auto [T, N, M] = rwkv::check_mm8(op, seq, x, w, mx, rx, my, ry);
  TORCH_INTERNAL_ASSERT(x.is_cuda());

  const c10::cuda::OptionalCUDAGuard guard(x.device());
  // wt: [M, N] contiguous, i.e. w column-major. A no-op view for the model's storage layout.
  const at::Tensor wt = w.t().contiguous();
  const at::Tensor xc = x.contiguous(), mxc = mx.contiguous(), rxc = rx.contiguous(),
                   myc = my.contiguous(), ryc = ry.contiguous();
  at::Tensor y =
      at::empty(seq ? rwkv::RowShape{T, M} : rwkv::one_row_shape(x, M), x.options());
  if (T == 0 || M == 0) return y;
  const bool vec = N % 16 == 0 && aligned16(xc.data_ptr()) && aligned16(wt.data_ptr()) &&
                   aligned16(myc.data_ptr()) && aligned16(ryc.data_ptr());
  rwkv::cuda::mm8_forward(rwkv::cuda::act_of(x), T, N, M, xc.data_ptr(), N, wt.data_ptr<uint8_t>(), mxc.data_ptr(),
                          rxc.data_ptr(), myc.data_ptr(), ryc.data_ptr(), y.data_ptr(), M, vec,
                          c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

at::Tensor mm8_one_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                        const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry) {
  return mm8_cuda("mm8_one", false, x, w, mx, rx, my, ry);
}

at::Tensor mm8_seq_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                        const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry) {
  return mm8_cuda("mm8_seq", true, x, w, mx, rx, my, ry);
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) {
  m.impl("mm8_one", &mm8_one_cuda);
  m.impl("mm8_seq", &mm8_seq_cuda);
}
