// ATen glue for the products of one token on CPU: linear_one (bf16/fp32 matrix-vector),
// mm8_one_i16 (int8 weights, the activation rounded to int16) and linear_one_group (several such
// products in one call). Every product is checked in the contract's words (common/op_checks.h),
// prepared (fp32 x; for int8, xs = x*ry, its sums and its int16 rounding: cpu/mm8_prepare.h),
// then all the products' output columns are split between threads as one range
// (for_member_blocks), the kernels of the active instruction set computing each column, with an
// optional activation (common/activation.h). A group is thus one call and one parallel region
// where separate products are several: while decoding, each call costs tens of microseconds
// beyond its weight's reading (docs/kernels.md). Schemas: rwkv/ops/_schemas.py. Math:
// csrc/cpu/kernels/linear.h, kernels/mm8.h.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "common/activation.h"
#include "common/op_checks.h"
#include "cpu/cpu_features.h"
#include "cpu/mm8_prepare.h"
#include "cpu/parallel.h"

namespace rwkv {
namespace cpu {
namespace {

constexpr int64_t kPad = 64;  // mm8_one_i16's int16 rows: a multiple of 64 (every Dot16 reads that)

// One product y = act(x @ w) of one token: w column-major bf16/fp32 (dense) or uint8 with its
// side tensors mx, rx, my, ry (int8, mm8_one_i16's math).
struct Product {
  const at::Tensor* x;
  const at::Tensor* w;
  const at::Tensor* side;  // int8: mx, rx, my, ry in a row; dense: nullptr
  Act act;
  int64_t N = 0, M = 0;
  at::Tensor x32, y;  // x in fp32; y fp32, [M] or [1, M] as x
  Mm8Prepared p;      // int8 only
  int16_t* xq = nullptr;
  float scale = 0.0f;  // int8: 0 = the fp32 loop (xs all zero or not finite)

