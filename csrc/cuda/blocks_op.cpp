// Torch glue for ln_mix and wkv7_block on CUDA (kernels: blocks.cu). Same checks and messages as
// the CPU ops (common/op_checks.h); CUDA also takes fp16 activations.
#include <ATen/core/Tensor.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "common/op_checks.h"
#include "cuda/glue.h"
#include "cuda/kernels.h"

namespace {

std::tuple<at::Tensor, at::Tensor> ln_mix_cuda(const at::Tensor& x, const at::Tensor& sx,
                                               const at::Tensor& w, const at::Tensor& b,
                                               const at::Tensor& mix, bool lerp, double eps) {
  const rwkv::LnMixDims d = rwkv::check_ln_mix(x, sx, w, b, mix);
  TORCH_INTERNAL_ASSERT(x.is_cuda());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), sxc = sx.contiguous(), wc = w.contiguous(),
                   bc = b.contiguous(), mc = mix.contiguous();
  at::Tensor xx = at::empty({d.T, d.C}, x.options());
  at::Tensor out = at::empty({d.n, d.T, d.C}, x.options());
  if (d.T == 0 || d.C == 0) return {xx, out};
  rwkv::cuda::ln_mix_forward(rwkv::cuda::act_of(x), d.T, d.C, d.n, xc.data_ptr(), sxc.data_ptr(),
                             wc.data_ptr<float>(), bc.data_ptr<float>(), mc.data_ptr<float>(),
                             lerp, static_cast<float>(eps), xx.data_ptr(), out.data_ptr(),
                             c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {xx, out};
}

at::Tensor wkv7_block_cuda(at::Tensor& state, const at::Tensor& r, const at::Tensor& w,
                           const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                           const at::Tensor& g, const c10::optional<at::Tensor>& v_first,
                           const c10::optional<at::Tensor>& v_gate, const at::Tensor& p,
                           double eps, const c10::optional<at::Tensor>& state_in) {
  const char* op = "wkv7_block";
  const auto [T, H, N] =
      rwkv::check_wkv7_block(state, r, w, k, v, a, g, v_first, v_gate, p, state_in);
  TORCH_INTERNAL_ASSERT(state.is_cuda());
  rwkv::check_cuda_head_size(op, N, rwkv::cuda::kWkvMaxHeadSize);
  const c10::cuda::OptionalCUDAGuard guard(state.device());
  // The recurrence kernel updates state in place: start it from state_in's values.
  if (state_in.has_value() && !state_in->is_same(state)) state.copy_(*state_in);
  const at::Tensor rc = r.contiguous(), wc = w.contiguous(), kc = k.contiguous(),
                   vc = v.contiguous(), ac = a.contiguous(), gc = g.contiguous(),
                   pc = p.contiguous();
  at::Tensor vfc, vgc;
  if (v_first.has_value()) {
    vfc = v_first->contiguous();
    vgc = v_gate->contiguous();
  }
  at::Tensor y = at::empty({T, H * N}, r.options());
  if (T == 0 || H == 0 || N == 0) return y;
  at::Tensor tmp = at::empty({rwkv::cuda::wkv7_block_tmp_floats(T, H, N)},
                             r.options().dtype(at::kFloat));
  rwkv::cuda::wkv7_block_forward(
      rwkv::cuda::act_of(r), T, H, N, state.data_ptr<float>(), rc.data_ptr(), wc.data_ptr(), kc.data_ptr(),
      vc.data_ptr(), ac.data_ptr(), gc.data_ptr(), vfc.defined() ? vfc.data_ptr() : nullptr,
      vgc.defined() ? vgc.data_ptr() : nullptr, pc.data_ptr<float>(), static_cast<float>(eps),
      tmp.data_ptr<float>(), y.data_ptr(), c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) {
  m.impl("ln_mix", &ln_mix_cuda);
  m.impl("wkv7_block", &wkv7_block_cuda);
}
