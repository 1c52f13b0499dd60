// ATen glue for the WKV recurrences on CPU (wkv4_forward, wkv5_forward, wkv6_forward,
// wkv7_forward, wkv4_block, wkv6_block, wkv7_block; and pooled_empty_like, the block ops' new
// states): the shared input checks (common/op_checks.h), at::parallel_for over independent
// channels or heads, then the kernel row of the active instruction set (cpu_features.h). The
// block ops' activations may be fp32 or bf16 (cpu/float_io.h): their kernels compute in fp32.
// Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/wkv*.h and docs/kernels.md.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/float_io.h"
#include "cpu/into.h"
#include "cpu/pooled.h"
#include "cpu/scratch.h"

namespace rwkv {
namespace cpu {
namespace {

// Splits [0, units) so that each task gets at least ~32k multiply-adds (threads cost ~µs).
int64_t grain_for(int64_t work_per_unit) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, work_per_unit));
}

const float* in(const at::Tensor& t) { return t.data_ptr<float>(); }

at::Tensor wkv4_forward(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                        const at::Tensor& v, at::Tensor& aa, at::Tensor& bb, at::Tensor& pp) {
  const Wkv4Dims d = check_wkv4(w, u, k, v, aa, bb, pp);
  const at::Tensor wc = w.contiguous(), uc = u.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous();
  at::Tensor y = pooled_empty({d.T, d.C}, at::kFloat);
  const KernelTable& kt = kernels();
  // Blocks of 16 channels keep every task's range a multiple of any register width.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (d.C + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, grain_for(d.T * kBlock * 8), [&](int64_t b0, int64_t b1) {
    kt.wkv4(d.T, d.C, b0 * kBlock, std::min(d.C, b1 * kBlock), in(wc), in(uc), in(kc), in(vc),
            aa.data_ptr<float>(), bb.data_ptr<float>(), pp.data_ptr<float>(),
            y.data_ptr<float>());
  });
  return y;
}

// A block kernel's working memory, n floats: for one token (T == 1) a buffer of this thread's, for
// sequences a tensor kept in `held` (no tensor per call while decoding).
float* kernel_scratch(int64_t T, int64_t n, at::Tensor& held) {
  if (T == 1) {
    thread_local Scratch buf;  // one block op at a time per thread
    return buf.get<float>(n);
  }
  held = pooled_empty({n}, at::kFloat);
  return held.data_ptr<float>();
}

// r * y in r's dtype over channels [c0, c1) of T rows of C: fp32, or bf16 with y rounded to bf16
// first (each step rounded as the torch ops that this replaces round it). y may be out (fp32).
void gate_rows(int64_t T, int64_t C, int64_t c0, int64_t c1, const float* y, const at::Tensor& r,
               const at::Tensor& out) {
  if (r.scalar_type() == at::kFloat) {
    const float* rp = r.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = c0; c < c1; ++c) o[t * C + c] = rp[t * C + c] * y[t * C + c];
    return;
  }
  const c10::BFloat16* rp = r.data_ptr<c10::BFloat16>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = c0; c < c1; ++c) {
      const float yr = static_cast<float>(c10::BFloat16(y[t * C + c]));
      o[t * C + c] = c10::BFloat16(static_cast<float>(rp[t * C + c]) * yr);
    }
}

