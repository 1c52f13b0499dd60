// The input rules of every op, shared by the CPU and CUDA glue (one copy, not one per backend).
// Same order and words as rwkv/ops/_checks.py, so every backend rejects bad input with the same
// message. Each check_<op> validates all sizes before any pointer is touched and returns them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/checks.h"

namespace rwkv {

using NamedTensor = std::pair<const char*, const at::Tensor*>;

// Every tensor must be on the first one's device.
inline void check_same_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor& first = *tensors.begin();
  for (const NamedTensor& t : tensors) {
    TORCH_CHECK(t.second->device() == first.second->device(), op, ": ", t.first,
                " must be on the same device as ", first.first, " (", first.second->device(),
                "), got ", t.second->device());
  }
}

// Each tensor must have dtype `dt` (float32 unless given; `why` names where it comes from, e.g.
// " (r's dtype)") and shape [rows, cols]; `pattern` names the dimensions.
inline void check_rows(const char* op, const char* pattern, std::initializer_list<NamedTensor> tensors,
                       int64_t rows, int64_t cols, at::ScalarType dt = at::kFloat,
                       const char* why = "") {
  for (const NamedTensor& t : tensors) {
    const at::Tensor& x = *t.second;
    TORCH_CHECK(x.scalar_type() == dt, op, ": ", t.first, " must be ", dtype_name(dt), why,
                ", got ", dtype_name(x.scalar_type()));
    TORCH_CHECK(x.dim() == 2 && x.size(0) == rows && x.size(1) == cols, op, ": ", t.first,
                " must have shape ", pattern, " = [", rows, ", ", cols, "], got ", x.sizes());
  }
}

// Each tensor must have dtype `dt` (as check_rows) and shape [C].
inline void check_channel_vectors(const char* op, std::initializer_list<NamedTensor> tensors,
                                  int64_t C, at::ScalarType dt = at::kFloat, const char* why = "") {
  for (const NamedTensor& t : tensors) {
    TORCH_CHECK(t.second->scalar_type() == dt, op, ": ", t.first, " must be ", dtype_name(dt),
                why, ", got ", dtype_name(t.second->scalar_type()));
    TORCH_CHECK(t.second->dim() == 1 && t.second->size(0) == C, op, ": ", t.first,
                " must have shape [C] = [", C, "], got ", t.second->sizes());
  }
}

// The fused ops' activations (the model's activation dtype): float32 or bfloat16, and float16
// too on CUDA (the CPU kernels have no fp16 path). They compute in fp32 and give their result in
// this dtype.
inline void check_activation_dtype(const char* op, const char* name, const at::Tensor& x) {
  const at::ScalarType dt = x.scalar_type();
  const bool half_ok = x.is_cuda();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || (half_ok && dt == at::kHalf), op, ": ",
              name, half_ok ? " must be float32, bfloat16 or float16" : " must be float32 or bfloat16",
              ", got ", dtype_name(dt));
}

// The CUDA wkv kernels' head-size limit (`max_n`: rwkv::cuda::kWkvMaxHeadSize), checked by the
// glue of every CUDA op that runs one, after the op's own checks.
inline void check_cuda_head_size(const char* op, int64_t N, int64_t max_n) {
  TORCH_CHECK(N <= max_n, op, ": state must have a head size N (state.size(1)) of at most ", max_n,
              " on CUDA, got ", N);
}

struct Wkv4Dims { int64_t T, C; };

// kv: k's and v's dtype (float32; wkv4_block also takes its activation dtype, checked there).
inline Wkv4Dims check_wkv4(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& aa, const at::Tensor& bb,
                           const at::Tensor& pp, const char* op = "wkv4_forward",
                           at::ScalarType kv = at::kFloat) {
  check_same_device(op, {{"k", &k}, {"w", &w}, {"u", &u}, {"v", &v}, {"aa", &aa}, {"bb", &bb},
                         {"pp", &pp}});
  RWKV_CHECK_DTYPE(op, k, kv);
  RWKV_CHECK_DIM(op, k, "[T, C]", 2);
  const int64_t T = k.size(0), C = k.size(1);
  check_rows(op, "[T, C]", {{"v", &v}}, T, C, kv, " (as k)");
  check_channel_vectors(op, {{"w", &w}, {"u", &u}, {"aa", &aa}, {"bb", &bb}, {"pp", &pp}}, C);
  RWKV_CHECK_CONTIGUOUS(op, aa);
  RWKV_CHECK_CONTIGUOUS(op, bb);
  RWKV_CHECK_CONTIGUOUS(op, pp);
  return {T, C};
}

