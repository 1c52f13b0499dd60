// ATen glue for the int8 matrix products on CPU (mm8_one, mm8_seq) and the preparation that
// cpu/one_token.cpp's int8 products share (cpu/mm8_prepare.h): input checks in the contract's
// words (common/op_checks.h), fp32 copies of x and the side tensors (small), the weight in
// column-major order (the model's layout, no copy; any other strides are copied once), then the
// kernels of the active instruction set threaded over output columns. The dequantized matrix is
// never built. Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/mm8.h and docs/kernels.md.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <optional>
#include <vector>

#include "common/activation.h"
#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/float_io.h"
#include "cpu/mm8_prepare.h"
#include "cpu/parallel.h"
#include "cpu/pooled.h"

namespace rwkv {
namespace cpu {

// (The checks first: these run for every one-token product, where a no-op .to() still costs.)
at::Tensor fp32(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat && t.is_contiguous()) return t;
  if (t.scalar_type() == at::kBFloat16) return widened(t);  // float_io.h: a loop when short
  return t.to(at::kFloat).contiguous();
}

namespace {

// From this many rows on, mm8_seq converts column tiles of q and lets a GEMM (tile_product) do
// the products: the conversion is paid once per tile instead of once per row group, and the GEMM
// runs at several times the multiply-add rate of the row-group loop of kernels/mm8.h. The loop
// and the tiles cross over between 16 and 32 rows depending on the CPU and the GEMM library;
// below 32 rows the loop is never much slower, so the threshold sits at the top of that range.
constexpr int64_t kTiledMinRows = 32;
// bf16 x uses bf16 tiles where the CPU multiplies bf16 natively (the avx512bf16 ISA active), since
// torch's bf16 GEMM is several times faster than its fp32 one there, so the tiles pay off from
// fewer rows. Elsewhere fp32 tiles, as for fp32 x: without native bf16, oneDNN's bf16 GEMM is
// several times slower than its fp32 one.
constexpr int64_t kBf16TiledMinRows = 16;

bool bf16_tiles_for(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 && active_isa() == Isa::avx512bf16;
}

// a [T, N] @ tile.t() for a tile [mt, N]: torch's oneDNN linear (mkldnn::_linear_pointwise, the
// tile being its weight layout) for fp32 when this torch has it: at::mm sends fp32 to MKL's sgemm,
// markedly slower on AMD CPUs (rwkv/models/common.py, onednn_linear). bf16 at::mm is oneDNN's.
at::Tensor tile_product(const at::Tensor& a, const at::Tensor& tile) {
  static const std::optional<c10::OperatorHandle> linear =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  if (!linear || a.scalar_type() != at::kFloat || a.numel() == 0 || tile.numel() == 0)
    return at::mm(a, tile.t());  // (oneDNN has no primitive for empty sizes)
  std::vector<c10::IValue> stack{a, tile, c10::IValue(), c10::IValue("none"),
                                 c10::List<std::optional<at::Scalar>>(), c10::IValue()};
  try {
    linear->callBoxed(&stack);
  } catch (const c10::Error&) {  // a oneDNN build that cannot run it here: the same product
    return at::mm(a, tile.t());
  }
  return stack[0].toTensor();
}

// y[T, M] = rx*(xs @ q + sums[:, 0]) + sums[:, 1] + mx*sums[:, 2], q column-major [N, M] uint8,
// converted one tile at a time (2 Mi elements: 8 MiB fp32 or 4 MiB bf16; never the whole matrix).
// Wide tiles keep the GEMM efficient: each tile is one GEMM call, and narrow tiles spend a large
// share of it in set-up and packing (2 Mi-element tiles come close to a product over a prebuilt
// fp32 matrix). fp32 tiles give fp32 products. bf16 tiles hold q - 128 (exact in bf16; centring
// keeps the bf16-rounded products small next to the offsets they are later added to) times xs
// rounded to bf16; the missing 128*sum(xs) goes into the row term, taken from the fp32 xs.
void mm8_tiled(const at::Tensor& xs, const at::Tensor& q, const at::Tensor& sums,
               const at::Tensor& rx, const at::Tensor& mx, bool bf16, at::Tensor& y) {
  const int64_t N = q.size(0), M = q.size(1);
  const at::Tensor a = bf16 ? xs.to(at::kBFloat16) : xs;
  constexpr int64_t kTileElements = int64_t{1} << 21;
  const int64_t tile =
      std::min<int64_t>(M, std::max<int64_t>(16, kTileElements / std::max<int64_t>(1, N)));
  at::Tensor buf = at::empty({tile, N}, a.options());
  const KernelTable& kt = kernels();
  const uint8_t* qp = q.data_ptr<uint8_t>();  // column m at qp + m*N
  for (int64_t m0 = 0; m0 < M; m0 += tile) {
    const int64_t mt = std::min(tile, M - m0);
    at::parallel_for(0, mt, 8, [&](int64_t r0, int64_t r1) {
      if (bf16) {
        auto* out = reinterpret_cast<uint16_t*>(buf.data_ptr<at::BFloat16>()) + r0 * N;
        kt.mm8_tile_bf16(N, m0 + r0, m0 + r1, qp, out);
      } else {
        kt.mm8_tile_f32(N, m0 + r0, m0 + r1, qp, buf.data_ptr<float>() + r0 * N);
      }
    });
    y.narrow(1, m0, mt).copy_(tile_product(a, buf.narrow(0, 0, mt)));
  }
  // 0.5*sum(xs) (+ 128*sum(xs) = 256 * 0.5*sum(xs) for the centred bf16 tiles).
  const at::Tensor s0 = bf16 ? sums.narrow(1, 0, 1).mul(257) : sums.narrow(1, 0, 1);
  y.add_(s0).mul_(rx).add_(sums.narrow(1, 1, 1)).addcmul_(sums.narrow(1, 2, 1), mx);
}

}  // namespace

Mm8Prepared mm8_prepare(const Mm8Dims& d, bool seq, const at::Tensor& x, const at::Tensor& w,
                        const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                        const at::Tensor& ry, float* one_token_buf) {
  Mm8Prepared p{d.T, d.N, d.M, fp32(x), fp32(mx), fp32(rx), {}, {}, {}, nullptr, nullptr};
  const at::Tensor my32 = fp32(my), ry32 = fp32(ry);
  // Column-major [N, M] (w.t() contiguous) is the fast path; anything else is copied into it.
  p.q = as_column_major(w);
  if (seq) {
    p.xs_t = at::empty({p.T, p.N}, p.x32.options());
    p.sums_t = at::empty({p.T, 3}, p.x32.options());
    p.xs = p.xs_t.data_ptr<float>();
    p.sums = p.sums_t.data_ptr<float>();
  } else {
    p.xs = one_token_buf;
    p.sums = one_token_buf + mm8_one_token_floats(p.N) - 16;
  }
  const KernelTable& kt = kernels();
  at::parallel_for(0, p.T, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.N)),
                   [&](int64_t t0, int64_t t1) {
                     kt.mm8_prepare(p.N, t0, t1, p.x32.data_ptr<float>(), ry32.data_ptr<float>(),
                                    my32.data_ptr<float>(), p.xs, p.sums);
                   });
  return p;
}

