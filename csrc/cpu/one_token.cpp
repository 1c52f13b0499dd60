// ATen glue for the products of one token on CPU: linear_one (bf16/fp32 matrix-vector),
// mm8_one_i16 (int8 weights, the activation rounded to int16), linear_one_group (several such
// products in one call), linear_one_chain (a group, then products of some of its results),
// linear_one_slabs (one product whose weight is stored as row slabs, rwkv/slabs.py: the slabs'
// products summed), linear_one_residual (one of those products, then a residual add and an
// optional gate) and linear_one_ffn (a channel mix: a group, the value product of its last result
// and the residual add). Every product is checked in the contract's words
// (common/op_checks.h), prepared (fp32 x, or for bf16 weights on avx512bf16 the bf16 x itself),
// then the output columns of every matrix (a product's weight or one of its slabs) are split
// between threads as one range (for_member_blocks), the kernels of the active instruction set
// computing each column, with an optional activation (common/activation.h). An int8 matrix's
// activation (xs = x*ry, its sums and its int16 rounding) is prepared inside that region by the
// first thread to reach its columns (prepare_int8). A group, or a slab product, is thus one call
// and one parallel region where separate products are several: while decoding, each call costs
// tens of microseconds beyond its weight's reading (docs/kernels.md). Schemas:
// rwkv/ops/_schemas.py. Math: csrc/cpu/kernels/linear.h, kernels/mm8.h.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/activation.h"
#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/float_io.h"
#include "cpu/mm8_prepare.h"
#include "cpu/parallel.h"
#include "cpu/pooled.h"
#include "cpu/product_step.h"

namespace rwkv {
namespace cpu {
namespace {

constexpr int64_t kPad = 64;  // mm8_one_i16's int16 rows: a multiple of 64 (every Dot16 reads that)

int64_t padded(int64_t n) { return (n + kPad - 1) / kPad * kPad; }

// One product y = act(x @ w) of one token: w column-major bf16/fp32 (dense) or uint8 with its
// side tensors mx, rx, my, ry (int8, mm8_one_i16's math); or w [S, N/S, M], S row slabs, each a
// column-major matrix, y = act(sum over s of x[rows of s] @ w[s]) summed in fp32 in slab order.
struct Product {
  const at::Tensor* x;
  const at::Tensor* w;
  const at::Tensor* side;  // int8: mx, rx, my, ry in a row; dense: nullptr
  Act act;
  int64_t N = 0, M = 0, S = 1;
  Fp32Result y;                   // [M] or [1, M] as x, returned in x's dtype
  const at::Tensor* out = nullptr;  // where y goes (a planned op's reused result), or a new tensor
  at::Tensor xb;                  // bf16 weights on ISAs with bf16 dots: x itself, contiguous
  at::Tensor q, mx32, rx32, ry32, my32;  // int8: w column-major, the side tensors in fp32

