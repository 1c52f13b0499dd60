// Dense products of several rows (linear_rows): y[t, m] = x[t] . w[:, m] for rows t < T and output
// columns [m0, m1), w column-major (column m = N contiguous elements at w + m*N; bf16 widened to
// fp32 in registers, or fp32), x fp32 with row stride ldx, fp32 accumulation. Blocks of 3 columns
// by up to 8 rows (2 by 4 with 256-bit registers, whose 16 registers hold fewer accumulators)
// share every load: each weight is loaded once for all the rows of a group; more rows take
// further groups, which read the block's columns from the cache. A step of the batched engine
// thus reads each weight from memory once for all its rows. The columns of a block, and the
// blocks of a thread's range, lie one after another in memory.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/kernels/streams.h"
#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Rows [t, t + R) by columns [m, m + C): y[(t + r)*ldy + m + c] (=, or += with accumulate).
template <class V, int R, int C, class T>
inline void rows_block(int64_t N, int64_t t, int64_t m, const float* x, int64_t ldx, const T* w,
                       float* y, int64_t ldy, bool accumulate) {
  using Reg = typename V::reg;
  using S = typename V::Tail;
  constexpr int W = V::width;
  const T* col[C];
  const float* row[R];
  Reg acc[R][C];
  for (int c = 0; c < C; ++c) col[c] = w + (m + c) * N;
  for (int r = 0; r < R; ++r) {
    row[r] = x + (t + r) * ldx;
    for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
  }
  int64_t n = 0;
  for (; n + W <= N; n += W) {
    Reg wv[C];
    for (int c = 0; c < C; ++c) {
      if ((n * static_cast<int64_t>(sizeof(T))) % 64 == 0)  // one prefetch a line (streams.h)
        __builtin_prefetch(reinterpret_cast<const char*>(col[c] + n) + kRowsAhead);
      wv[c] = load_elems<V>(col[c] + n);
    }
    for (int r = 0; r < R; ++r) {
      Reg xv = V::load(row[r] + n);
      // Kept in a register: the compiler otherwise folds the load into each column's multiply-add
      // as a memory operand, loading x once per column where one load serves them all.
      if constexpr (C > 1) asm("" : "+v"(xv));
      for (int c = 0; c < C; ++c) acc[r][c] = V::fma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float dot = V::reduce_add(acc[r][c]);
      for (int64_t k = n; k < N; ++k) dot += row[r][k] * load_elems<S>(col[c] + k);
      float* out = y + (t + r) * ldy + m + c;
      *out = accumulate ? *out + dot : dot;
    }
  }
}

// Rows per group: the accumulators of a group's R x C block stay in registers (8 x 3 of 32
// with 512-bit registers, 4 x 2 of 16 with narrower ones). A block of up to kRowGroup rows thus
// loads each weight once for all of them, the multiply-adds of every row following each load.
template <class V>
constexpr int kRowGroup = V::width >= 16 ? 8 : 4;

// One group of r < R rows (the rows left), dispatched to its block size.
template <class V, int R, int C, class T>
inline void rows_tail(int r, int64_t N, int64_t t, int64_t m, const float* x, int64_t ldx, const T* w,
                      float* y, int64_t ldy, bool accumulate) {
  if constexpr (R > 1) {
    if (r == R - 1) return rows_block<V, R - 1, C>(N, t, m, x, ldx, w, y, ldy, accumulate);
    rows_tail<V, R - 1, C>(r, N, t, m, x, ldx, w, y, ldy, accumulate);
  }
}

// Every row of columns [m, m + C): groups of kRowGroup rows, then the rows left.
template <class V, int C, class T>
inline void rows_columns(int64_t T_, int64_t N, int64_t m, const float* x, int64_t ldx, const T* w,
                         float* y, int64_t ldy, bool accumulate) {
  constexpr int R = kRowGroup<V>;
  int64_t t = 0;
  for (; t + R <= T_; t += R) rows_block<V, R, C>(N, t, m, x, ldx, w, y, ldy, accumulate);
  if (t < T_) rows_tail<V, R, C>(static_cast<int>(T_ - t), N, t, m, x, ldx, w, y, ldy, accumulate);
}

// Up to this many rows a block is one column: a thread then reads its weights as one sequential
// stream; more rows take several columns a block (each load of x serves them all), whose streams
// lie one after another in memory.
constexpr int64_t kOneColumnRows = 2;

// Columns per block for more rows: 3 with 32 registers (8 x 3 accumulators), 2 with 16.
template <class V>
constexpr int kRowColumns = V::width >= 16 ? 3 : 2;

// Columns [m0, m1) in blocks for T_ rows: single columns up to kOneColumnRows rows, else blocks
// of C columns, then one of 2 and single columns for the rest. block(c, m) computes columns
// [m, m + c), c a std::integral_constant.
template <int C, class Block>
inline void column_blocks(int64_t T_, int64_t m0, int64_t m1, const Block& block) {
  int64_t m = m0;
  if (T_ > kOneColumnRows) {
    for (; m + C <= m1; m += C) block(std::integral_constant<int, C>{}, m);
    if constexpr (C > 2) {
      if (m + 2 <= m1) {
        block(std::integral_constant<int, 2>{}, m);
        m += 2;
      }
    }
  }
  for (; m < m1; ++m) block(std::integral_constant<int, 1>{}, m);
}

// linear_rows on output columns [m0, m1) of y [T, M] (row stride M).
template <class V, class T>
void linear_rows(int64_t T_, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* x,
                 int64_t ldx, const T* w, float* y, bool accumulate) {
  column_blocks<kRowColumns<V>>(T_, m0, m1, [&](auto cols, int64_t m) {
    rows_columns<V, decltype(cols)::value>(T_, N, m, x, ldx, w, y, M, accumulate);
  });
}

// linear_rows with bf16 rows of x (row stride ldx elements) and bf16 weights, for Vec policies
// with bf16 dot products (V::bf16_rows_block): groups of 8 rows by 3 columns, as linear_rows.
template <class V>
void linear_rows_bf16x(int64_t T_, int64_t N, int64_t M, int64_t m0, int64_t m1, const uint16_t* x,
                       int64_t ldx, const uint16_t* w, float* y, bool accumulate) {
  const auto columns = [&](auto cols, int64_t m) {
    constexpr int C = decltype(cols)::value;
    int64_t t = 0;
    for (; t + 8 <= T_; t += 8) V::template bf16_rows_block<8, C>(N, t, m, x, ldx, w, y, M, accumulate);
    switch (T_ - t) {
      case 7: V::template bf16_rows_block<7, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      case 6: V::template bf16_rows_block<6, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      case 5: V::template bf16_rows_block<5, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      case 4: V::template bf16_rows_block<4, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      case 3: V::template bf16_rows_block<3, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      case 2: V::template bf16_rows_block<2, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      case 1: V::template bf16_rows_block<1, C>(N, t, m, x, ldx, w, y, M, accumulate); break;
      default: break;
    }
  };
  column_blocks<3>(T_, m0, m1, columns);
}

// Whether the Vec policy V has bf16 dot products for rows (V::bf16_rows_block).
template <class V, class = void>
struct HasBf16Rows : std::false_type {};
template <class V>
struct HasBf16Rows<V, std::void_t<decltype(&V::template bf16_rows_block<1, 1>)>> : std::true_type {};

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