// wkv4_block: wkv4_forward's arguments and the gate r, [T, C] in the activation dtype; k and v
// float32 or, both, in r's dtype (the products' own results, widened exactly by the op).
inline Wkv4Dims check_wkv4_block(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& r, const at::Tensor& aa,
                                 const at::Tensor& bb, const at::Tensor& pp) {
  const char* op = "wkv4_block";
  check_same_device(op, {{"k", &k}, {"r", &r}});
  check_activation_dtype(op, "r", r);
  const at::ScalarType kv = k.scalar_type();
  TORCH_CHECK(kv == at::kFloat || kv == r.scalar_type(), op, ": k must be float32 or r's dtype (",
              dtype_name(r.scalar_type()), "), got ", dtype_name(kv));
  const Wkv4Dims d = check_wkv4(w, u, k, v, aa, bb, pp, op, kv);
  RWKV_CHECK_SHAPE(op, r, "[T, C]", d.T, d.C);
  return d;
}

struct WkvDims { int64_t T, H, N; };

// The [H, N, N] fp32 contiguous state of wkv5/6/7 and the T of r, which is float32 or, for an
// op whose r is an activation (r_activation), bfloat16 (and float16 on CUDA) too.
inline WkvDims check_state_and_r(const char* op, const at::Tensor& state, const at::Tensor& r,
                                 bool r_activation = false) {
  RWKV_CHECK_DTYPE(op, state, at::kFloat);
  RWKV_CHECK_DIM(op, state, "[H, N, N]", 3);
  const int64_t H = state.size(0), N = state.size(1);
  RWKV_CHECK_SHAPE(op, state, "[H, N, N]", H, N, N);
  RWKV_CHECK_CONTIGUOUS(op, state);
  if (r_activation) {
    check_activation_dtype(op, "r", r);
  } else {
    RWKV_CHECK_DTYPE(op, r, at::kFloat);
  }
  RWKV_CHECK_DIM(op, r, "[T, H*N]", 2);
  return {r.size(0), H, N};
}

// wkv5_forward (w_per_token = false, w [H, N]) and wkv6_forward (w [T, H*N]).
inline WkvDims check_wkv56(const char* op, bool w_per_token, const at::Tensor& state,
                           const at::Tensor& r, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& w, const at::Tensor& u) {
  check_same_device(op, {{"state", &state}, {"r", &r}, {"k", &k}, {"v", &v}, {"w", &w},
                         {"u", &u}});
  const WkvDims d = check_state_and_r(op, state, r);
  check_rows(op, "[T, H*N]", {{"r", &r}, {"k", &k}, {"v", &v}}, d.T, d.H * d.N);
  if (w_per_token) {
    check_rows(op, "[T, H*N]", {{"w", &w}}, d.T, d.H * d.N);
  } else {
    RWKV_CHECK_DTYPE(op, w, at::kFloat);
    RWKV_CHECK_SHAPE(op, w, "[H, N]", d.H, d.N);
  }
  RWKV_CHECK_DTYPE(op, u, at::kFloat);
  RWKV_CHECK_SHAPE(op, u, "[H, N]", d.H, d.N);
  return d;
}

inline WkvDims check_wkv7(const at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                          const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                          const at::Tensor& b) {
  const char* op = "wkv7_forward";
  check_same_device(op, {{"state", &state}, {"r", &r}, {"w", &w}, {"k", &k}, {"v", &v},
                         {"a", &a}, {"b", &b}});
  const WkvDims d = check_state_and_r(op, state, r);
  check_rows(op, "[T, H*N]", {{"r", &r}, {"w", &w}, {"k", &k}, {"v", &v}, {"a", &a}, {"b", &b}},
             d.T, d.H * d.N);
  return d;
}