// One RWKV-4 time mix between its projections and the output projection: the recurrence from
// the old state (read, never written) into a new one, then the gate. One op where the model ran
// three state clones, wkv4_forward, the gate's multiply and (bf16) three conversions: k and v may
// come in the activation dtype, as the products return them.
std::vector<at::Tensor> wkv4_block(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& r, const at::Tensor& aa,
                                   const at::Tensor& bb, const at::Tensor& pp) {
  const Wkv4Dims d = check_wkv4_block(w, u, k, v, r, aa, bb, pp);
  const at::Tensor wc = w.contiguous(), uc = u.contiguous(), rc = r.contiguous();
  Fp32Inputs in32(d.T, 2 * d.T * d.C);  // k and v in fp32 (bf16 ones widened, exactly)
  const float *kp = in32(k), *vp = in32(v);
  std::vector<at::Tensor> res;
  res.reserve(4);
  res.push_back(pooled_empty({d.T, d.C}, r.scalar_type()));
  float* st[3];
  int i = 0;
  for (const at::Tensor* old : {&aa, &bb, &pp}) {  // contiguous (checked)
    res.push_back(pooled_empty({d.C}, at::kFloat));
    st[i] = res.back().data_ptr<float>();
    std::copy_n(old->data_ptr<float>(), d.C, st[i++]);
  }
  const at::Tensor& out = res[0];
  at::Tensor held;
  float* y = r.scalar_type() == at::kFloat ? out.data_ptr<float>()
                                           : kernel_scratch(d.T, d.T * d.C, held);
  const KernelTable& kt = kernels();
  constexpr int64_t kBlock = 16;  // as in wkv4_forward
  const int64_t blocks = (d.C + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, grain_for(d.T * kBlock * 8), [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * kBlock, c1 = std::min(d.C, b1 * kBlock);
    kt.wkv4(d.T, d.C, c0, c1, in(wc), in(uc), kp, vp, st[0], st[1], st[2], y);
    gate_rows(d.T, d.C, c0, c1, y, rc, out);
  });
  return res;
}

