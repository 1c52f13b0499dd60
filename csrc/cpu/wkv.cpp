// ATen glue for the WKV recurrences on CPU (wkv4_forward, wkv5_forward, wkv6_forward,
// wkv7_forward): input checks in the contract's words, at::parallel_for over independent
// channels or heads, then the kernel row of the active instruction set (cpu_features.h).
// Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/wkv*.h and docs/kernels.md.
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

// Splits [0, units) so that each task gets at least ~32k multiply-adds (threads cost ~µs).
int64_t grain_for(int64_t work_per_unit) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, work_per_unit));
}

// r-like [T, H*N] fp32 input: checked, then made contiguous.
#define RWKV_CHECK_ROWS(op, x, T, C) \
  RWKV_CHECK_DTYPE(op, x, at::kFloat);   \
  RWKV_CHECK_SHAPE(op, x, "[T, H*N]", T, C)

at::Tensor wkv4_forward(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                        const at::Tensor& v, at::Tensor& aa, at::Tensor& bb, at::Tensor& pp) {
  const char* op = "wkv4_forward";
  RWKV_CHECK_SAME_DEVICE(op, k, w);
  RWKV_CHECK_SAME_DEVICE(op, k, u);
  RWKV_CHECK_SAME_DEVICE(op, k, v);
  RWKV_CHECK_SAME_DEVICE(op, k, aa);
  RWKV_CHECK_SAME_DEVICE(op, k, bb);
  RWKV_CHECK_SAME_DEVICE(op, k, pp);
  RWKV_CHECK_DTYPE(op, k, at::kFloat);
  RWKV_CHECK_DIM(op, k, "[T, C]", 2);
  const int64_t T = k.size(0), C = k.size(1);
  RWKV_CHECK_DTYPE(op, v, at::kFloat);
  RWKV_CHECK_SHAPE(op, v, "[T, C]", T, C);
  RWKV_CHECK_DTYPE(op, w, at::kFloat);
  RWKV_CHECK_SHAPE(op, w, "[C]", C);
  RWKV_CHECK_DTYPE(op, u, at::kFloat);
  RWKV_CHECK_SHAPE(op, u, "[C]", C);
  RWKV_CHECK_DTYPE(op, aa, at::kFloat);
  RWKV_CHECK_SHAPE(op, aa, "[C]", C);
  RWKV_CHECK_DTYPE(op, bb, at::kFloat);
  RWKV_CHECK_SHAPE(op, bb, "[C]", C);
  RWKV_CHECK_DTYPE(op, pp, at::kFloat);
  RWKV_CHECK_SHAPE(op, pp, "[C]", C);
  RWKV_CHECK_CONTIGUOUS(op, aa);
  RWKV_CHECK_CONTIGUOUS(op, bb);
  RWKV_CHECK_CONTIGUOUS(op, pp);

  const at::Tensor wc = w.contiguous(), uc = u.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous();
  at::Tensor y = at::empty({T, C}, k.options());
  const KernelTable& kt = kernels();
  // Blocks of 16 channels keep every task's range a multiple of any register width.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, grain_for(T * kBlock * 8), [&](int64_t b0, int64_t b1) {
    kt.wkv4(T, C, b0 * kBlock, std::min(C, b1 * kBlock), wc.data_ptr<float>(),
            uc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(),
            aa.data_ptr<float>(), bb.data_ptr<float>(), pp.data_ptr<float>(),
            y.data_ptr<float>());
  });
  return y;
}

// Checks the [H, N, N] state shared by wkv5/6/7; returns H and N.
#define RWKV_CHECK_STATE(op, state, H, N)                  \
  RWKV_CHECK_DTYPE(op, state, at::kFloat);                 \
  RWKV_CHECK_DIM(op, state, "[H, N, N]", 3);               \
  const int64_t H = state.size(0), N = state.size(1);      \
  RWKV_CHECK_SHAPE(op, state, "[H, N, N]", H, N, N);       \
  RWKV_CHECK_CONTIGUOUS(op, state)

