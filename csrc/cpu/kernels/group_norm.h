// The group norm of one head's outputs (upstream's ln_x), then times the gate: what the time mix
// of RWKV-5.1+, 6 and 7 applies to the recurrence's output before the output projection.
//   y = ((y - mean(y)) / sqrt(var(y) + eps) * weight + bias + add) * g     (var biased)
// add is bonus * bv[i] (RWKV-7's per-head bonus term), or nothing when bv is null.
#pragma once

#include <cmath>
#include <cstdint>

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

inline void group_norm_gate(int64_t N, float* y, const float* weight, const float* bias, float eps,
                            const float* g, float bonus = 0.0f, const float* bv = nullptr) {
  float mean = 0.0f;
  for (int64_t i = 0; i < N; ++i) mean += y[i];
  mean /= static_cast<float>(N);
  float var = 0.0f;
  for (int64_t i = 0; i < N; ++i) var += (y[i] - mean) * (y[i] - mean);
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(N) + eps);
  for (int64_t i = 0; i < N; ++i) {
    const float add = bv != nullptr ? bonus * bv[i] : 0.0f;
    y[i] = ((y[i] - mean) * rstd * weight[i] + bias[i] + add) * g[i];
  }
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