  bool int8() const { return side != nullptr; }
  // Bytes of w per output column: what the threads share out.
  int64_t column_bytes() const { return N * (int8() ? 1 : static_cast<int64_t>(w->element_size())); }
};

// Checks one product's arguments; `op` names it in messages.
void check_product(const char* op, Product& pr) {
  if (pr.int8()) {
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

// Prepares checked products (the serial part), then computes every output column, threaded.
// Returns each y in its x's dtype.
std::vector<at::Tensor> run_products(std::vector<Product>& prs) {
  // This thread's scratch: int8 products' xs and sums, and their int16 rounding of xs.
  int64_t floats = 0, shorts = 0;
  for (const Product& pr : prs) {
    if (pr.int8()) {
      floats += mm8_one_token_floats(pr.N);
      shorts += (pr.N + kPad - 1) / kPad * kPad;
    }
  }
  thread_local Scratch float_buf, short_buf;
  float* fp = float_buf.get<float>(floats);
  int16_t* sp = short_buf.get<int16_t>(shorts);
  const KernelTable& kt = kernels();
  for (Product& pr : prs) {
    if (pr.int8()) {
      const at::Tensor* s = pr.side;
      pr.p = mm8_prepare({1, pr.N, pr.M}, false, *pr.x, *pr.w, s[0], s[1], s[2], s[3], fp);
      pr.x32 = pr.p.x32;
      const int64_t n_pad = (pr.N + kPad - 1) / kPad * kPad;
      pr.xq = sp;
      // sum(xs) is finite exactly when every xs is (barring overflow, which also takes the fp32 path).
      pr.scale = std::isfinite(pr.p.sums[0]) && pr.N > 0
                     ? kt.mm8_quantize_i16(pr.N, n_pad, pr.p.xs, pr.xq)
                     : 0.0f;
      fp += mm8_one_token_floats(pr.N);
      sp += n_pad;
    } else {
      // (Only when needed: a no-op .to() still costs a dispatch per product.)
      pr.x32 = fp32(*pr.x);
    }
    pr.y = at::empty(one_row_shape(*pr.x, pr.M), pr.x32.options());
  }
  std::vector<int64_t> columns, bytes;
  for (const Product& pr : prs) {
    columns.push_back(pr.M);
    bytes.push_back(pr.column_bytes());
  }
  const bool sequential = read_sequential();
  // Blocks of 16 columns keep the kernels' column groups whole.
  for_member_blocks(columns, bytes, 16, [&](size_t i, int64_t m0, int64_t m1) {
    const Product& pr = prs[i];
    float* y = pr.y.data_ptr<float>();
    const float* x = pr.x32.data_ptr<float>();
    if (pr.int8() && pr.scale == 0.0f) {
      mm8_columns(pr.p, m0, m1, y);
    } else if (pr.int8()) {
      kt.mm8_i16(pr.N, m0, m1, pr.xq, pr.p.q.data_ptr<uint8_t>(), pr.scale, pr.p.sums,
                 pr.p.rx32.data_ptr<float>(), pr.p.mx32.data_ptr<float>(), y, sequential);
    } else if (pr.w->scalar_type() == at::kFloat) {
      kt.linear_one_f32(pr.N, m0, m1, x, pr.w->data_ptr<float>(), y, sequential);
    } else {
      const auto* w = reinterpret_cast<const uint16_t*>(pr.w->data_ptr<at::BFloat16>());
      kt.linear_one_bf16(pr.N, m0, m1, x, w, y, sequential);
    }
    activate(pr.act, y + m0, m1 - m0);
  });
  std::vector<at::Tensor> out;
  out.reserve(prs.size());
  for (const Product& pr : prs) out.push_back(in_dtype(pr.y, *pr.x));
  return out;
}

at::Tensor linear_one(const at::Tensor& x, const at::Tensor& w, int64_t act) {
  std::vector<Product> prs{{&x, &w, nullptr, Act::none}};
  check_product("linear_one", prs[0]);
  prs[0].act = check_act("linear_one", act);
  return run_products(prs)[0];
}

at::Tensor mm8_one_i16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mx,
                       const at::Tensor& rx, const at::Tensor& my, const at::Tensor& ry,
                       int64_t act) {
  const std::array<at::Tensor, 4> side{mx, rx, my, ry};
  std::vector<Product> prs{{&x, &w, side.data(), Act::none}};
  check_product("mm8_one_i16", prs[0]);
  prs[0].act = check_act("mm8_one_i16", act);
  return run_products(prs)[0];
}

std::vector<at::Tensor> linear_one_group(at::TensorList x, at::TensorList w, at::TensorList side,
                                         at::IntArrayRef act) {
  const char* op = "linear_one_group";
  TORCH_CHECK(!x.empty(), op, ": needs at least one product, got none");
  TORCH_CHECK(w.size() == x.size() && act.size() == x.size(), op,
              ": x, w and act must have the same length (one entry per product), got ", x.size(),
              ", ", w.size(), " and ", act.size());
  size_t int8 = 0;
  for (const at::Tensor& t : w) int8 += t.scalar_type() == at::kByte;
  TORCH_CHECK(side.size() == 4 * int8, op,
              ": side must hold mx, rx, my, ry of each uint8 w, in order: ", 4 * int8,
              " tensors for ", int8, ", got ", side.size());
  std::vector<Product> prs;
  prs.reserve(x.size());
  size_t s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool q = w[i].scalar_type() == at::kByte;
    prs.push_back({&x[i], &w[i], q ? &side[s] : nullptr, Act::none});
    s += q ? 4 : 0;
    const std::string name = std::string(op) + " (product " + std::to_string(i) + ")";
    check_product(name.c_str(), prs.back());
    prs.back().act = check_act(name.c_str(), act[i]);
  }
  return run_products(prs);
}

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_IMPL(rwkv, CPU, m) {
  m.impl("linear_one", &rwkv::cpu::linear_one);
  m.impl("mm8_one_i16", &rwkv::cpu::mm8_one_i16);
  m.impl("linear_one_group", &rwkv::cpu::linear_one_group);
}