at::Tensor wkv56_forward(const char* op, bool w_per_token, at::Tensor& state,
                         const at::Tensor& r, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& w, const at::Tensor& u) {
  RWKV_CHECK_SAME_DEVICE(op, state, r);
  RWKV_CHECK_SAME_DEVICE(op, state, k);
  RWKV_CHECK_SAME_DEVICE(op, state, v);
  RWKV_CHECK_SAME_DEVICE(op, state, w);
  RWKV_CHECK_SAME_DEVICE(op, state, u);
  RWKV_CHECK_STATE(op, state, H, N);
  RWKV_CHECK_DTYPE(op, r, at::kFloat);
  RWKV_CHECK_DIM(op, r, "[T, H*N]", 2);
  const int64_t T = r.size(0);
  RWKV_CHECK_ROWS(op, r, T, H * N);
  RWKV_CHECK_ROWS(op, k, T, H * N);
  RWKV_CHECK_ROWS(op, v, T, H * N);
  if (w_per_token) {
    RWKV_CHECK_ROWS(op, w, T, H * N);
  } else {
    RWKV_CHECK_DTYPE(op, w, at::kFloat);
    RWKV_CHECK_SHAPE(op, w, "[H, N]", H, N);
  }
  RWKV_CHECK_DTYPE(op, u, at::kFloat);
  RWKV_CHECK_SHAPE(op, u, "[H, N]", H, N);

  const at::Tensor rc = r.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
                   wc = w.contiguous(), uc = u.contiguous();
  at::Tensor y = at::empty({T, H * N}, r.options());
  const KernelTable& kt = kernels();
  const int64_t w_step = w_per_token ? H * N : 0;
  at::parallel_for(0, H, grain_for(T * N * N), [&](int64_t h0, int64_t h1) {
    kt.wkv56(T, H, N, h0, h1, state.data_ptr<float>(), rc.data_ptr<float>(),
             kc.data_ptr<float>(), vc.data_ptr<float>(), wc.data_ptr<float>(), w_step,
             uc.data_ptr<float>(), y.data_ptr<float>());
  });
  return y;
}

at::Tensor wkv5_forward(at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& w, const at::Tensor& u) {
  return wkv56_forward("wkv5_forward", false, state, r, k, v, w, u);
}

at::Tensor wkv6_forward(at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& w, const at::Tensor& u) {
  return wkv56_forward("wkv6_forward", true, state, r, k, v, w, u);
}

at::Tensor wkv7_forward(at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                        const at::Tensor& b) {
  const char* op = "wkv7_forward";
  RWKV_CHECK_SAME_DEVICE(op, state, r);
  RWKV_CHECK_SAME_DEVICE(op, state, w);
  RWKV_CHECK_SAME_DEVICE(op, state, k);
  RWKV_CHECK_SAME_DEVICE(op, state, v);
  RWKV_CHECK_SAME_DEVICE(op, state, a);
  RWKV_CHECK_SAME_DEVICE(op, state, b);
  RWKV_CHECK_STATE(op, state, H, N);
  RWKV_CHECK_DTYPE(op, r, at::kFloat);
  RWKV_CHECK_DIM(op, r, "[T, H*N]", 2);
  const int64_t T = r.size(0);
  RWKV_CHECK_ROWS(op, r, T, H * N);
  RWKV_CHECK_ROWS(op, w, T, H * N);
  RWKV_CHECK_ROWS(op, k, T, H * N);
  RWKV_CHECK_ROWS(op, v, T, H * N);
  RWKV_CHECK_ROWS(op, a, T, H * N);
  RWKV_CHECK_ROWS(op, b, T, H * N);

  const at::Tensor rc = r.contiguous(), wc = w.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous(), ac = a.contiguous(), bc = b.contiguous();
  at::Tensor y = at::empty({T, H * N}, r.options());
  const KernelTable& kt = kernels();
  at::parallel_for(0, H, grain_for(T * N * N * 2), [&](int64_t h0, int64_t h1) {
    kt.wkv7(T, H, N, h0, h1, state.data_ptr<float>(), rc.data_ptr<float>(),
            wc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(),
            ac.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>());
  });
  return y;
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("wkv4_forward", &rwkv::cpu::wkv4_forward);
  m.impl("wkv5_forward", &rwkv::cpu::wkv5_forward);
  m.impl("wkv6_forward", &rwkv::cpu::wkv6_forward);
  m.impl("wkv7_forward", &rwkv::cpu::wkv7_forward);
}
