// The column order of the one-token matrix-vector loops (mm8.h's int8 loop, linear.h's dense ones):
// one column after another (the `sequential` read order, AMD), or else B streams over B equal parts of the columns a
// call gets, stream b reading part b's columns one after another, so each stream is one run of
// consecutive memory, and a software prefetch a fixed distance ahead in a stream runs on into its
// next column. The B streams advance a step each in turn and share each load of x. B adjacent
// columns at a time would read slower: their prefetches land in one another's columns
// (docs/kernels.md).
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"  // (which checks that RWKV_ISA is defined)

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// How far ahead the products of several rows (linear_rows.h, mm8.h's mm8_i16_rows) prefetch
// each column they read, one prefetch per 64-byte line: with several rows' multiply-adds per
// weight the hardware prefetcher alone falls behind the weights' stream from memory.
constexpr int64_t kRowsAhead = 4096;

// Columns [m0, m1) in the loops' read order: sequential, col(m) for each column in turn (one
// stream per thread); otherwise as B streams, cols(m, L) for m = m0 .. m0 + L - 1 computing the B
// columns m, m + L, ..., m + (B-1)*L (L = (m1 - m0) / B), then col(m) for each column left.
template <int B, class Cols, class Col>
inline void column_streams(int64_t m0, int64_t m1, bool sequential, const Cols& cols,
                           const Col& col) {
  const int64_t L = sequential ? 0 : (m1 - m0) / B;
  for (int64_t i = 0; i < L; ++i) cols(m0 + i, L);
  for (int64_t m = m0 + B * L; m < m1; ++m) col(m);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
