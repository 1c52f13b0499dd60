// ATen glue for the token-shift mixes on CPU: ln_mix (the layer norm, token shift and mixes that
// begin each half of every block) and maa_mix (RWKV-6's data-dependent token shift after its
// first low-rank product), each one call instead of several small torch ops (docs/kernels.md
// says why). One row, the decode case, runs ln_mix inline; longer inputs split rows between
// threads, the layer norm first since each row's mixes read the row before. maa_mix splits
// channels for sequences and, for one token, w2's rows by half-mixes (kernels/maa_mix.h says
// why). ln_mix_split and maa_mix_split return the same values as separate tensors (the model's
// one-token path: no selects or unbind after them). Activations may be fp32 or bf16
// (cpu/float_io.h): the kernels compute in fp32.
// Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/ln_mix.h and maa_mix.h.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/float_io.h"
#include "cpu/into.h"
#include "cpu/parallel.h"
#include "cpu/pooled.h"
#include "cpu/product_columns.h"

namespace rwkv {
namespace cpu {
namespace {

// Where a mix op computes its n results [T, C] (fp32), then returns them in dt: one [n, T, C]
// tensor (ln_mix, maa_mix) or n tensors [T, C] (the _split ops). ptrs()[i] is result i's memory.
class MixResults {
 public:
  // room: (n * T * C floats) where result_room() gave some, else nullptr (fp32 tensors).
  // into: (split) the tensors results i take (into.h), where given.
  MixResults(int64_t n, int64_t T, int64_t C, at::ScalarType dt, float* room, bool split,
             Into into = {}) {
    if (!split) parts_.emplace_back(at::IntArrayRef{n, T, C}, dt, room);
    for (int64_t i = 0; i < n; ++i) {
      float* mem = room != nullptr ? room + i * T * C : nullptr;
      if (split) parts_.emplace_back(at::IntArrayRef{T, C}, dt, mem, into_at(into, i));
      ptrs_.push_back(split ? parts_.back().data() : parts_[0].data() + i * T * C);
    }
  }
  float* const* ptrs() const { return ptrs_.data(); }
  at::Tensor stacked() const { return parts_[0].take(); }
  void take_into(std::vector<at::Tensor>& out) const {
    for (const Fp32Result& p : parts_) out.push_back(p.take());
  }