  bool int8() const { return side != nullptr; }
  at::ScalarType x_dtype() const { return x->scalar_type(); }
  int64_t K() const { return N / S; }  // rows per slab (N for a matrix; S >= 1)
};

// One matrix of a product (its w, or one of its row slabs), as the kernels see it.
struct Part {
  size_t product;
  int64_t K = 0;            // rows
  const void* w = nullptr;  // column m at w + m*K elements
  const float* x = nullptr;  // dense: its K values of x in fp32
  const uint16_t* xb = nullptr;  // or in bf16 (linear_one_bf16x)
  float* y = nullptr;       // its fp32 result [M]: the product's y, or scratch to be summed
  float* xs = nullptr;      // int8: xs [K] and, at xs + mm8_one_token_floats(K) - 16, its sums
  int16_t* xq = nullptr;
  const float* ry = nullptr;  // int8: its K rows of ry and my, in fp32
  const float* my = nullptr;
  const float* rx = nullptr;  // int8: the product's rx and mx [M] in fp32
  const float* mx = nullptr;
  bool f32w = false;  // dense: fp32 weights (else bf16)
  float scale = 0.0f;  // int8: 0 = the fp32 loop (xs all zero or not finite)
};

// An int8 part's activation, prepared (xs = x*ry, its sums, its int16 rounding and scale) by
// whichever thread first reaches one of its columns, while the other thread goes on reading
// weights: a call's parts are prepared in parallel, and each thread waits only for the parts it
// reads. ready: 0 = not started, 1 = being prepared, 2 = done.
void prepare_int8(const KernelTable& kt, Part& pt, std::atomic<int>& ready) {
  if (ready.load(std::memory_order_acquire) == 2) return;
  int idle = 0;
  if (!ready.compare_exchange_strong(idle, 1, std::memory_order_acq_rel)) {
    while (ready.load(std::memory_order_acquire) != 2) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    return;
  }
  float* sums = pt.xs + mm8_one_token_floats(pt.K) - 16;
  kt.mm8_prepare(pt.K, 0, 1, pt.x, pt.ry, pt.my, pt.xs, sums);
  // sum(xs) is finite exactly when every xs is (barring overflow, which also takes the fp32
  // path).
  pt.scale = std::isfinite(sums[0]) && pt.K > 0
                 ? kt.mm8_quantize_i16(pt.K, padded(pt.K), pt.xs, pt.xq)
                 : 0.0f;
  ready.store(2, std::memory_order_release);
}

// Products to compute in one call, and their results.
struct Products {
  Product* first;
  size_t n;
  Product* begin() const { return first; }
  Product* end() const { return first + n; }
  size_t size() const { return n; }
  Product& operator[](size_t i) const { return first[i]; }
};
using Outputs = c10::SmallVector<at::Tensor, 8>;

// Checks one product's arguments; `op` names it in messages. Only linear_one_slabs (slabs) takes
// a weight in row slabs.
void check_product(const char* op, Product& pr, bool slabs = false) {
  if (slabs) {
    const SlabDims d = check_slabs(op, *pr.x, *pr.w, pr.side);
    pr.N = d.N;
    pr.M = d.M;
    pr.S = d.S;
  } else if (pr.int8()) {
    const at::Tensor* s = pr.side;
    const Mm8Dims d = check_mm8(op, false, *pr.x, *pr.w, s[0], s[1], s[2], s[3], true);
    pr.N = d.N;
    pr.M = d.M;
  } else {
    const LinearDims d = check_linear_one(*pr.x, *pr.w, op);
    pr.N = d.N;
    pr.M = d.M;
  }
}

// What running checked products derives from their weights and shapes alone: their parts (each
// x, y and int8 scratch still unset), each part's columns and bytes, and the scratch sizes. A
// planned op (the one-token plan) keeps it between calls.
struct Layout {
  c10::SmallVector<Part, 8> parts;
  c10::SmallVector<int64_t, 16> columns, bytes;
  c10::SmallVector<uint8_t, 8> bf16x;  // per product: x read as bf16 (else fp32)
  int64_t floats = 0, shorts = 0;
};

// Lays out checked products (the int8 ones' side tensors in fp32 and w in column-major order
// are made here, held by the products).
Layout lay_out(Products prs) {
  Layout L;
  const KernelTable& kt = kernels();
  // This thread's scratch (run_laid_out): each x in fp32 (where it is not contiguous fp32
  // already), int8 parts' xs and sums, their int16 rounding of xs, and the results of slabs
  // after the first.
  for (size_t i = 0; i < prs.size(); ++i) {
    Product& pr = prs[i];
    L.floats += pr.N + (pr.S - 1) * pr.M + (Fp32Result::in_room(pr.M, pr.x_dtype()) ? pr.M : 0);
    if (pr.int8()) {
      L.floats += pr.S * mm8_one_token_floats(pr.K());
      L.shorts += pr.S * padded(pr.K());
    }
    // bf16 weights (and so bf16 x) on an ISA with bf16 dots: x as it is; otherwise fp32.
    L.bf16x.push_back(kt.linear_one_bf16x != nullptr && !pr.int8() &&
                      pr.w->scalar_type() == at::kBFloat16);
    const int64_t K = pr.K();
    const char* w = static_cast<const char*>(pr.w->data_ptr());
    const int64_t slab_bytes = pr.w->dim() == 3 ? pr.w->stride(0) * pr.w->element_size() : 0;
    if (pr.int8()) {
      const at::Tensor* s = pr.side;
      pr.mx32 = fp32(s[0]);
      pr.rx32 = fp32(s[1]);
      pr.my32 = fp32(s[2]);
      pr.ry32 = fp32(s[3]);
      if (pr.w->dim() == 2) {  // any strides: copied into column-major order once
        pr.q = as_column_major(*pr.w);
        w = static_cast<const char*>(pr.q.data_ptr());
      }
    }
    for (int64_t s = 0; s < pr.S; ++s) {
      Part pt;
      pt.product = i;
      pt.K = K;
      pt.f32w = pr.w->scalar_type() == at::kFloat;
      pt.w = w + s * slab_bytes;
      if (pr.int8()) {
        pt.ry = pr.ry32.data_ptr<float>() + s * K;
        pt.my = pr.my32.data_ptr<float>() + s * K;
        pt.rx = pr.rx32.data_ptr<float>();
        pt.mx = pr.mx32.data_ptr<float>();
      }
      L.parts.push_back(pt);
      L.columns.push_back(pr.M);
      L.bytes.push_back(K * (pr.int8() ? 1 : static_cast<int64_t>(pr.w->element_size())));
    }
  }
  return L;
}

// Runs laid-out products on their x (the serial part: x in fp32 or bf16, the results' memory;
// int8 activations later, prepare_int8), then computes every output column, threaded. Returns
// each y in its x's dtype. (Small arrays, not heap vectors: while decoding, each allocation here
// is a measurable cost per call.)
Outputs run_laid_out(Products prs, const Layout& L) {
  thread_local Scratch float_buf, short_buf;
  float* fp = float_buf.get<float>(L.floats);
  int16_t* sp = short_buf.get<int16_t>(L.shorts);
  const KernelTable& kt = kernels();
  c10::SmallVector<Part, 8> parts(L.parts.begin(), L.parts.end());
  size_t next = 0;  // the first part of product i
  for (size_t i = 0; i < prs.size(); ++i) {
    Product& pr = prs[i];
    const float* x = nullptr;
    const uint16_t* xb = nullptr;
    if (L.bf16x[i]) {
      pr.xb = pr.x->contiguous();
      xb = reinterpret_cast<const uint16_t*>(pr.xb.data_ptr<at::BFloat16>());
    } else {
      x = fp32_values(*pr.x, fp);
      fp += pr.N;
    }
    float* room = Fp32Result::in_room(pr.M, pr.x_dtype()) ? fp : nullptr;
    if (room != nullptr) fp += pr.M;
    pr.y = Fp32Result(one_row_shape(*pr.x, pr.M), pr.x_dtype(), room, pr.out);
    const int64_t K = pr.K();
    for (int64_t s = 0; s < pr.S; ++s) {
      Part& pt = parts[next + s];
      if (L.bf16x[i]) {
        pt.xb = xb + s * K;
      } else {
        pt.x = x + s * K;
      }
      if (s == 0) {
        pt.y = pr.y.data();
      } else {
        pt.y = fp;
        fp += pr.M;
      }
      if (pr.int8()) {
        pt.xs = fp;
        pt.xq = sp;
        fp += mm8_one_token_floats(K);
        sp += padded(K);
      }
    }
    next += pr.S;
  }
  // Each part's preparation state (prepare_int8).
  SmallArray<std::atomic<int>> ready(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) ready[i].store(0, std::memory_order_relaxed);
  const bool sequential = read_sequential();
  // Blocks of 16 columns keep the kernels' column groups whole.
  for_member_blocks(L.columns, L.bytes, 16, [&](size_t i, int64_t m0, int64_t m1) {
    const Part& pt = parts[i];
    const Product& pr = prs[pt.product];
    if (pr.int8()) {
      prepare_int8(kt, parts[i], ready[i]);
      const auto* q = static_cast<const uint8_t*>(pt.w);
      const float* sums = pt.xs + mm8_one_token_floats(pt.K) - 16;
      if (pt.scale == 0.0f) {
        kt.mm8(1, pt.K, pr.M, m0, m1, pt.xs, q, sums, pt.rx, pt.mx, pt.y);
      } else {
        kt.mm8_i16(pt.K, m0, m1, pt.xq, q, pt.scale, sums, pt.rx, pt.mx, pt.y, sequential);
      }
    } else if (pt.f32w) {
      kt.linear_one_f32(pt.K, m0, m1, pt.x, static_cast<const float*>(pt.w), pt.y, sequential);
    } else if (pt.xb != nullptr) {
      kt.linear_one_bf16x(pt.K, m0, m1, pt.xb, static_cast<const uint16_t*>(pt.w), pt.y,
                          sequential);
    } else {
      kt.linear_one_bf16(pt.K, m0, m1, pt.x, static_cast<const uint16_t*>(pt.w), pt.y,
                         sequential);
    }
    if (pr.S == 1) activate(pr.act, pt.y + m0, m1 - m0);
  });
  // Slab products: the later slabs' results added to the first's in order, then the activation.
  size_t first = 0;
  for (Product& pr : prs) {
    if (pr.S > 1) {
      float* y = parts[first].y;
      for (int64_t s = 1; s < pr.S; ++s) {
        const float* part = parts[first + s].y;
        for (int64_t m = 0; m < pr.M; ++m) y[m] += part[m];
      }
      activate(pr.act, y, pr.M);
    }
    first += pr.S;
  }
  Outputs out;
  for (const Product& pr : prs) out.push_back(pr.y.take());
  return out;
}

// Lays out checked products and runs them (one call's).
Outputs run_products(Products prs) { return run_laid_out(prs, lay_out(prs)); }

at::Tensor linear_one(const at::Tensor& x, const at::Tensor& w, int64_t act) {
  Product prs[] = {{&x, &w, nullptr, Act::none}};
  check_product("linear_one", prs[0]);
  prs[0].act = check_act("linear_one", act);
  return run_products({prs, 1})[0];
}

at::Tensor mm8_one_i16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                       const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry,
                       int64_t act) {
  const std::array<at::Tensor, 4> side{mx, rx, my, ry};
  Product prs[] = {{&x, &w, side.data(), Act::none}};
  check_product("mm8_one_i16", prs[0]);
  prs[0].act = check_act("mm8_one_i16", act);
  return run_products({prs, 1})[0];
}

// Checks w's side tensors (4 per uint8 w, in order) in `op`'s words.
void check_side_count(const char* op, at::TensorList w, at::TensorList side) {
  size_t int8 = 0;
  for (const at::Tensor& t : w) int8 += t.scalar_type() == at::kByte;
  TORCH_CHECK(side.size() == 4 * int8, op,
              ": side must hold mx, rx, my, ry of each uint8 w, in order: ", 4 * int8,
              " tensors for ", int8, ", got ", side.size());
}

// Products i in [i0, i0 + n) of a group: x xs[i - i0], w[i] with its side tensors from *s on
// (advanced past them), act[i]; each checked, an error naming the product.
void add_products(const char* op, c10::SmallVector<Product, 8>& prs, const at::Tensor* const* xs,
                  at::TensorList w, at::TensorList side, at::IntArrayRef act, size_t i0, size_t n,
                  size_t* s) {
  for (size_t i = i0; i < i0 + n; ++i) {
    const bool q = w[i].scalar_type() == at::kByte;
    prs.push_back({xs[i - i0], &w[i], q ? &side[*s] : nullptr, Act::none});
    *s += q ? 4 : 0;
    try {
      check_product(op, prs.back());
      prs.back().act = check_act(op, act[i]);
    } catch (const c10::Error&) {
      // The same checks again with the product named, which throw the error in those words (the
      // name is not built for every product of every call).
      const std::string name = std::string(op) + " (product " + std::to_string(i) + ")";
      check_product(name.c_str(), prs.back());
      check_act(name.c_str(), act[i]);
      throw;
    }
  }
}

// Products i < len(x) of a call's group (x[i], w[i], act[i], their side tensors from the front of
// side), checked and computed; *s is set to where the side tensors of later products begin.
Outputs run_group(const char* op, at::TensorList x, at::TensorList w, at::TensorList side,
                  at::IntArrayRef act, size_t* s) {
  c10::SmallVector<const at::Tensor*, 8> xs;
  for (const at::Tensor& t : x) xs.push_back(&t);
  c10::SmallVector<Product, 8> prs;
  *s = 0;
  add_products(op, prs, xs.data(), w, side, act, 0, x.size(), s);
  return run_products({prs.data(), prs.size()});
}

std::vector<at::Tensor> linear_one_group(at::TensorList x, at::TensorList w, at::TensorList side,
                                         at::IntArrayRef act) {
  const char* op = "linear_one_group";
  TORCH_CHECK(!x.empty(), op, ": needs at least one product, got none");
  TORCH_CHECK(w.size() == x.size() && act.size() == x.size(), op,
              ": x, w and act must have the same length (one entry per product), got ", x.size(),
              ", ", w.size(), " and ", act.size());
  check_side_count(op, w, side);
  size_t s;
  const Outputs ys = run_group(op, x, w, side, act, &s);
  return {ys.begin(), ys.end()};
}

// Two groups in one call: products [0, len(x)) of x, then one product of the result of product
// src[j] for each j (a low-rank product's second factor after its first).
std::vector<at::Tensor> linear_one_chain(at::TensorList x, at::TensorList w, at::TensorList side,
                                         at::IntArrayRef act, at::IntArrayRef src) {
  const char* op = "linear_one_chain";
  TORCH_CHECK(!x.empty(), op, ": needs at least one product of x, got none");
  TORCH_CHECK(w.size() == x.size() + src.size() && act.size() == w.size(), op,
              ": w and act must have one entry per product (len(x) + len(src) = ",
              x.size() + src.size(), "), got ", w.size(), " and ", act.size());
  for (size_t j = 0; j < src.size(); ++j)
    TORCH_CHECK(src[j] >= 0 && src[j] < static_cast<int64_t>(x.size()), op, ": src[", j,
                "] must name one of the ", x.size(), " products of x (0 to ", x.size() - 1,
                "), got ", src[j]);
  check_side_count(op, w, side);
  size_t s;
  const Outputs y1 = run_group(op, x, w, side, act, &s);
  c10::SmallVector<const at::Tensor*, 8> xs;
  for (const int64_t j : src) xs.push_back(&y1[j]);
  c10::SmallVector<Product, 8> second;
  add_products(op, second, xs.data(), w, side, act, x.size(), src.size(), &s);
  const Outputs y2 = run_products({second.data(), second.size()});
  std::vector<at::Tensor> out(y1.begin(), y1.end());
  out.insert(out.end(), y2.begin(), y2.end());
  return out;
}

// One product of x whose side tensors come as a list (empty for a dense w, mx, rx, my, ry for a
// uint8 one), checked in `op`'s words.
Product one_product(const char* op, const at::Tensor& x, const at::Tensor& w,
                    at::TensorList side, int64_t act, bool slabs) {
  const bool q = w.scalar_type() == at::kByte;
  TORCH_CHECK(side.size() == (q ? 4u : 0u), op,
              q ? ": side must hold mx, rx, my, ry (w is uint8), got "
                : ": side must be empty (w is not uint8), got ",
              side.size(), " tensors");
  Product pr{&x, &w, q ? side.data() : nullptr, Act::none};
  check_product(op, pr, slabs);
  pr.act = check_act(op, act);
  return pr;
}

at::Tensor linear_one_slabs(const at::Tensor& x, const at::Tensor& w, at::TensorList side,
                            int64_t act) {
  Product prs[] = {one_product("linear_one_slabs", x, w, side, act, true)};
  return run_products({prs, 1})[0];
}

// y = residual + y, or residual + gate * y, in place; each operation rounded to T as torch's
// elementwise ops round it (fp32: one IEEE operation each; bf16 and fp16: computed in fp32, then
// rounded to nearest even), so the result is that of `residual + gate * y` in torch, bit for
// bit. (This file is compiled without FMA: the product and the sum never share one rounding.)
template <class T>
void add_residual(T* y, const T* residual, const T* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(y[i]);
    if (gate != nullptr) v = static_cast<float>(static_cast<T>(static_cast<float>(gate[i]) * v));
    y[i] = static_cast<T>(static_cast<float>(residual[i]) + v);
  }
}

// A bf16 value's fp32 value (exact), from its bits.
inline float bf16_value(uint16_t b) {
  return static_cast<float>(c10::BFloat16(b, c10::BFloat16::from_bits()));
}

// add_residual for bf16, to the same bits: the same fp32 operations, rounded to bf16 by the
// ISA's bf16_round kernel (torch's rule, as c10::BFloat16's conversion) 64 values at a time.
void add_residual_bf16(uint16_t* y, const uint16_t* residual, const uint16_t* gate, int64_t n) {
  const KernelTable& kt = kernels();
  float v[64];
  uint16_t gy[64];
  for (int64_t i = 0; i < n; i += 64) {
    const int64_t len = std::min<int64_t>(64, n - i);
    const uint16_t* yi = y + i;
    if (gate != nullptr) {
      for (int64_t j = 0; j < len; ++j) v[j] = bf16_value(gate[i + j]) * bf16_value(yi[j]);
      kt.bf16_round(len, v, gy);
      yi = gy;
    }
    for (int64_t j = 0; j < len; ++j) v[j] = bf16_value(residual[i + j]) + bf16_value(yi[j]);
    kt.bf16_round(len, v, y + i);
  }
}

// Checks a residual and a gate (nullptr: none) for a product of x with M columns, in op's words.
void check_residual(const char* op, const at::Tensor& x, int64_t M, const at::Tensor& residual,
                    const at::Tensor* gate) {
  const RowShape shape = one_row_shape(x, M);
  const at::IntArrayRef want(shape.data(), shape.size());
  const at::Tensor* extra[] = {&residual, gate};
  const char* names[] = {"residual", "gate"};
  for (int i = 0; i < 2; ++i) {
    if (extra[i] == nullptr) continue;
    const at::Tensor& t = *extra[i];
    TORCH_CHECK(t.device() == x.device(), op, ": ", names[i], " must be on the same device as x (",
                x.device(), "), got ", t.device());
    TORCH_CHECK(t.scalar_type() == x.scalar_type(), op, ": ", names[i], " must be ",
                dtype_name(x.scalar_type()), " (x's dtype), got ", dtype_name(t.scalar_type()));
    TORCH_CHECK(t.sizes() == want, op, ": ", names[i], " must have the product's shape ", want,
                ", got ", t.sizes());
  }
}

// y = residual + y, or residual + gate * y (add_residual), y being a product's new result.
void apply_residual(at::Tensor& y, const at::Tensor& residual, const at::Tensor* gate) {
  const at::Tensor r = residual.contiguous();
  const at::Tensor g = gate != nullptr ? gate->contiguous() : at::Tensor();
  const int64_t n = y.numel();
  if (y.scalar_type() == at::kFloat) {
    add_residual(y.data_ptr<float>(), r.data_ptr<float>(),
                 g.defined() ? g.data_ptr<float>() : nullptr, n);
  } else if (y.scalar_type() == at::kBFloat16) {
    const auto bits = [](const at::Tensor& t) {
      return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
    };
    add_residual_bf16(bits(y), bits(r), g.defined() ? bits(g) : nullptr, n);
  } else {  // check_product admits fp16 besides those for int8 weights
    add_residual(y.data_ptr<at::Half>(), r.data_ptr<at::Half>(),
                 g.defined() ? g.data_ptr<at::Half>() : nullptr, n);
  }
}

at::Tensor linear_one_residual(const at::Tensor& x, const at::Tensor& w, at::TensorList side,
                               int64_t act, const at::Tensor& residual,
                               const std::optional<at::Tensor>& gate) {
  const char* op = "linear_one_residual";
  Product prs[] = {one_product(op, x, w, side, act, w.dim() == 3)};
  const at::Tensor* g = gate.has_value() ? &*gate : nullptr;
  check_residual(op, x, prs[0].M, residual, g);
  at::Tensor y = run_products({prs, 1})[0];  // a new tensor in x's dtype, ours to write
  apply_residual(y, residual, g);
  return y;
}

// A channel mix in one call: products i < len(x) of x[i] (linear_one_group's), then the value
// product w[len(x)] (a matrix or row slabs) of the last one's result, then residual + y, or
// residual + (result of product gate) * y for gate >= 0 (RWKV-4/5/6's receptance).
at::Tensor linear_one_ffn(at::TensorList x, at::TensorList w, at::TensorList side,
                          at::IntArrayRef act, const at::Tensor& residual, int64_t gate) {
  const char* op = "linear_one_ffn";
  TORCH_CHECK(!x.empty(), op, ": needs at least one product of x, got none");
  TORCH_CHECK(w.size() == x.size() + 1 && act.size() == x.size(), op,
              ": w must hold a weight per x and the value's (", x.size() + 1,
              "), act one per x (", x.size(), "), got ", w.size(), " and ", act.size());
  TORCH_CHECK(gate >= -1 && gate < static_cast<int64_t>(x.size()), op,
              ": gate must be -1 (none) or one of the ", x.size(), " products of x, got ", gate);
  check_side_count(op, w, side);
  const size_t n = x.size();
  size_t s;
  const Outputs y1 = run_group(op, x, w, side, act, &s);
  Product value[] = {one_product(op, y1[n - 1], w[n], side.slice(s), 0, w[n].dim() == 3)};
  const at::Tensor* g = gate >= 0 ? &y1[gate] : nullptr;
  check_residual(op, y1[n - 1], value[0].M, residual, g);
  at::Tensor y = run_products({value, 1})[0];
  apply_residual(y, residual, g);
  return y;
}

// The planned form of the group, chain, residual and ffn ops (product_step.h). The first call
// is the op's own call (all its checks); the products are then checked again and laid out from
// that call's arguments (a chain's or ffn's second products from the first's results) and kept.
// Later calls run the laid-out products (run_laid_out, as the op does) on their x.
class PlannedProducts final : public ProductStep {
 public:
  enum Kind { kGroup, kChain, kResidual, kFfn };
  PlannedProducts(Kind kind, const char* op, bool reuse) : kind_(kind), op_(op), reuse_(reuse) {}

