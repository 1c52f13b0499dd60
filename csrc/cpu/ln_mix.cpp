// ATen glue for ln_mix on CPU: the layer norm, token shift and mixes that begin each half of
// every block, in one call (docs/kernels.md says why). One row, the decode case, runs inline;
// longer inputs split rows between threads, the layer norm first since each row's mixes read
// the row before. Schema: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/ln_mix.h.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "common/op_checks.h"
#include "cpu/cpu_features.h"

namespace rwkv {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> ln_mix(const at::Tensor& x, const at::Tensor& sx,
                                          const at::Tensor& w, const at::Tensor& b,
                                          const at::Tensor& mix, bool lerp, double eps) {
  const LnMixDims d = check_ln_mix(x, sx, w, b, mix);
  const at::Tensor xc = x.contiguous(), sxc = sx.contiguous(), wc = w.contiguous(),
                   bc = b.contiguous(), mc = mix.contiguous();
  at::Tensor xx = at::empty({d.T, d.C}, x.options());
  at::Tensor out = at::empty({d.n, d.T, d.C}, x.options());
  const KernelTable& kt = kernels();
  const float* xp = xc.data_ptr<float>();
  float* xxp = xx.data_ptr<float>();
  const auto norm = [&](int64_t t0, int64_t t1) {
    kt.layer_norm(d.C, t0, t1, xp, wc.data_ptr<float>(), bc.data_ptr<float>(),
                  static_cast<float>(eps), xxp);
  };
  const auto mixes = [&](int64_t t0, int64_t t1) {
    kt.shift_mix(d.T, d.C, d.n, t0, t1, xxp, sxc.data_ptr<float>(), mc.data_ptr<float>(), lerp,
                 out.data_ptr<float>());
  };
  if (d.T == 1) {  // one token: no parallel region (its fork and join cost more than the work)
    norm(0, 1);
    mixes(0, 1);
  } else {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.C));
    at::parallel_for(0, d.T, grain, norm);
    at::parallel_for(0, d.T, grain, mixes);
  }
  return {xx, out};
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) { m.impl("ln_mix", &rwkv::cpu::ln_mix); }