 private:
  c10::SmallVector<Fp32Result, 6> parts_;
  c10::SmallVector<float*, 6> ptrs_;
};

// The values of one row of C floats (the new shift state) as a [C] tensor in dt: into itself
// where given (a plan's result tensor made at its start, cpu/step_plan.cpp), else a new one.
at::Tensor row_values(const float* row, int64_t C, at::ScalarType dt, const at::Tensor* into) {
  if (into != nullptr) check_into(*into, {C}, dt, "ln_mix_split's new shift state");
  at::Tensor t = into != nullptr ? *into : pooled_empty({C}, dt);
  if (dt == at::kFloat) {
    std::memcpy(t.data_ptr<float>(), row, static_cast<size_t>(C) * sizeof(float));
  } else {
    narrow_into(row, t);
  }
  return t;
}

// ln_mix's computation. Its results: [xx, mixed [n, T, C]]; split (ln_mix_split): [xx, the new
// shift state (xx's last row; sx's values when T is 0), the n mixes [T, C] as separate tensors].
// While decoding, selects and an unbind to split ln_mix's results would each be a dispatcher
// round trip with torch's code and data flushed from the caches by the weights.
// into (split only): ln_mix_split's results (into.h).
std::vector<at::Tensor> run_ln_mix(const at::Tensor& x, const at::Tensor& sx, const at::Tensor& w,
                                   const at::Tensor& b, const at::Tensor& mix, bool lerp,
                                   double eps, bool split, Into into = {}) {
  const LnMixDims d = check_ln_mix(x, sx, w, b, mix, split ? "ln_mix_split" : "ln_mix");
  Fp32Inputs in32(d.T, x.numel() + sx.numel());
  const float *xp = in32(x), *sxp = in32(sx);
  const at::Tensor wc = w.contiguous(), bc = b.contiguous(), mc = mix.contiguous();
  const at::ScalarType dt = x.scalar_type();
  float* room = result_room(d.T, (d.n + 1) * d.C, dt);
  const Fp32Result xx({d.T, d.C}, dt, room, into_at(into, 0));
  const MixResults out(d.n, d.T, d.C, dt, room != nullptr ? room + d.C : nullptr, split,
                       into.size() > 2 ? into.slice(2) : Into());
  const KernelTable& kt = kernels();
  float* xxp = xx.data();
  const auto norm = [&](int64_t t0, int64_t t1) {
    kt.layer_norm(d.C, t0, t1, xp, wc.data_ptr<float>(), bc.data_ptr<float>(),
                  static_cast<float>(eps), xxp);
  };
  const auto mixes = [&](int64_t t0, int64_t t1) {
    kt.shift_mix(d.T, d.C, d.n, t0, t1, xxp, sxp, mc.data_ptr<float>(), lerp, out.ptrs());
  };
  if (d.T == 1) {  // one token: no parallel region (its fork and join cost more than the work)
    norm(0, 1);
    mixes(0, 1);
  } else {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.C));
    at::parallel_for(0, d.T, grain, norm);
    at::parallel_for(0, d.T, grain, mixes);
  }
  std::vector<at::Tensor> res;
  res.reserve(static_cast<size_t>(d.n + 2));
  res.push_back(xx.take());
  if (!split) {
    res.push_back(out.stacked());
  } else {
    res.push_back(row_values(d.T > 0 ? xxp + (d.T - 1) * d.C : sxp, d.C, dt, into_at(into, 1)));
    out.take_into(res);
  }
  return res;
}

std::tuple<at::Tensor, at::Tensor> ln_mix(const at::Tensor& x, const at::Tensor& sx,
                                          const at::Tensor& w, const at::Tensor& b,
                                          const at::Tensor& mix, bool lerp, double eps) {
  std::vector<at::Tensor> res = run_ln_mix(x, sx, w, b, mix, lerp, eps, false);
  return {std::move(res[0]), std::move(res[1])};
}

std::vector<at::Tensor> ln_mix_split(const at::Tensor& x, const at::Tensor& sx,
                                     const at::Tensor& w, const at::Tensor& b,
                                     const at::Tensor& mix, bool lerp, double eps) {
  return run_ln_mix(x, sx, w, b, mix, lerp, eps, true);
}

// maa_mix's and maa_mix_split's computation into outs (n pointers to [T, C]).
void run_maa_mix(const MaaMixDims& d, const float* xp, const float* sxp, const float* zp,
                 const at::Tensor& w2, const at::Tensor& maa, float* const* outs) {
  const at::Tensor wc = w2.contiguous(), mc = maa.contiguous();
  // tanh(z) once (T*n*D values), before the threads share it; split between them for sequences,
  // where it is tens of thousands of values.
  std::vector<float> zt(static_cast<size_t>(d.T * d.n * d.D));
  at::parallel_for(0, static_cast<int64_t>(zt.size()), 8192, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) zt[i] = std::tanh(zp[i]);
  });
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
      kt.maa_finish(d.C, d.n, c0, c1, xp, sxp, acc, mc.data_ptr<float>(), outs);
    });
    return;
  }
  // Sequences: blocks of 64 channels.
  for_blocks(d.C, 64, d.T * d.n * d.D, [&](int64_t c0, int64_t c1) {
    const float* m = mc.data_ptr<float>();
    if (bf16_w2) {
      kt.maa_mix_bf16(d.T, d.C, d.n, d.D, c0, c1, xp, sxp, zt.data(),
                      reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>()), m, outs);
    } else {
      kt.maa_mix_f32(d.T, d.C, d.n, d.D, c0, c1, xp, sxp, zt.data(), wc.data_ptr<float>(), m, outs);
    }
  });
}