  std::vector<at::Tensor> run(const Call& c) override {
    if (!planned_ || !still_valid()) return first_call(c);
    TORCH_CHECK(c.x.size() == first_.size() && c.w.data() == w_data_ &&
                    c.side.data() == side_data_,
                op_, " (planned): called with other weights or another number of products");
    for (size_t i = 0; i < first_.size(); ++i) {
      TORCH_CHECK(c.x[i].scalar_type() == x_dtype_[i] && c.x[i].sizes() == x_sizes_[i], op_,
                  " (planned): x[", i, "] must keep its first call's dtype and shape (",
                  dtype_name(x_dtype_[i]), ", ", at::IntArrayRef(x_sizes_[i]), "), got ",
                  dtype_name(c.x[i].scalar_type()), ", ", c.x[i].sizes());
      first_[i].x = &c.x[i];
      first_[i].out = out1_.empty() ? nullptr : &out1_[i];
    }
    Outputs y1 = run_laid_out({first_.data(), first_.size()}, l1_);
    Outputs y2;
    for (size_t j = 0; j < second_.size(); ++j) {
      second_[j].x = &y1[kind_ == kChain ? static_cast<size_t>(c.src[j]) : y1.size() - 1];
      second_[j].out = out2_.empty() ? nullptr : &out2_[j];
    }
    if (!second_.empty()) y2 = run_laid_out({second_.data(), second_.size()}, l2_);
    if (kind_ == kResidual) {
      check_residual(op_, c.x[0], first_[0].M, *c.residual, c.gate);
      apply_residual(y1[0], *c.residual, c.gate);
    } else if (kind_ == kFfn) {
      const at::Tensor* g = c.gate_index >= 0 ? &y1[static_cast<size_t>(c.gate_index)] : nullptr;
      check_residual(op_, y1.back(), second_[0].M, *c.residual, g);
      apply_residual(y2[0], *c.residual, g);
      return {y2[0]};
    }
    std::vector<at::Tensor> out(y1.begin(), y1.end());
    out.insert(out.end(), y2.begin(), y2.end());
    return out;
  }

