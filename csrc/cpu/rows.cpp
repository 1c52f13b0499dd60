// ATen glue for linear_rows on CPU: the dense product of several rows (the batched engine's B
// sequences, or a short sequence) with a column-major bf16/fp32 weight or its row slabs, in fp32.
// x is widened to fp32 once (bf16 x stays bf16 on ISAs with bf16 dot products, multiplied with
// the bf16 weights in pairs as linear_one does there); the output columns are split between
// threads in blocks of 16; each
// slab's product is added to the previous ones' (fp32, slab order, as linear_one_slabs sums).
// Schema: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/linear_rows.h.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/mm8_prepare.h"
#include "cpu/parallel.h"

namespace rwkv {
namespace cpu {
namespace {

// x [T, N] bf16/fp32; w [N, M] column-major or [S, N/S, M] row slabs each column-major, x's dtype.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w) {
  constexpr const char* op = "linear_rows";
  check_same_device(op, {{"x", &x}, {"w", &w}});
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op,
              ": x must be bfloat16 or float32, got ", dtype_name(x.scalar_type()));
  RWKV_CHECK_DIM(op, x, "[T, N]", 2);
  RWKV_CHECK_DTYPE_AS(op, w, x.scalar_type(), " (x's dtype)");
  TORCH_CHECK(w.dim() == 2 || w.dim() == 3, op, ": w must have shape [N, M] or [S, N/S, M], got ",
              w.sizes());
  const int64_t T = x.size(0), N = x.size(1);
  const int64_t S = w.dim() == 3 ? w.size(0) : 1, K = w.size(-2), M = w.size(-1);
  TORCH_CHECK(S >= 1 && S * K == N, op, ": w must have ", N, " rows (x's N) in ", S,
              " slab(s), got shape ", w.sizes());
  TORCH_CHECK(w.numel() == 0 || ((K <= 1 || w.stride(-2) == 1) && (M <= 1 || w.stride(-1) == K) &&
                                 (S == 1 || w.stride(0) == K * M)), op,
              ": w must be column-major (w.t() contiguous, or each slab's), got strides ", w.strides());
  at::Tensor y = at::empty({T, M}, x.options().dtype(at::kFloat));
  if (T == 0 || M == 0) return y;
  if (N == 0) return y.zero_();
  const KernelTable& kt = kernels();
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  // bf16 rows stay bf16 where the ISA multiplies bf16 pairs (as linear_one does there).
  const bool bf16x = bf16 && kt.linear_rows_bf16x != nullptr;
  const at::Tensor xin = bf16x ? x.contiguous() : fp32(x);
  const float* xp = bf16x ? nullptr : xin.data_ptr<float>();
  const auto* xbp = bf16x ? reinterpret_cast<const uint16_t*>(xin.data_ptr<at::BFloat16>()) : nullptr;
  float* yp = y.data_ptr<float>();
  for_blocks(M, 16, T * N, [&](int64_t m0, int64_t m1) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t off = s * K * M;  // slab s: its K rows of every column
      if (bf16) {
        const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()) + off;
        if (bf16x) {
          kt.linear_rows_bf16x(T, K, M, m0, m1, xbp + s * K, N, wp, yp, s > 0);
        } else {
          kt.linear_rows_bf16(T, K, M, m0, m1, xp + s * K, N, wp, yp, s > 0);
        }
      } else {
        kt.linear_rows_f32(T, K, M, m0, m1, xp + s * K, N, w.data_ptr<float>() + off, yp, s > 0);
      }
    }
  });
  return y;
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) { m.impl("linear_rows", &rwkv::cpu::linear_rows); }