// maa_mix (split: maa_mix_split, its n results as separate tensors).
MixResults maa_mix_results(const at::Tensor& xx, const at::Tensor& sx, const at::Tensor& z,
                           const at::Tensor& w2, const at::Tensor& maa, bool split) {
  const MaaMixDims d = check_maa_mix(xx, sx, z, w2, maa, split ? "maa_mix_split" : "maa_mix");
  Fp32Inputs in32(d.T, xx.numel() + sx.numel() + z.numel());
  const float *xp = in32(xx), *sxp = in32(sx), *zp = in32(z);
  const at::ScalarType dt = xx.scalar_type();
  MixResults out(d.n, d.T, d.C, dt, result_room(d.T, d.n * d.C, dt), split);
  run_maa_mix(d, xp, sxp, zp, w2, maa, out.ptrs());
  return out;
}

at::Tensor maa_mix(const at::Tensor& xx, const at::Tensor& sx, const at::Tensor& z,
                   const at::Tensor& w2, const at::Tensor& maa) {
  return maa_mix_results(xx, sx, z, w2, maa, false).stacked();
}

std::vector<at::Tensor> maa_mix_split(const at::Tensor& xx, const at::Tensor& sx,
                                      const at::Tensor& z, const at::Tensor& w2,
                                      const at::Tensor& maa) {
  std::vector<at::Tensor> res;
  maa_mix_results(xx, sx, z, w2, maa, true).take_into(res);
  return res;
}

}  // namespace

// maa_lora_one: one token's maa_mix_split whose z is linear_one(xw, w1), computed in the same
// parallel region. Each thread takes a contiguous range of half-mixes (u = 2i + half, as in
// maa_half_sums): it computes their values of z (one run of consecutive columns of w1, by
// linear_one's kernels: the same bits), rounds them to xx's dtype as linear_one returns them,
// takes their tanh and sums their rows of w2 (one run of consecutive rows); the thread that
// completes a mix's second half finishes that mix. One call and one region where linear_one and
// maa_mix_split made two calls and three regions; a static split, since each thread's range is
// then one run of w1 and one of w2 (half-mixes taken one at a time by for_blocks would scatter
// each thread's reads; docs/kernels.md). The op itself: maa_lora_one below.
std::vector<at::Tensor> maa_lora_one_into(const at::Tensor& xx, const at::Tensor& sx,
                                          const at::Tensor& xw, const at::Tensor& w1,
                                          const at::Tensor& w2, const at::Tensor& maa,
                                          Into into) {
  const MaaMixDims d = check_maa_lora_one(xx, sx, xw, w1, w2, maa);
  const KernelTable& kt = kernels();
  const at::ScalarType dt = xx.scalar_type();
  Fp32Inputs in32(1, 2 * d.C);
  const float *xp = in32(xx), *sxp = in32(sx);
  const at::Tensor w2c = w2.contiguous(), mc = maa.contiguous();
  const bool bf16_w2 = w2c.scalar_type() == at::kBFloat16;
  MixResults out(d.n, 1, d.C, dt, result_room(1, d.n * d.C, dt), true, into);
  const int64_t nD = d.n * d.D, h = (d.D + 1) / 2;
  // This thread's buffers (the workers use them through the pointers): xw in fp32, z, tanh(z),
  // the half sums [2n, C].
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(d.C + 2 * nD + 2 * d.n * d.C));
  float *z = buf.data() + d.C, *zt = z + nD, *acc = zt + nD;
  const ProductColumns product(xw, w1, buf.data());
  // z's columns [j0, j1) and their tanh.
  const auto lora = [&](int64_t j0, int64_t j1) {
    product(j0, j1, z);
    for (int64_t j = j0; j < j1; ++j) zt[j] = std::tanh(z[j]);
  };
  // Short columns (product_columns.h): z in one range, first (at most n*D KiB of w1).
  const bool short_w1 = product.short_columns();
  if (short_w1) lora(0, nD);
  // Per mix, how many of its halves are summed.
  SmallArray<std::atomic<int>> halves(static_cast<size_t>(d.n));
  for (int64_t i = 0; i < d.n; ++i) halves[i].store(0, std::memory_order_relaxed);
  // Half-mix u's first column of z (its first row of w2, as rows of [n*D, C]).
  const auto first = [&](int64_t u) { return u / 2 * d.D + (u % 2 == 0 ? 0 : h); };
  const int64_t units = 2 * d.n;
  const int64_t bytes = nD * d.C * ((short_w1 ? 0 : w1.element_size()) + w2c.element_size());
  const int64_t tasks = std::clamp<int64_t>(bytes / 65536, 1, at::get_num_threads());
  at::parallel_for(0, units, (units + tasks - 1) / tasks, [&](int64_t u0, int64_t u1) {
    if (!short_w1 && u0 < u1) lora(first(u0), u1 == units ? nD : first(u1));
    for (int64_t u = u0; u < u1; ++u) {
      if (bf16_w2) {
        kt.maa_half_sums_bf16(d.C, d.D, u, u + 1, zt,
                              reinterpret_cast<const uint16_t*>(w2c.data_ptr<at::BFloat16>()),
                              acc);
      } else {
        kt.maa_half_sums_f32(d.C, d.D, u, u + 1, zt, w2c.data_ptr<float>(), acc);
      }
      // The second of a mix's halves to be summed finishes the mix (the first's sums are
      // visible to it through the counter's release and acquire).
      const int64_t i = u / 2;
      if (halves[i].fetch_add(1, std::memory_order_acq_rel) == 1)
        kt.maa_finish(d.C, 1, 0, d.C, xp, sxp, acc + 2 * i * d.C, mc.data_ptr<float>() + i * d.C,
                      out.ptrs() + i);
    }
  });
  std::vector<at::Tensor> res;
  out.take_into(res);
  return res;
}

