// ATen glue for the int8 matrix products on CPU (mm8_one, mm8_seq): input checks in the
// contract's words, fp32 copies of x and the side tensors (small), the weight in column-major
// order (the model's layout, no copy; any other strides are copied once), then the kernels of the
// active instruction set threaded over output columns. The dequantized matrix is never built.
// Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/mm8.h and docs/kernels.md.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>

#include "common/checks.h"
#include "cpu/cpu_features.h"

namespace rwkv {
namespace cpu {
namespace {

void check_mm8(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
               const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
               const at::Tensor& ry) {
  RWKV_CHECK_SAME_DEVICE(op, x, w);
  RWKV_CHECK_SAME_DEVICE(op, x, mx);
  RWKV_CHECK_SAME_DEVICE(op, x, rx);
  RWKV_CHECK_SAME_DEVICE(op, x, my);
  RWKV_CHECK_SAME_DEVICE(op, x, ry);
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", dtype_name(dt));
  if (seq) {
    RWKV_CHECK_DIM(op, x, "[T, N]", 2);
  } else {
    RWKV_CHECK_DIM(op, x, "[N]", 1);
  }
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
}

at::Tensor fp32(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

at::Tensor mm8_impl(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                    const at::Tensor& ry) {
  check_mm8(op, seq, x, w, mx, rx, my, ry);
  const int64_t N = w.size(0), M = w.size(1), T = seq ? x.size(0) : 1;
  const at::Tensor x32 = fp32(x), mx32 = fp32(mx), rx32 = fp32(rx), my32 = fp32(my),
                   ry32 = fp32(ry);
  // Column-major [N, M] (w.t() contiguous) is the fast path; anything else is copied into it.
  const at::Tensor q = w.t().is_contiguous() ? w : w.t().contiguous().t();
  const KernelTable& kt = kernels();

  at::Tensor xs = at::empty({T, N}, x32.options());
  at::Tensor sums = at::empty({T, 3}, x32.options());
  at::parallel_for(0, T, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N)),
                   [&](int64_t t0, int64_t t1) {
                     kt.mm8_prepare(N, t0, t1, x32.data_ptr<float>(), ry32.data_ptr<float>(),
                                    my32.data_ptr<float>(), xs.data_ptr<float>(),
                                    sums.data_ptr<float>());
                   });

  at::Tensor y = at::empty(seq ? std::vector<int64_t>{T, M} : std::vector<int64_t>{M},
                           x32.options());
  // Blocks of 16 columns keep the kernel's 4-column groups whole; a task gets >= ~64k MACs.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (M + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, T * N * kBlock));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    kt.mm8(T, N, M, b0 * kBlock, std::min(M, b1 * kBlock), xs.data_ptr<float>(),
           q.data_ptr<uint8_t>(), sums.data_ptr<float>(), rx32.data_ptr<float>(),
           mx32.data_ptr<float>(), y.data_ptr<float>());
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor mm8_one(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                   const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry) {
  return mm8_impl("mm8_one", false, x, w, mx, rx, my, ry);
}

at::Tensor mm8_seq(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                   const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry) {
  return mm8_impl("mm8_seq", true, x, w, mx, rx, my, ry);
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("mm8_one", &rwkv::cpu::mm8_one);
  m.impl("mm8_seq", &rwkv::cpu::mm8_seq);
}