 private:
  // Whether the layouts still hold: the same instruction set (a layout reads x as bf16 where the
  // ISA has bf16 dots) and the weights where they were laid out (a tensor whose storage was
  // replaced since, with set_(), would leave the layout pointing at memory no longer its own).
  bool still_valid() const { return &kernels() == kt_ && memory() == data_; }

  // Each product's w and side tensors' memory, in order.
  c10::SmallVector<const void*, 32> memory() const {
    c10::SmallVector<const void*, 32> m;
    for (const auto* prs : {&first_, &second_}) {
      for (const Product& pr : *prs) {
        m.push_back(pr.w->data_ptr());
        for (int k = 0; pr.int8() && k < 4; ++k) m.push_back(pr.side[k].data_ptr());
      }
    }
    return m;
  }

  // The op's own call, then the plan from its arguments and results (again where a layout no
  // longer holds, still_valid).
  std::vector<at::Tensor> first_call(const Call& c) {
    planned_ = false;
    first_.clear();
    second_.clear();
    x_dtype_.clear();
    x_sizes_.clear();
    out1_.clear();
    out2_.clear();
    std::vector<at::Tensor> res;
    if (kind_ == kGroup) {
      res = linear_one_group(c.x, c.w, c.side, c.act);
    } else if (kind_ == kChain) {
      res = linear_one_chain(c.x, c.w, c.side, c.act, c.src);
    } else if (kind_ == kResidual) {
      const std::optional<at::Tensor> gate =
          c.gate != nullptr ? std::optional<at::Tensor>(*c.gate) : std::nullopt;
      res = {linear_one_residual(c.x[0], c.w[0], c.side, c.act[0], *c.residual, gate)};
    } else {
      res = {linear_one_ffn(c.x, c.w, c.side, c.act, *c.residual, c.gate_index)};
    }
    w_data_ = c.w.data();
    side_data_ = c.side.data();
    for (const at::Tensor& t : c.x) {
      x_dtype_.push_back(t.scalar_type());
      x_sizes_.emplace_back(t.sizes().begin(), t.sizes().end());
    }
    size_t s = 0;
    if (kind_ == kResidual) {
      first_.push_back(one_product(op_, c.x[0], c.w[0], c.side, c.act[0], c.w[0].dim() == 3));
    } else {
      c10::SmallVector<const at::Tensor*, 8> xs;
      for (const at::Tensor& t : c.x) xs.push_back(&t);
      add_products(op_, first_, xs.data(), c.w, c.side, c.act, 0, c.x.size(), &s);
    }
    l1_ = lay_out({first_.data(), first_.size()});
    const size_t n = c.x.size();
    if (kind_ == kChain) {
      c10::SmallVector<const at::Tensor*, 8> xs;
      for (const int64_t j : c.src) xs.push_back(&res[static_cast<size_t>(j)]);
      add_products(op_, second_, xs.data(), c.w, c.side, c.act, n, c.src.size(), &s);
    } else if (kind_ == kFfn) {
      // The group's results stay inside the op: always in tensors of its own.
      for (const Product& pr : first_) {
        const RowShape shape = one_row_shape(*pr.x, pr.M);
        out1_.push_back(pooled_empty(at::IntArrayRef(shape.data(), shape.size()), pr.x_dtype()));
      }
      second_.push_back(one_product(op_, out1_[n - 1], c.w[n], c.side.slice(s), 0,
                                    c.w[n].dim() == 3));
    }
    if (!second_.empty()) l2_ = lay_out({second_.data(), second_.size()});
    kt_ = &kernels();
    data_ = memory();
    if (reuse_) {
      if (kind_ == kFfn) {
        out2_ = {res[0]};
      } else {
        out1_.assign(res.begin(), res.begin() + static_cast<std::ptrdiff_t>(first_.size()));
        out2_.assign(res.begin() + static_cast<std::ptrdiff_t>(first_.size()), res.end());
      }
    }
    planned_ = true;
    return res;
  }

