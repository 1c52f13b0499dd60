// Torch glue for mm8_one and mm8_seq on CUDA (kernels: mm8.cu).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "common/checks.h"
#include "cuda/kernels.h"

namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// x [T, N] (seq) or [N] (one) fp32/fp16/bf16; w [N, M] uint8, any strides (column-major, i.e.
// w.t() contiguous, is used as is; other layouts are copied once into that layout); mx, rx [M]
// and my, ry [N, 1] in x's dtype. Returns y [T, M] or [M] in x's dtype.
at::Tensor mm8_cuda(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                    const at::Tensor& ry) {
  RWKV_CHECK_SAME_DEVICE(op, x, w);
  RWKV_CHECK_SAME_DEVICE(op, x, mx);
  RWKV_CHECK_SAME_DEVICE(op, x, rx);
  RWKV_CHECK_SAME_DEVICE(op, x, my);
  RWKV_CHECK_SAME_DEVICE(op, x, ry);
  TORCH_INTERNAL_ASSERT(x.is_cuda());
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", ::rwkv::dtype_name(dt));
  if (seq) {
    RWKV_CHECK_DIM(op, x, "[T, N]", 2);
  } else {
    RWKV_CHECK_DIM(op, x, "[N]", 1);
  }
  const int64_t T = seq ? x.size(0) : 1;
  const int64_t N = x.size(-1);
  RWKV_CHECK_DTYPE(op, w, at::kByte);
  RWKV_CHECK_DIM(op, w, "[N, M]", 2);
  const int64_t M = w.size(1);
  RWKV_CHECK_SHAPE(op, w, "[N, M]", N, M);
  RWKV_CHECK_DTYPE_AS(op, mx, dt, " (x's dtype)");
  RWKV_CHECK_SHAPE(op, mx, "[M]", M);
  RWKV_CHECK_DTYPE_AS(op, rx, dt, " (x's dtype)");
  RWKV_CHECK_SHAPE(op, rx, "[M]", M);
  RWKV_CHECK_DTYPE_AS(op, my, dt, " (x's dtype)");
  RWKV_CHECK_SHAPE(op, my, "[N, 1]", N, 1);
  RWKV_CHECK_DTYPE_AS(op, ry, dt, " (x's dtype)");
  RWKV_CHECK_SHAPE(op, ry, "[N, 1]", N, 1);

  const c10::cuda::OptionalCUDAGuard guard(x.device());
  // wt: [M, N] contiguous, i.e. w column-major. A no-op view for the model's storage layout.
  const at::Tensor wt = w.t().contiguous();
  const at::Tensor xc = x.contiguous(), mxc = mx.contiguous(), rxc = rx.contiguous(),
                   myc = my.contiguous(), ryc = ry.contiguous();
  at::Tensor y = seq ? at::empty({T, M}, x.options()) : at::empty({M}, x.options());
  if (T == 0 || M == 0) return y;
  const bool vec = N % 16 == 0 && aligned16(xc.data_ptr()) && aligned16(wt.data_ptr()) &&
                   aligned16(myc.data_ptr()) && aligned16(ryc.data_ptr());
  const auto act = dt == at::kFloat  ? rwkv::cuda::Act::f32
                   : dt == at::kHalf ? rwkv::cuda::Act::f16
                                     : rwkv::cuda::Act::bf16;
  rwkv::cuda::mm8_forward(act, T, N, M, xc.data_ptr(), N, wt.data_ptr<uint8_t>(), mxc.data_ptr(),
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