namespace {

// The batched ops' x and sx: both [B, C] in one activation dtype (row b's previous row is sx[b]).
std::pair<int64_t, int64_t> check_rows_shift(const char* op, const char* name, const at::Tensor& x,
                                             const at::Tensor& sx) {
  check_activation_dtype(op, name, x);
  TORCH_CHECK(x.dim() == 2, op, ": ", name, " must have shape [B, C], got ", x.sizes());
  TORCH_CHECK(sx.scalar_type() == x.scalar_type(), op, ": sx must be ", dtype_name(x.scalar_type()),
              " (", name, "'s dtype), got ", dtype_name(sx.scalar_type()));
  TORCH_CHECK(sx.sizes() == x.sizes(), op, ": sx must have shape [B, C] = ", x.sizes(), " (", name,
              "'s), got ", sx.sizes());
  return {x.size(0), x.size(1)};
}

// n result pointers moved on to row b of [B, C] results.
c10::SmallVector<float*, 6> row_ptrs(const MixResults& out, int64_t n, int64_t b, int64_t C) {
  c10::SmallVector<float*, 6> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(out.ptrs()[i] + b * C);
  return p;
}

// ln_mix_rows: ln_mix of B one-token rows, row b's previous row being sx[b]: the layer norm of
// every row, then each row's mixes as one token's (the same kernels, so row b's values are the
// bits ln_mix_split gives for x[b] and sx[b] alone). Returns [xx (the new shift states),
// mixed_0, ..., mixed_{n-1}], each [B, C].
std::vector<at::Tensor> ln_mix_rows(const at::Tensor& x, const at::Tensor& sx, const at::Tensor& w,
                                    const at::Tensor& b, const at::Tensor& mix, bool lerp, double eps) {
  constexpr const char* op = "ln_mix_rows";
  check_same_device(op, {{"x", &x}, {"sx", &sx}, {"w", &w}, {"b", &b}, {"mix", &mix}});
  const auto [B, C] = check_rows_shift(op, "x", x, sx);
  const int64_t n = check_norm_and_mix(op, w, b, mix, C);
  Fp32Inputs in32(B, x.numel() + sx.numel());
  const float *xp = in32(x), *sxp = in32(sx);
  const at::Tensor wc = w.contiguous(), bc = b.contiguous(), mc = mix.contiguous();
  const at::ScalarType dt = x.scalar_type();
  const Fp32Result xx({B, C}, dt, nullptr);
  const MixResults out(n, B, C, dt, nullptr, true);
  const KernelTable& kt = kernels();
  float* xxp = xx.data();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    kt.layer_norm(C, b0, b1, xp, wc.data_ptr<float>(), bc.data_ptr<float>(), static_cast<float>(eps), xxp);
    for (int64_t r = b0; r < b1; ++r) {
      const auto outs = row_ptrs(out, n, r, C);
      kt.shift_mix(1, C, n, 0, 1, xxp + r * C, sxp + r * C, mc.data_ptr<float>(), lerp, outs.data());
    }
  });
  std::vector<at::Tensor> res;
  res.reserve(static_cast<size_t>(n + 1));
  res.push_back(xx.take());
  out.take_into(res);
  return res;
}

