// The activation a one-token product may apply to its output (the `act` argument of linear_one
// and mm8_one_i16), so that the model's `sigmoid(x @ W)` and the like are one op, not two:
//   0 none, 1 sigmoid, 2 relu squared, 3 tanh, 4 silu (x * sigmoid(x)).
// Applied to the fp32 result before any conversion to x's dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>

namespace rwkv {

enum class Act : int64_t { none = 0, sigmoid = 1, relu2 = 2, tanh = 3, silu = 4 };

inline Act check_act(const char* op, int64_t act) {
  TORCH_CHECK(act >= 0 && act <= 4, op,
              ": act must be 0 (none), 1 (sigmoid), 2 (relu squared), 3 (tanh) or 4 (silu), got ",
              act);
  return static_cast<Act>(act);
}

inline float activate(Act a, float v) {
  switch (a) {
    case Act::sigmoid: return 1.0f / (1.0f + std::exp(-v));
    case Act::relu2: {
      const float r = v > 0.0f ? v : 0.0f;
      return r * r;
    }
    case Act::tanh: return std::tanh(v);
    case Act::silu: return v / (1.0f + std::exp(-v));
    default: return v;
  }
}

// y[0..n) in place (CPU memory).
inline void activate(Act a, float* y, int64_t n) {
  if (a == Act::none) return;
  for (int64_t i = 0; i < n; ++i) y[i] = activate(a, y[i]);
}

}  // namespace rwkv