// A block op's state_in (the old state, read instead of state's own contents, which are then
// only written): like state (fp32, contiguous, same shape and device), and either state itself
// or not overlapping it.
inline void check_state_in(const char* op, const at::Tensor& state, const at::Tensor& state_in) {
  check_same_device(op, {{"state", &state}, {"state_in", &state_in}});
  TORCH_CHECK(state_in.scalar_type() == at::kFloat, op, ": state_in must be float32, got ",
              dtype_name(state_in.scalar_type()));
  TORCH_CHECK(state_in.sizes() == state.sizes(), op, ": state_in must have state's shape ",
              state.sizes(), ", got ", state_in.sizes());
  TORCH_CHECK(state_in.is_contiguous(), op, ": state_in must be contiguous, got strides ",
              state_in.strides());
  const auto* a = static_cast<const char*>(state.data_ptr());
  const auto* b = static_cast<const char*>(state_in.data_ptr());
  const auto bytes = static_cast<std::ptrdiff_t>(state.numel() * sizeof(float));
  TORCH_CHECK(a == b || b + bytes <= a || a + bytes <= b, op,
              ": state_in must be state itself or not overlap it");
}

// A block op's parameter rows: p [rows, H*N] fp32 contiguous.
inline void check_block_params(const char* op, const at::Tensor& p, int64_t rows, const WkvDims& d) {
  const std::string pattern = "[" + std::to_string(rows) + ", H*N]";
  check_rows(op, pattern.c_str(), {{"p", &p}}, rows, d.H * d.N);
  RWKV_CHECK_CONTIGUOUS(op, p);
}

// wkv6_block: state as wkv6_forward's; g [T, H*N] float32 or bfloat16 (the result's dtype); r, k,
// v, w (the decay's low-rank term) [T, H*N] float32 or g's dtype; p [4, H*N] fp32 contiguous.
inline WkvDims check_wkv6_block(const at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& w, const at::Tensor& g,
                                const at::Tensor& p, const c10::optional<at::Tensor>& state_in) {
  const char* op = "wkv6_block";
  check_same_device(op, {{"state", &state}, {"r", &r}, {"k", &k}, {"v", &v}, {"w", &w},
                         {"g", &g}, {"p", &p}});
  check_activation_dtype(op, "g", g);
  const at::ScalarType act = g.scalar_type();
  const WkvDims d = check_state_and_r(op, state, r, true);
  // r, k, v, w: fp32, or in g's dtype (the products' results as the model rounds them; widened
  // exactly).
  for (const NamedTensor& t : {NamedTensor{"r", &r}, NamedTensor{"k", &k}, NamedTensor{"v", &v},
                               NamedTensor{"w", &w}}) {
    const at::ScalarType dt = t.second->scalar_type();
    TORCH_CHECK(dt == at::kFloat || dt == act, op, ": ", t.first, " must be float32 or g's dtype (",
                dtype_name(act), "), got ", dtype_name(dt));
    check_rows(op, "[T, H*N]", {t}, d.T, d.H * d.N, dt);
  }
  check_rows(op, "[T, H*N]", {{"g", &g}}, d.T, d.H * d.N, act);
  check_block_params(op, p, 4, d);
  if (state_in.has_value()) check_state_in(op, state, *state_in);
  return d;
}

// wkv7_block: as wkv7_forward for state, r, w, k, v, a, except that r may be bfloat16 too (the
// activation dtype, the result's): w, k, v, a, g and v_first, v_gate (both or neither) in r's
// dtype; p [8, H*N] fp32 contiguous.
inline WkvDims check_wkv7_block(const at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                const at::Tensor& g, const c10::optional<at::Tensor>& v_first,
                                const c10::optional<at::Tensor>& v_gate, const at::Tensor& p,
                                const c10::optional<at::Tensor>& state_in) {
  const char* op = "wkv7_block";
  check_same_device(op, {{"state", &state}, {"r", &r}, {"w", &w}, {"k", &k}, {"v", &v},
                         {"a", &a}, {"g", &g}, {"p", &p}});
  const WkvDims d = check_state_and_r(op, state, r, true);
  const at::ScalarType dt = r.scalar_type();
  check_rows(op, "[T, H*N]", {{"r", &r}, {"w", &w}, {"k", &k}, {"v", &v}, {"a", &a}, {"g", &g}},
             d.T, d.H * d.N, dt, " (r's dtype)");
  TORCH_CHECK(v_first.has_value() == v_gate.has_value(), op,
              ": v_first and v_gate must be given together (layers after the first) or both be "
              "None, got ", v_first.has_value() ? "v_first only" : "v_gate only");
  if (v_first.has_value()) {
    check_same_device(op, {{"state", &state}, {"v_first", &*v_first}, {"v_gate", &*v_gate}});
    check_rows(op, "[T, H*N]", {{"v_first", &*v_first}, {"v_gate", &*v_gate}}, d.T, d.H * d.N,
               dt, " (r's dtype)");
  }
  check_block_params(op, p, 8, d);
  if (state_in.has_value()) check_state_in(op, state, *state_in);
  return d;
}

