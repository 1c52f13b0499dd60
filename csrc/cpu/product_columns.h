// One token's low-rank product computed inside another op's parallel region (maa_lora_one's
// z = xw @ w1): linear_one's kernels on a range of output columns,
// each result rounded to x's dtype as linear_one returns it, then kept in fp32 (exactly), so the
// op sees the bits that linear_one followed by the op would.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

#include "cpu/cpu_features.h"
#include "cpu/float_io.h"

namespace rwkv {
namespace cpu {

class ProductColumns {
 public:
  // x [N] or [1, N] and w [N, M] column-major, both fp32 or both bf16 (checked by the op);
  // x32: room for N floats (x widened where the kernels take fp32 x).
  ProductColumns(const at::Tensor& x, const at::Tensor& w, float* x32)
      : kt_(kernels()), N_(x.size(-1)), w_(w.data_ptr()), sequential_(read_sequential()) {
    bf16_ = x.scalar_type() == at::kBFloat16;
    if (bf16_ && kt_.linear_one_bf16x != nullptr) {  // bf16 dots on x itself
      xb_t_ = x.contiguous();
      xb_ = reinterpret_cast<const uint16_t*>(xb_t_.data_ptr<at::BFloat16>());
    } else {
      x_ = fp32_values(x, x32);
    }
    short_ = N_ * w.element_size() <= kShortColumnBytes;
  }

  // Whether a range's results depend on where it begins (short columns, kernel_table.h): a caller
  // then starts every range at a multiple of 16 or computes all columns in one range.
  bool short_columns() const { return short_; }

  // y[m] for m in [m0, m1).
  void operator()(int64_t m0, int64_t m1, float* y) const {
    if (!bf16_) {
      kt_.linear_one_f32(N_, m0, m1, x_, static_cast<const float*>(w_), y, sequential_);
      return;
    }
    const auto* w = static_cast<const uint16_t*>(w_);
    if (xb_ != nullptr) {
      kt_.linear_one_bf16x(N_, m0, m1, xb_, w, y, sequential_);
    } else {
      kt_.linear_one_bf16(N_, m0, m1, x_, w, y, sequential_);
    }
    uint16_t bits[64];
    for (int64_t m = m0; m < m1; m += 64) {
      const int64_t len = std::min<int64_t>(64, m1 - m);
      kt_.bf16_round(len, y + m, bits);
      for (int64_t i = 0; i < len; ++i)
        y[m + i] = static_cast<float>(c10::BFloat16(bits[i], c10::BFloat16::from_bits()));
    }
  }

 private:
  const KernelTable& kt_;
  int64_t N_;
  const void* w_;
  bool sequential_, bf16_ = false, short_ = false;
  at::Tensor xb_t_;
  const uint16_t* xb_ = nullptr;
  const float* x_ = nullptr;
};

}  // namespace cpu
}  // namespace rwkv
