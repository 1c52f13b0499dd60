// ATen glue for the token-shift mixes on CPU: ln_mix (the layer norm, token shift and mixes that
// begin each half of every block) and maa_mix (RWKV-6's data-dependent token shift after its
// first low-rank product), each one call instead of several small torch ops (docs/kernels.md
// says why). One row, the decode case, runs ln_mix inline; longer inputs split rows between
// threads, the layer norm first since each row's mixes read the row before. maa_mix splits
// channels for sequences and, for one token, w2's rows by half-mixes (kernels/maa_mix.h says why). Activations may be fp32 or bf16 (cpu/float_io.h): the kernels compute in fp32.
// Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/ln_mix.h and maa_mix.h.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/float_io.h"
#include "cpu/parallel.h"
#include "cpu/pooled.h"

namespace rwkv {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> ln_mix(const at::Tensor& x, const at::Tensor& sx,
                                          const at::Tensor& w, const at::Tensor& b,
                                          const at::Tensor& mix, bool lerp, double eps) {
  const LnMixDims d = check_ln_mix(x, sx, w, b, mix);
  Fp32Inputs in32(d.T, x.numel() + sx.numel());
  const float *xp = in32(x), *sxp = in32(sx);
  const at::Tensor wc = w.contiguous(), bc = b.contiguous(), mc = mix.contiguous();
  const at::ScalarType dt = x.scalar_type();
  float* room = result_room(d.T, (d.n + 1) * d.C, dt);
  const Fp32Result xx({d.T, d.C}, dt, room);
  const Fp32Result out({d.n, d.T, d.C}, dt, room != nullptr ? room + d.C : nullptr);
  const KernelTable& kt = kernels();
  float* xxp = xx.data();
  const auto norm = [&](int64_t t0, int64_t t1) {
    kt.layer_norm(d.C, t0, t1, xp, wc.data_ptr<float>(), bc.data_ptr<float>(),
                  static_cast<float>(eps), xxp);
  };
  const auto mixes = [&](int64_t t0, int64_t t1) {
    kt.shift_mix(d.T, d.C, d.n, t0, t1, xxp, sxp, mc.data_ptr<float>(), lerp, out.data());
  };
  if (d.T == 1) {  // one token: no parallel region (its fork and join cost more than the work)
    norm(0, 1);
    mixes(0, 1);
  } else {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.C));
    at::parallel_for(0, d.T, grain, norm);
    at::parallel_for(0, d.T, grain, mixes);
  }
  return {xx.take(), out.take()};
}

at::Tensor maa_mix(const at::Tensor& xx, const at::Tensor& sx, const at::Tensor& z,
                   const at::Tensor& w2, const at::Tensor& maa) {
  const MaaMixDims d = check_maa_mix(xx, sx, z, w2, maa);
  Fp32Inputs in32(d.T, xx.numel() + sx.numel() + z.numel());
  const float *xp = in32(xx), *sxp = in32(sx), *zp = in32(z);
  const at::Tensor wc = w2.contiguous(), mc = maa.contiguous();
  const at::ScalarType dt = xx.scalar_type();
  const Fp32Result out({d.n, d.T, d.C}, dt, result_room(d.T, d.n * d.C, dt));
  // tanh(z) once (T*n*D values), before the threads share it.
  std::vector<float> zt(static_cast<size_t>(d.T * d.n * d.D));
  for (size_t i = 0; i < zt.size(); ++i) zt[i] = std::tanh(zp[i]);
  const KernelTable& kt = kernels();
  const bool bf16_w2 = wc.scalar_type() == at::kBFloat16;
  if (d.T == 1) {  // one token: w2 read by half-mixes (kernels/maa_mix.h), then the mixes
    // This thread's buffer; the workers use it through the pointer (a thread_local named in
    // the lambda would be the worker's own).
    thread_local std::vector<float> acc_buf;
    acc_buf.resize(static_cast<size_t>(2 * d.n * d.C));
    float* acc = acc_buf.data();
    for_blocks(2 * d.n, 1, (d.D + 1) / 2 * d.C, [&](int64_t u0, int64_t u1) {
      if (bf16_w2) {
        kt.maa_half_sums_bf16(d.C, d.D, u0, u1, zt.data(),
                              reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>()),
                              acc);
      } else {
        kt.maa_half_sums_f32(d.C, d.D, u0, u1, zt.data(), wc.data_ptr<float>(), acc);
      }
    });
    for_blocks(d.C, 64, 3 * d.n, [&](int64_t c0, int64_t c1) {
      kt.maa_finish(d.C, d.n, c0, c1, xp, sxp, acc, mc.data_ptr<float>(), out.data());
    });
    return out.take();
  }
  // Sequences: blocks of 64 channels.
  for_blocks(d.C, 64, d.T * d.n * d.D, [&](int64_t c0, int64_t c1) {
    const float* m = mc.data_ptr<float>();
    float* o = out.data();
    if (bf16_w2) {
      kt.maa_mix_bf16(d.T, d.C, d.n, d.D, c0, c1, xp, sxp, zt.data(),
                      reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>()), m, o);
    } else {
      kt.maa_mix_f32(d.T, d.C, d.n, d.D, c0, c1, xp, sxp, zt.data(), wc.data_ptr<float>(), m, o);
    }
  });
  return out.take();
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("ln_mix", &rwkv::cpu::ln_mix);
  m.impl("maa_mix", &rwkv::cpu::maa_mix);
}