struct Mm8Dims { int64_t T, N, M; };

// The shape of a one-token product's result: [M] for x [N], [1, M] for x [1, N]; (no heap
// allocation: while decoding, every product makes one).
using RowShape = c10::SmallVector<int64_t, 2>;
inline RowShape one_row_shape(const at::Tensor& x, int64_t M) {
  return x.dim() == 2 ? RowShape{1, M} : RowShape{M};
}

// An int8 product's side tensor `name` (mx, rx, my or ry): x's dtype dt, or also float32 where
// fp32_ok (the CPU one-token ops, which compute in fp32: the model keeps fp32 copies for them).
inline void check_side_dtype(const char* op, const char* name, const at::Tensor& t,
                             at::ScalarType dt, bool fp32_ok) {
  const bool ok = t.scalar_type() == dt || (fp32_ok && t.scalar_type() == at::kFloat);
  TORCH_CHECK(ok, op, ": ", name, " must be ", dtype_name(dt), " (x's dtype)",
              fp32_ok && dt != at::kFloat ? " or float32" : "", ", got ",
              dtype_name(t.scalar_type()));
}

// An int8 product's side tensors: mx, rx [M] and my, ry [N, 1], each of check_side_dtype's dtype.
inline void check_side(const char* op, const at::Tensor& mx, const at::Tensor& rx,
                       const at::Tensor& my, const at::Tensor& ry, at::ScalarType dt, int64_t N,
                       int64_t M, bool fp32_ok) {
  check_side_dtype(op, "mx", mx, dt, fp32_ok);
  RWKV_CHECK_SHAPE(op, mx, "[M]", M);
  check_side_dtype(op, "rx", rx, dt, fp32_ok);
  RWKV_CHECK_SHAPE(op, rx, "[M]", M);
  check_side_dtype(op, "my", my, dt, fp32_ok);
  RWKV_CHECK_SHAPE(op, my, "[N, 1]", N, 1);
  check_side_dtype(op, "ry", ry, dt, fp32_ok);
  RWKV_CHECK_SHAPE(op, ry, "[N, 1]", N, 1);
}

// mm8_one (seq = false, x [N] or [1, N]) and mm8_seq (x [T, N]); T is 1 for mm8_one.
// fp32_side: the side tensors may also be float32 (mm8_one_i16, linear_one_group).
inline Mm8Dims check_mm8(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                         const at::Tensor& ry, bool fp32_side = false) {
  check_same_device(op, {{"x", &x}, {"w", &w}, {"mx", &mx}, {"rx", &rx}, {"my", &my},
                         {"ry", &ry}});
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", dtype_name(dt));
  if (seq) {
    RWKV_CHECK_DIM(op, x, "[T, N]", 2);
  } else {
    RWKV_CHECK_ONE_ROW(op, x);
  }
  const int64_t N = x.size(-1);
  RWKV_CHECK_DTYPE(op, w, at::kByte);
  RWKV_CHECK_DIM(op, w, "[N, M]", 2);
  const int64_t M = w.size(1);
  RWKV_CHECK_SHAPE(op, w, "[N, M]", N, M);
  check_side(op, mx, rx, my, ry, dt, N, M, fp32_side);
  return {seq ? x.size(0) : 1, N, M};
}

// Whether w [N, M] is column-major (w.t() contiguous), without building the transposed view
// (these checks run for every one-token product, where each extra tensor costs).
inline bool column_major(const at::Tensor& w) {
  return w.numel() == 0 ||
         ((w.size(0) <= 1 || w.stride(0) == 1) && (w.size(1) <= 1 || w.stride(1) == w.size(0)));
}

// `name` (a matrix w [N, M]) must be column-major.
inline void check_column_major(const char* op, const char* name, const at::Tensor& w) {
  TORCH_CHECK(column_major(w), op, ": ", name, " must be column-major (", name,
              ".t() contiguous), got strides ", w.strides());
}

