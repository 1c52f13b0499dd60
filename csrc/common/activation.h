// The activation a one-token product may apply to its output (the `act` argument of linear_one
// and mm8_one_i16), so that the model's `sigmoid(x @ W)` and the like are one op, not two:
//   0 none, 1 sigmoid, 2 relu squared, 3 tanh, 4 silu (x * sigmoid(x)).
// Applied to the fp32 result before any conversion to x's dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

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
      const float r = v < 0.0f ? 0.0f : v;  // torch.relu: NaN stays NaN
      return r * r;
    }
    case Act::tanh: return std::tanh(v);
    case Act::silu: return v / (1.0f + std::exp(-v));
    default: return v;
  }
}

// y[0..n) in place (CPU memory). Relu squared (the FFN key's 4*C outputs per layer) is a
// branch-free SSE loop: a scalar loop would branch on each value's sign, which random signs
// mispredict half the time.
inline void activate(Act a, float* y, int64_t n) {
  switch (a) {
    case Act::none: return;
    case Act::relu2: {
      int64_t i = 0;
#if defined(__SSE__)
      // maxps(0, v) gives its second operand v unless 0 > v: `v < 0 ? 0 : v` (NaN stays NaN).
      const __m128 zero = _mm_setzero_ps();
      for (; i + 4 <= n; i += 4) {
        const __m128 r = _mm_max_ps(zero, _mm_loadu_ps(y + i));
        _mm_storeu_ps(y + i, _mm_mul_ps(r, r));
      }
#endif
      for (; i < n; ++i) y[i] = activate(a, y[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) y[i] = activate(a, y[i]);
  }
}

}  // namespace rwkv