  Kind kind_;
  const char* op_;
  bool reuse_;
  bool planned_ = false;
  const KernelTable* kt_ = nullptr;  // the kernels the layouts were made for
  c10::SmallVector<const void*, 32> data_;  // memory() when the layouts were made
  const at::Tensor* w_data_ = nullptr;
  const at::Tensor* side_data_ = nullptr;
  c10::SmallVector<at::ScalarType, 8> x_dtype_;
  c10::SmallVector<c10::SmallVector<int64_t, 2>, 8> x_sizes_;
  c10::SmallVector<Product, 8> first_, second_;
  Layout l1_, l2_;
  std::vector<at::Tensor> out1_, out2_;  // the results' tensors, reused (empty: new ones)
};

}  // namespace

std::unique_ptr<ProductStep> ProductStep::make(const std::string& op, bool reuse) {
  using K = PlannedProducts;
  if (op == "rwkv::linear_one_group")
    return std::make_unique<K>(K::kGroup, "linear_one_group", reuse);
  if (op == "rwkv::linear_one_chain")
    return std::make_unique<K>(K::kChain, "linear_one_chain", reuse);
  if (op == "rwkv::linear_one_residual")
    return std::make_unique<K>(K::kResidual, "linear_one_residual", reuse);
  if (op == "rwkv::linear_one_ffn") return std::make_unique<K>(K::kFfn, "linear_one_ffn", reuse);
  return nullptr;
}

}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("linear_one", &rwkv::cpu::linear_one);
  m.impl("mm8_one_i16", &rwkv::cpu::mm8_one_i16);
  m.impl("linear_one_group", &rwkv::cpu::linear_one_group);
  m.impl("linear_one_chain", &rwkv::cpu::linear_one_chain);
  m.impl("linear_one_slabs", &rwkv::cpu::linear_one_slabs);
  m.impl("linear_one_residual", &rwkv::cpu::linear_one_residual);
  m.impl("linear_one_ffn", &rwkv::cpu::linear_one_ffn);
}