struct LinearDims { int64_t N, M; };

// linear_one: x [N] or [1, N] and w [N, M] both bf16 or both fp32, w column-major (w.t()
// contiguous).
// `op` names the op in messages (linear_one_group names the product).
inline LinearDims check_linear_one(const at::Tensor& x, const at::Tensor& w,
                                   const char* op = "linear_one") {
  check_same_device(op, {{"x", &x}, {"w", &w}});
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op,
              ": x must be bfloat16 or float32, got ", dtype_name(x.scalar_type()));
  RWKV_CHECK_ONE_ROW(op, x);
  RWKV_CHECK_DTYPE_AS(op, w, x.scalar_type(), " (x's dtype)");
  RWKV_CHECK_DIM(op, w, "[N, M]", 2);
  const int64_t N = x.size(-1), M = w.size(1);
  RWKV_CHECK_SHAPE(op, w, "[N, M]", N, M);
  check_column_major(op, "w", w);
  return {N, M};
}

struct SlabDims { int64_t N, M, S; };

// linear_one_slabs: x [N] or [1, N] bfloat16 or float32; w [S, N/S, M], S >= 1 row slabs (slab s
// holds rows s*N/S.. of the matrix), each column-major (w[s].t() contiguous); w uint8 with side =
// mx, rx [M] and my, ry [N, 1] (x's dtype or float32), or w in x's dtype and side nullptr.
inline SlabDims check_slabs(const char* op, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor* side) {
  check_same_device(op, {{"x", &x}, {"w", &w}});
  if (side != nullptr) {
    check_same_device(op, {{"x", &x}, {"mx", &side[0]}, {"rx", &side[1]}, {"my", &side[2]},
                           {"ry", &side[3]}});
  }
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kBFloat16 || dt == at::kFloat, op,
              ": x must be bfloat16 or float32, got ", dtype_name(dt));
  RWKV_CHECK_ONE_ROW(op, x);
  RWKV_CHECK_DIM(op, w, "[S, N/S, M]", 3);
  const int64_t N = x.size(-1), S = w.size(0), K = w.size(1), M = w.size(2);
  TORCH_CHECK(S >= 1 && S * K == N, op, ": w must have shape [S, N/S, M] with S >= 1 slabs of N/S",
              " rows (N = ", N, "), got ", w.sizes());
  const bool column_major_slabs =
      w.numel() == 0 || ((K <= 1 || w.stride(1) == 1) && (M <= 1 || w.stride(2) == K));
  TORCH_CHECK(column_major_slabs, op,
              ": w's slabs must be column-major (w[s].t() contiguous), got strides ", w.strides());
  if (side == nullptr) {
    RWKV_CHECK_DTYPE_AS(op, w, dt, " (x's dtype)");
    return {N, M, S};
  }
  RWKV_CHECK_DTYPE(op, w, at::kByte);
  check_side(op, side[0], side[1], side[2], side[3], dt, N, M, true);
  return {N, M, S};
}

// A token-shift op's activation `name` [T, C] (float32 or bfloat16) and its shift state sx [C]
// in the same dtype; returns {T, C}.
inline std::pair<int64_t, int64_t> check_activation_and_shift(const char* op, const char* name,
                                                              const at::Tensor& x,
                                                              const at::Tensor& sx) {
  check_activation_dtype(op, name, x);
  TORCH_CHECK(x.dim() == 2, op, ": ", name, " must have shape [T, C], got ", x.sizes());
  const std::string why = std::string(" (") + name + "'s dtype)";
  check_channel_vectors(op, {{"sx", &sx}}, x.size(1), x.scalar_type(), why.c_str());
  return {x.size(0), x.size(1)};
}

struct LnMixDims { int64_t T, C, n; };

// The layer norm's w, b [C] and the mixes [n, C], all float32 (ln_mix and ln_mix_rows); returns n.
inline int64_t check_norm_and_mix(const char* op, const at::Tensor& w, const at::Tensor& b,
                                  const at::Tensor& mix, int64_t C) {
  check_channel_vectors(op, {{"w", &w}, {"b", &b}}, C);
  RWKV_CHECK_DTYPE(op, mix, at::kFloat);
  RWKV_CHECK_DIM(op, mix, "[n, C]", 2);
  const int64_t n = mix.size(0);
  RWKV_CHECK_SHAPE(op, mix, "[n, C]", n, C);
  return n;
}

