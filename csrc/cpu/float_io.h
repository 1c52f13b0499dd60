// The fused CPU ops' activations in either dtype the model uses (fp32 or bf16) for kernels that
// compute in fp32: widened() gives a bf16 tensor's values as a new contiguous fp32 tensor (exact),
// narrowed() an fp32 result in the op's output dtype (bf16: rounded to nearest even, as torch's
// .to() does). While decoding these are a few thousand values, where an ATen conversion's
// dispatch and TensorIterator set-up would cost more than the copy: a plain loop, or for bf16
// results the active ISA's bf16_round kernel (kernels/convert.h). Long inputs
// (prefill: millions of values) use ATen's conversion, vectorized and threaded (the same values).
// Fp32Inputs and Fp32Result spare a token's bf16 inputs and results their fp32 tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/BFloat16.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/pooled.h"
#include "cpu/scratch.h"

namespace rwkv {
namespace cpu {

// Below this many values, the plain loop.
constexpr int64_t kAtenConvertFrom = 1 << 15;

// The fp32 values y (contiguous, as many as out holds) written into out (contiguous, not fp32):
// bf16 rounded to nearest even by the bf16_round kernel when short, else (or for other dtypes)
// ATen's copy.
inline void narrow_into(const float* y, const at::Tensor& out) {
  const int64_t n = out.numel();
  if (out.scalar_type() != at::kBFloat16 || n >= kAtenConvertFrom) {
    out.copy_(at::from_blob(const_cast<float*>(y), out.sizes(), at::kFloat));
    return;
  }
  kernels().bf16_round(n, y, reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()));
}

// The fp32 values y (contiguous, of shape `sizes`) as a new tensor of dtype dt (not fp32),
// rounded as narrow_into rounds them.
inline at::Tensor narrowed_values(const float* y, at::IntArrayRef sizes, at::ScalarType dt) {
  at::Tensor out = pooled_empty(sizes, dt);
  narrow_into(y, out);
  return out;
}

// y (contiguous fp32) in dtype dt: y itself when dt is fp32, else narrowed_values().
inline at::Tensor narrowed(const at::Tensor& y, at::ScalarType dt) {
  if (dt == at::kFloat) return y;
  return narrowed_values(y.data_ptr<float>(), y.sizes(), dt);
}

// Checks that `into`, a tensor an op is given to write its result into (a planned op's,
// cpu/into.h), is contiguous, of `sizes` and of dtype dt; `what` names the result in the error.
inline void check_into(const at::Tensor& into, at::IntArrayRef sizes, at::ScalarType dt,
                       const char* what) {
  TORCH_CHECK(into.scalar_type() == dt && into.sizes() == sizes && into.is_contiguous(), what,
              ": the tensor to write into must be a contiguous ", sizes, " ", c10::toString(dt),
              " tensor, got ", into.sizes(), " ", c10::toString(into.scalar_type()));
}

// Where an op computes a result that it returns in dtype dt. An fp32 result is the returned
// tensor itself. A short result in another dtype (one token's) is computed in `room`, memory the
// op took from a per-thread Scratch, and narrowed into the one new tensor: while decoding, an
// extra fp32 tensor's allocation and release per call is a measurable share of a token.
class Fp32Result {
 public:
  Fp32Result() = default;
  // room: as many floats as sizes holds, where in_room() allows it; nullptr: an fp32 tensor.
  // into: a contiguous tensor of `sizes` in dt that takes the result (a planned op's, reused
  // between its calls), or nullptr for a new tensor.
  Fp32Result(at::IntArrayRef sizes, at::ScalarType dt, float* room,
             const at::Tensor* into = nullptr)
      : sizes_(sizes.begin(), sizes.end()), dt_(dt), into_(into) {
    if (into != nullptr) {
      check_into(*into, sizes, dt, "Fp32Result");
      if (dt == at::kFloat) {
        p_ = into->data_ptr<float>();  // computed in place
        return;
      }
    }
    if (room == nullptr) {
      t_ = pooled_empty(sizes_, at::kFloat);
      room = t_.data_ptr<float>();
    }
    p_ = room;
  }
  // Whether an op may compute a result of n values in dt in room (the scratch stays small).
  static bool in_room(int64_t n, at::ScalarType dt) {
    return dt != at::kFloat && n < kAtenConvertFrom;
  }
  float* data() const { return p_; }
  // The result in dt.
  at::Tensor take() const {
    if (into_ != nullptr) {
      if (dt_ != at::kFloat) narrow_into(p_, *into_);
      return *into_;
    }
    return t_.defined() ? narrowed(t_, dt_) : narrowed_values(p_, sizes_, dt_);
  }

 private:
  c10::SmallVector<int64_t, 4> sizes_;  // no heap allocation (one per product while decoding)
  at::ScalarType dt_ = at::kFloat;
  const at::Tensor* into_ = nullptr;
  at::Tensor t_;
  float* p_ = nullptr;
};

// This thread's room for the one-token results (T == 1) of an op, n floats in all, returned in
// dt; nullptr where they get fp32 tensors (fp32, sequences, long results). Valid until the
// thread's next call, so an op takes its results out before it returns (Fp32Result::take).
inline float* result_room(int64_t T, int64_t n, at::ScalarType dt) {
  if (T != 1 || !Fp32Result::in_room(n, dt)) return nullptr;
  thread_local Scratch room;
  return room.get<float>(n);
}

// t's values in fp32 for a kernel that only reads them: t's own memory when it is contiguous
// fp32 (valid while t lives), else its values converted into buf (t.numel() floats; bf16 by a
// plain loop, other dtypes through ATen). For one token's activations, where a widened() tensor
// per input costs more than the copy.
inline const float* fp32_values(const at::Tensor& t, float* buf) {
  if (t.scalar_type() == at::kFloat && t.is_contiguous()) return t.data_ptr<float>();
  const int64_t n = t.numel();
  if (t.scalar_type() == at::kBFloat16) {
    const at::Tensor src = t.contiguous();
    const c10::BFloat16* s = src.data_ptr<c10::BFloat16>();
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(s[i]);
  } else {  // fp32 with strides, or another dtype (fp16): ATen's conversion, then a copy
    const at::Tensor src = t.to(at::kFloat).contiguous();
    const float* s = src.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) buf[i] = s[i];
  }
  return buf;
}

// t's values as a contiguous fp32 tensor: t itself (made contiguous) when it is fp32.
inline at::Tensor widened(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return t.contiguous();
  if (t.numel() >= kAtenConvertFrom) return t.to(at::kFloat).contiguous();
  at::Tensor out = pooled_empty(t.sizes(), at::kFloat);
  fp32_values(t, out.data_ptr<float>());
  return out;
}

// The fp32 values of an op's activations, each valid while this lives. For one token (T == 1)
// fp32 inputs are read in place and others converted into this thread's buffer, room for
// `floats` values in all (no tensor per input: while decoding its allocation and release cost
// more than the copy); for sequences, widened() tensors held here. One per op call at a time.
class Fp32Inputs {
 public:
  Fp32Inputs(int64_t T, int64_t floats) {
    if (T == 1) {
      thread_local Scratch room;
      next_ = room.get<float>(floats);
    }
  }
  const float* operator()(const at::Tensor& t) {
    if (next_ == nullptr) {
      held_.push_back(widened(t));
      return held_.back().data_ptr<float>();
    }
    const float* values = fp32_values(t, next_);
    next_ += t.numel();
    return values;
  }

 private:
  float* next_ = nullptr;
  std::vector<at::Tensor> held_;
};

}  // namespace cpu
}  // namespace rwkv
