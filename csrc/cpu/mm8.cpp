// ATen glue for the int8 matrix products on CPU (mm8_one, mm8_seq): input checks in the
// contract's words (common/op_checks.h), fp32 copies of x and the side tensors (small), the weight in column-major
// order (the model's layout, no copy; any other strides are copied once), then the kernels of the
// active instruction set threaded over output columns. The dequantized matrix is never built.
// Schemas: rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/mm8.h and docs/kernels.md.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/activation.h"
#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"

namespace rwkv {
namespace cpu {
namespace {

// (The checks first: these run for every one-token product, where a no-op .to() still costs.)
at::Tensor fp32(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() ? t : t.to(at::kFloat).contiguous();
}

// From this many rows on, mm8_seq converts column tiles of q and lets at::mm (BLAS) do the
// products: the conversion is paid once per tile instead of once per row group, and BLAS runs at
// several times the multiply-add rate of the row-group loop of kernels/mm8.h. Measured on an
// AVX-512 Xeon (N = M = 2048, one thread): fp32 x: loop 2.96 ms vs tiles 3.22 ms at T = 24,
// 4.13 ms vs 3.70 ms at T = 32.
constexpr int64_t kTiledMinRows = 32;
// bf16 x uses bf16 tiles, since torch's bf16 GEMM is several times faster than its fp32 one
// (same machine: loop 0.97 ms vs tiles 1.3 ms at T = 8, 1.7-1.9 ms vs 1.0-1.2 ms at T = 16).
constexpr int64_t kBf16TiledMinRows = 16;

// y[T, M] = rx*(xs @ q + sums[:, 0]) + sums[:, 1] + mx*sums[:, 2], q column-major [N, M] uint8,
// converted one tile at a time (2 Mi elements: 8 MiB fp32 or 4 MiB bf16; never the whole matrix).
// Wide tiles keep BLAS efficient: T = 512, fp32, N x M = 2048x2048 / 2048x8192 / 8192x2048, two
// threads: 64 Ki-element tiles 25.9 / 102 / 104 ms, 1 Mi 17.4 / 69 / 70 ms, 2 Mi 14.9 / 59 / 64 ms,
// torch's own x @ W on a prebuilt fp32 matrix 13.8 / 53 / 52 ms; bf16 tiles 512 Ki 7.6 / 27 /
// 32 ms, 2 Mi 6.5 / 22 / 26 ms. fp32 tiles give fp32 products. bf16 tiles hold q - 128 (exact in bf16; centring keeps the bf16-rounded products
// small next to the offsets they are later added to) times xs rounded to bf16; the missing
// 128*sum(xs) goes into the row term, taken from the fp32 xs.
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
    y.narrow(1, m0, mt).copy_(at::mm(a, buf.narrow(0, 0, mt).t()));
  }
  // 0.5*sum(xs) (+ 128*sum(xs) = 256 * 0.5*sum(xs) for the centred bf16 tiles).
  const at::Tensor s0 = bf16 ? sums.narrow(1, 0, 1).mul(257) : sums.narrow(1, 0, 1);
  y.add_(s0).mul_(rx).add_(sums.narrow(1, 1, 1)).addcmul_(sums.narrow(1, 2, 1), mx);
}

// What mm8_impl and mm8_one_i16 share: fp32 copies of the inputs, w as column-major [N, M],
// xs = x*ry and the per-row sums (kernels/mm8.h). xs and sums live in tensors for sequences (the
// tiled path hands them to at::mm) and in this thread's scratch for one token, where two tensor
// allocations per call would be a measurable share of a small product's time.
struct Mm8Prepared {
  int64_t T, N, M;
  at::Tensor x32, mx32, rx32, q;
  at::Tensor xs_t, sums_t;  // defined for sequences only
  float* xs;                // [T, N]
  float* sums;              // [T, 3]
};

// A per-thread buffer that grows on demand, 64-byte aligned so that full-width vector loads never
// straddle a cache line (as with at::empty's memory).
class Scratch {
 public:
  ~Scratch() { std::free(ptr_); }
  template <class T>
  T* get(int64_t n) {
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
    if (bytes > size_) {
      void* fresh = std::aligned_alloc(64, bytes);
      if (fresh == nullptr) throw std::bad_alloc();
      std::free(ptr_);
      ptr_ = fresh;
      size_ = bytes;
    }
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

Mm8Prepared mm8_prepare(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                        const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                        const at::Tensor& ry) {
  const Mm8Dims d = check_mm8(op, seq, x, w, mx, rx, my, ry);
  Mm8Prepared p{d.T, d.N, d.M, fp32(x), fp32(mx), fp32(rx), {}, {}, {}, nullptr, nullptr};
  const at::Tensor my32 = fp32(my), ry32 = fp32(ry);
  // Column-major [N, M] (w.t() contiguous) is the fast path; anything else is copied into it.
  p.q = column_major(w) ? w : w.t().contiguous().t();
  if (seq) {
    p.xs_t = at::empty({p.T, p.N}, p.x32.options());
    p.sums_t = at::empty({p.T, 3}, p.x32.options());
    p.xs = p.xs_t.data_ptr<float>();
    p.sums = p.sums_t.data_ptr<float>();
  } else {
    thread_local Scratch xs_buf, sums_buf;
    p.xs = xs_buf.get<float>(p.N);
    p.sums = sums_buf.get<float>(3);
  }
  const KernelTable& kt = kernels();
  at::parallel_for(0, p.T, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.N)),
                   [&](int64_t t0, int64_t t1) {
                     kt.mm8_prepare(p.N, t0, t1, p.x32.data_ptr<float>(), ry32.data_ptr<float>(),
                                    my32.data_ptr<float>(), p.xs, p.sums);
                   });
  return p;
}

// Blocks of 16 output columns keep the kernels' column groups whole.
template <class F>
void for_column_blocks(int64_t T, int64_t N, int64_t M, const F& body) {
  for_blocks(M, 16, T * N, body);
}

// The fp32 loop of kernels/mm8.h for every row of p.
void mm8_loop(const Mm8Prepared& p, at::Tensor& y) {
  const KernelTable& kt = kernels();
  for_column_blocks(p.T, p.N, p.M, [&](int64_t m0, int64_t m1) {
    kt.mm8(p.T, p.N, p.M, m0, m1, p.xs, p.q.data_ptr<uint8_t>(), p.sums,
           p.rx32.data_ptr<float>(), p.mx32.data_ptr<float>(), y.data_ptr<float>());
  });
}

at::Tensor in_dtype(const at::Tensor& y, const at::Tensor& x) {
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor mm8_impl(const char* op, bool seq, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& mx, const at::Tensor& rx, const at::Tensor& my,
                    const at::Tensor& ry) {
  const Mm8Prepared p = mm8_prepare(op, seq, x, w, mx, rx, my, ry);
  at::Tensor y = at::empty(seq ? std::vector<int64_t>{p.T, p.M} : std::vector<int64_t>{p.M},
                           p.x32.options());
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  if (seq && p.T >= (bf16 ? kBf16TiledMinRows : kTiledMinRows)) {
    mm8_tiled(p.xs_t, p.q, p.sums_t, p.rx32, p.mx32, bf16, y);
  } else {
    mm8_loop(p, y);
  }
  return in_dtype(y, x);
}

// mm8_one with xs = x*ry quantized to int16 by one scale per call and exact integer dot products
// (kernels/mm8.h): the weight bytes are only widened, never converted to float, so the product
// keeps up with memory bandwidth. Falls back to the fp32 loop when xs is all zero or not finite.
// `act` applies an activation to the output (common/activation.h).
at::Tensor mm8_one_i16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                       const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry,
                       int64_t act) {
  const Mm8Prepared p = mm8_prepare("mm8_one_i16", false, x, w, mx, rx, my, ry);
  const Act a = check_act("mm8_one_i16", act);
  at::Tensor y = at::empty({p.M}, p.x32.options());
  const KernelTable& kt = kernels();
  constexpr int64_t kPad = 64;  // Dot16::kStep of every ISA
  const int64_t n_pad = (p.N + kPad - 1) / kPad * kPad;
  thread_local Scratch xq_buf;
  int16_t* xqp = xq_buf.get<int16_t>(n_pad);
  const float* sums = p.sums;
  // sum(xs) is finite exactly when every xs is (barring overflow, which also takes the fp32 path).
  const float scale = std::isfinite(sums[0]) && p.N > 0
                          ? kt.mm8_quantize_i16(p.N, n_pad, p.xs, xqp)
                          : 0.0f;
  if (scale == 0.0f) {
    mm8_loop(p, y);
    activate(a, y.data_ptr<float>(), p.M);
    return in_dtype(y, x);
  }
  const bool sequential = read_sequential();
  for_column_blocks(1, p.N, p.M, [&](int64_t m0, int64_t m1) {
    kt.mm8_i16(p.N, m0, m1, xqp, p.q.data_ptr<uint8_t>(), scale, sums,
               p.rx32.data_ptr<float>(), p.mx32.data_ptr<float>(), y.data_ptr<float>(),
               sequential);
    activate(a, y.data_ptr<float>() + m0, m1 - m0);
  });
  return in_dtype(y, x);
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
  m.impl("mm8_one_i16", &rwkv::cpu::mm8_one_i16);
}