at::Tensor wkv56_forward(const char* op, bool w_per_token, at::Tensor& state,
                         const at::Tensor& r, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& w, const at::Tensor& u) {
  const WkvDims d = check_wkv56(op, w_per_token, state, r, k, v, w, u);
  const at::Tensor rc = r.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
                   wc = w.contiguous(), uc = u.contiguous();
  at::Tensor y = pooled_empty({d.T, d.H * d.N}, at::kFloat);
  const KernelTable& kt = kernels();
  const int64_t w_step = w_per_token ? d.H * d.N : 0;
  at::parallel_for(0, d.H, grain_for(d.T * d.N * d.N), [&](int64_t h0, int64_t h1) {
    kt.wkv56(d.T, d.H, d.N, h0, h1, state.data_ptr<float>(), in(rc), in(kc), in(vc), in(wc),
             w_step, in(uc), y.data_ptr<float>());
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
  const WkvDims d = check_wkv7(state, r, w, k, v, a, b);
  const at::Tensor rc = r.contiguous(), wc = w.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous(), ac = a.contiguous(), bc = b.contiguous();
  at::Tensor y = pooled_empty({d.T, d.H * d.N}, at::kFloat);
  const KernelTable& kt = kernels();
  at::parallel_for(0, d.H, grain_for(d.T * d.N * d.N * 2), [&](int64_t h0, int64_t h1) {
    kt.wkv7(d.T, d.H, d.N, h0, h1, state.data_ptr<float>(), in(rc), in(wc), in(kc), in(vc),
            in(ac), in(bc), y.data_ptr<float>());
  });
  return y;
}

}  // namespace

at::Tensor wkv6_block_into(at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& w, const at::Tensor& g,
                           const at::Tensor& p, double eps,
                           const c10::optional<at::Tensor>& state_in, Into into) {
  const WkvDims d = check_wkv6_block(state, r, k, v, w, g, p, state_in);
  // r, k, v, w and g in fp32 (bf16 ones widened; fp32 ones as they are where contiguous).
  Fp32Inputs in32(d.T, 5 * g.numel());
  const float *rp = in32(r), *kp = in32(k), *vp = in32(v), *wp = in32(w), *gp = in32(g);
  const at::ScalarType dt = g.scalar_type();
  const Fp32Result y({d.T, d.H * d.N}, dt, result_room(d.T, d.H * d.N, dt), into_at(into, 0));
  at::Tensor held;
  float* scratch = kernel_scratch(d.T, d.H * d.N, held);
  const KernelTable& kt = kernels();
  at::parallel_for(0, d.H, grain_for(d.T * d.N * d.N), [&](int64_t h0, int64_t h1) {
    kt.wkv6_block(d.T, d.H, d.N, h0, h1, state.data_ptr<float>(),
                  state_in.has_value() ? in(*state_in) : nullptr, rp, kp, vp, wp, gp, in(p),
                  static_cast<float>(eps), scratch + h0 * d.N, y.data());
  });
  return y.take();
}

at::Tensor wkv7_block_into(at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                           const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                           const at::Tensor& g, const c10::optional<at::Tensor>& v_first,
                           const c10::optional<at::Tensor>& v_gate, const at::Tensor& p,
                           double eps, const c10::optional<at::Tensor>& state_in, Into into) {
  const WkvDims d = check_wkv7_block(state, r, w, k, v, a, g, v_first, v_gate, p, state_in);
  const int64_t C = d.H * d.N, n = d.T * C;
  // The activations in fp32 (r, w, k, v, a, g, then v_first and v_gate), and the kernel's
  // scratch [H, 6N]: for one token in this thread's buffers, for sequences as tensors.
  Fp32Inputs in32(d.T, 8 * n);
  const float *rp = in32(r), *wp = in32(w), *kp = in32(k), *vp = in32(v), *ap = in32(a),
              *gp = in32(g);
  const float *vfp = nullptr, *vgp = nullptr;
  if (v_first.has_value()) {
    vfp = in32(*v_first);
    vgp = in32(*v_gate);
  }
  const at::ScalarType dt = r.scalar_type();
  const Fp32Result y({d.T, C}, dt, result_room(d.T, n, dt), into_at(into, 0));
  at::Tensor held;
  float* scratch = kernel_scratch(d.T, 6 * C, held);
  const KernelTable& kt = kernels();
  at::parallel_for(0, d.H, grain_for(d.T * d.N * d.N * 2), [&](int64_t h0, int64_t h1) {
    kt.wkv7_block(d.T, d.H, d.N, h0, h1, state.data_ptr<float>(),
                  state_in.has_value() ? in(*state_in) : nullptr, rp, wp, kp, vp, ap, gp, vfp,
                  vgp, in(p), static_cast<float>(eps), scratch + h0 * 6 * d.N,
                  y.data());
  });
  return y.take();
}

namespace {

at::Tensor wkv6_block(at::Tensor& state, const at::Tensor& r, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& w, const at::Tensor& g,
                      const at::Tensor& p, double eps, const c10::optional<at::Tensor>& state_in) {
  return wkv6_block_into(state, r, k, v, w, g, p, eps, state_in, {});
}

at::Tensor wkv7_block(at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                      const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                      const at::Tensor& g, const c10::optional<at::Tensor>& v_first,
                      const c10::optional<at::Tensor>& v_gate, const at::Tensor& p, double eps,
                      const c10::optional<at::Tensor>& state_in) {
  return wkv7_block_into(state, r, w, k, v, a, g, v_first, v_gate, p, eps, state_in, {});
}

// The new matrix state a block op writes (the schema's comment, rwkv/ops/_schemas.py): memory
// from the block pool.
at::Tensor pooled_empty_like(const at::Tensor& t) {
  return pooled_empty(t.sizes(), t.scalar_type());
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("wkv4_forward", &rwkv::cpu::wkv4_forward);
  m.impl("wkv4_block", &rwkv::cpu::wkv4_block);
  m.impl("wkv5_forward", &rwkv::cpu::wkv5_forward);
  m.impl("wkv6_forward", &rwkv::cpu::wkv6_forward);
  m.impl("wkv7_forward", &rwkv::cpu::wkv7_forward);
  m.impl("wkv6_block", &rwkv::cpu::wkv6_block);
  m.impl("wkv7_block", &rwkv::cpu::wkv7_block);
  m.impl("pooled_empty_like", &rwkv::cpu::pooled_empty_like);
}