// maa_mix_rows: maa_mix of B one-token rows, row b's previous row being sx[b] (z [B, n*D]): each
// row as one token of the sequence kernel, on blocks of 64 channels. Returns the n mixes [B, C].
std::vector<at::Tensor> maa_mix_rows(const at::Tensor& xx, const at::Tensor& sx, const at::Tensor& z,
                                     const at::Tensor& w2, const at::Tensor& maa) {
  constexpr const char* op = "maa_mix_rows";
  check_same_device(op, {{"xx", &xx}, {"sx", &sx}, {"z", &z}, {"w2", &w2}, {"maa", &maa}});
  const auto [B, C] = check_rows_shift(op, "xx", xx, sx);
  const auto [n, D] = check_maa_w2(op, w2, C);
  check_rows(op, "[B, n*D]", {{"z", &z}}, B, n * D, xx.scalar_type(), " (xx's dtype)");
  check_rows(op, "[n, C]", {{"maa", &maa}}, n, C);
  Fp32Inputs in32(B, xx.numel() + sx.numel() + z.numel());
  const float *xp = in32(xx), *sxp = in32(sx), *zp = in32(z);
  const at::Tensor wc = w2.contiguous(), mc = maa.contiguous();
  const bool bf16_w2 = wc.scalar_type() == at::kBFloat16;
  std::vector<float> zt(static_cast<size_t>(B * n * D));
  for (size_t i = 0; i < zt.size(); ++i) zt[i] = std::tanh(zp[i]);
  const MixResults out(n, B, C, xx.scalar_type(), nullptr, true);
  const KernelTable& kt = kernels();
  for_blocks(C, 64, B * n * D, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < B; ++r) {
      const auto outs = row_ptrs(out, n, r, C);
      const float* zr = zt.data() + r * n * D;
      if (bf16_w2) {
        kt.maa_mix_bf16(1, C, n, D, c0, c1, xp + r * C, sxp + r * C, zr,
                        reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>()), mc.data_ptr<float>(),
                        outs.data());
      } else {
        kt.maa_mix_f32(1, C, n, D, c0, c1, xp + r * C, sxp + r * C, zr, wc.data_ptr<float>(),
                       mc.data_ptr<float>(), outs.data());
      }
    }
  });
  std::vector<at::Tensor> res;
  out.take_into(res);
  return res;
}

}  // namespace

std::vector<at::Tensor> ln_mix_split_into(const at::Tensor& x, const at::Tensor& sx,
                                          const at::Tensor& w, const at::Tensor& b,
                                          const at::Tensor& mix, bool lerp, double eps,
                                          Into into) {
  return run_ln_mix(x, sx, w, b, mix, lerp, eps, true, into);
}

namespace {

std::vector<at::Tensor> maa_lora_one(const at::Tensor& xx, const at::Tensor& sx,
                                     const at::Tensor& xw, const at::Tensor& w1,
                                     const at::Tensor& w2, const at::Tensor& maa) {
  return maa_lora_one_into(xx, sx, xw, w1, w2, maa, {});
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("ln_mix", &rwkv::cpu::ln_mix);
  m.impl("maa_mix", &rwkv::cpu::maa_mix);
  m.impl("ln_mix_split", &rwkv::cpu::ln_mix_split);
  m.impl("maa_mix_split", &rwkv::cpu::maa_mix_split);
  m.impl("maa_lora_one", &rwkv::cpu::maa_lora_one);
  m.impl("ln_mix_rows", &rwkv::cpu::ln_mix_rows);
  m.impl("maa_mix_rows", &rwkv::cpu::maa_mix_rows);
}