void mm8_columns(const Mm8Prepared& p, int64_t m0, int64_t m1, float* y) {
  kernels().mm8(p.T, p.N, p.M, m0, m1, p.xs, p.q.data_ptr<uint8_t>(), p.sums,
                p.rx32.data_ptr<float>(), p.mx32.data_ptr<float>(), y);
}

namespace {

at::Tensor mm8_impl(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                    const at::Tensor& ry) {
  const Mm8Dims d = check_mm8(op, seq, x, w, mx, rx, my, ry);
  thread_local Scratch one_token_buf;
  float* buf = seq ? nullptr : one_token_buf.get<float>(mm8_one_token_floats(d.N));
  const Mm8Prepared p = mm8_prepare(d, seq, x, w, mx, rx, my, ry, buf);
  at::Tensor y = pooled_empty(seq ? RowShape{p.T, p.M} : one_row_shape(x, p.M), at::kFloat);
  const bool bf16_tiles = bf16_tiles_for(x);
  if (seq && p.T >= (bf16_tiles ? kBf16TiledMinRows : kTiledMinRows)) {
    mm8_tiled(p.xs_t, p.q, p.sums_t, p.rx32, p.mx32, bf16_tiles, y);
  } else {
    // Blocks of 16 output columns keep the kernels' column groups whole.
    float* yp = y.data_ptr<float>();
    for_blocks(p.M, 16, p.T * p.N, [&](int64_t m0, int64_t m1) { mm8_columns(p, m0, m1, yp); });
  }
  return narrowed(y, x.scalar_type());
}

// mm8_one_i16 of each row of x [T, N] (the batched engine's B sequences): the rows prepared and
// rounded to int16 one by one (each its own scale, as mm8_one_i16 rounds one token), then every
// column of w read once for all rows (kernels/mm8.h, mm8_i16_rows); a row the integer path
// cannot represent (all zero, not finite) takes mm8's fp32 loop, as mm8_one_i16 does. Then the
// activation, in fp32, and the result in x's dtype: row t's values are the bits mm8_one_i16
// gives for x[t] alone.
at::Tensor mm8_rows_i16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                        const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry, int64_t act) {
  const Mm8Dims d = check_mm8("mm8_rows_i16", true, x, w, mx, rx, my, ry, true);
  const Act a = check_act("mm8_rows_i16", act);
  const Mm8Prepared p = mm8_prepare(d, true, x, w, mx, rx, my, ry, nullptr);
  at::Tensor y = at::empty({p.T, p.M}, x.options().dtype(at::kFloat));
  if (p.T == 0 || p.M == 0) return narrowed(y, x.scalar_type());
  const KernelTable& kt = kernels();
  const int64_t n_pad = (p.N + 63) / 64 * 64;
  std::vector<int16_t> xq(static_cast<size_t>(p.T * n_pad));
  std::vector<float> scale(static_cast<size_t>(p.T));
  for (int64_t t = 0; t < p.T; ++t)  // (sum(xs) is finite exactly when every xs is)
    scale[t] = std::isfinite(p.sums[3 * t]) && p.N > 0
                   ? kt.mm8_quantize_i16(p.N, n_pad, p.xs + t * p.N, xq.data() + t * n_pad)
                   : 0.0f;
  float* yp = y.data_ptr<float>();
  const uint8_t* qp = p.q.data_ptr<uint8_t>();
  const float *rxp = p.rx32.data_ptr<float>(), *mxp = p.mx32.data_ptr<float>();
  for_blocks(p.M, 16, p.T * p.N / 4, [&](int64_t m0, int64_t m1) {
    kt.mm8_i16_rows(p.T, p.N, n_pad, p.M, m0, m1, xq.data(), qp, scale.data(), p.sums, rxp, mxp, yp);
    for (int64_t t = 0; t < p.T; ++t)
      if (scale[t] == 0.0f)
        kt.mm8(1, p.N, p.M, m0, m1, p.xs + t * p.N, qp, p.sums + 3 * t, rxp, mxp, yp + t * p.M);
  });
  activate(a, yp, p.T * p.M);
  return narrowed(y, x.scalar_type());
}

at::Tensor mm8_one(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                   const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry) {
  return mm8_impl("mm8_one", false, x, w, mx, rx, my, ry);
}

at::Tensor mm8_seq(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                   const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry) {
  return mm8_impl("mm8_seq", true, x, w, mx, rx, my, ry);
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("mm8_one", &rwkv::cpu::mm8_one);
  m.impl("mm8_seq", &rwkv::cpu::mm8_seq);
  m.impl("mm8_rows_i16", &rwkv::cpu::mm8_rows_i16);
}