// ln_mix: x [T, C] float32 or bfloat16 (the results' dtype); sx [C] in x's dtype; w, b [C] and
// mix [n, C] float32. op: ln_mix or ln_mix_split (the same arguments).
inline LnMixDims check_ln_mix(const at::Tensor& x, const at::Tensor& sx, const at::Tensor& w,
                              const at::Tensor& b, const at::Tensor& mix,
                              const char* op = "ln_mix") {
  check_same_device(op, {{"x", &x}, {"sx", &sx}, {"w", &w}, {"b", &b}, {"mix", &mix}});
  const auto [T, C] = check_activation_and_shift(op, "x", x, sx);
  return {T, C, check_norm_and_mix(op, w, b, mix, C)};
}

struct MaaMixDims { int64_t T, C, n, D; };

// maa_mix's w2 [n, D, C], float32 or bfloat16 (the same two dtypes as the activations); returns
// (n, D).
inline std::pair<int64_t, int64_t> check_maa_w2(const char* op, const at::Tensor& w2, int64_t C) {
  check_activation_dtype(op, "w2", w2);
  RWKV_CHECK_DIM(op, w2, "[n, D, C]", 3);
  const int64_t n = w2.size(0), D = w2.size(1);
  RWKV_CHECK_SHAPE(op, w2, "[n, D, C]", n, D, C);
  return {n, D};
}

// maa_mix: xx [T, C] float32 or bfloat16 (the result's dtype); sx [C] and z [T, n*D] in xx's
// dtype; w2 [n, D, C] float32 or bfloat16; maa [n, C] float32. op: maa_mix or maa_mix_split.
inline MaaMixDims check_maa_mix(const at::Tensor& xx, const at::Tensor& sx, const at::Tensor& z,
                                const at::Tensor& w2, const at::Tensor& maa,
                                const char* op = "maa_mix") {
  check_same_device(op, {{"xx", &xx}, {"sx", &sx}, {"z", &z}, {"w2", &w2}, {"maa", &maa}});
  const auto [T, C] = check_activation_and_shift(op, "xx", xx, sx);
  const auto [n, D] = check_maa_w2(op, w2, C);
  check_rows(op, "[T, n*D]", {{"z", &z}}, T, n * D, xx.scalar_type(), " (xx's dtype)");
  check_rows(op, "[n, C]", {{"maa", &maa}}, n, C);
  return {T, C, n, D};
}

// maa_lora_one: maa_mix_split of one token whose z is linear_one(xw, w1): xx [1, C] float32 or
// bfloat16 (the results' dtype); sx [C] and xw [1, C] in xx's dtype; w1 [C, n*D] in xx's dtype,
// column-major (w1.t() contiguous); w2 [n, D, C] float32 or bfloat16; maa [n, C] float32.
inline MaaMixDims check_maa_lora_one(const at::Tensor& xx, const at::Tensor& sx,
                                     const at::Tensor& xw, const at::Tensor& w1,
                                     const at::Tensor& w2, const at::Tensor& maa) {
  const char* op = "maa_lora_one";
  check_same_device(op, {{"xx", &xx}, {"sx", &sx}, {"xw", &xw}, {"w1", &w1}, {"w2", &w2},
                         {"maa", &maa}});
  const auto [T, C] = check_activation_and_shift(op, "xx", xx, sx);
  TORCH_CHECK(T == 1, op, ": xx must be one token, shape [1, C], got ", xx.sizes());
  check_rows(op, "[1, C]", {{"xw", &xw}}, 1, C, xx.scalar_type(), " (xx's dtype)");
  const auto [n, D] = check_maa_w2(op, w2, C);
  RWKV_CHECK_DTYPE_AS(op, w1, xx.scalar_type(), " (xx's dtype)");
  RWKV_CHECK_DIM(op, w1, "[C, n*D]", 2);
  RWKV_CHECK_SHAPE(op, w1, "[C, n*D]", C, n * D);
  check_column_major(op, "w1", w1);
  check_rows(op, "[n, C]", {{"maa", &maa}}, n, C);
  return {T, C, n, D};
}

}  // namespace rwkv
