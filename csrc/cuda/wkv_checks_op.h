// Checks shared by the wkv5/6/7 CUDA glue (wkv56_op.cpp, wkv7_op.cpp), in the order and words of
// rwkv/ops/_checks.py (macros from csrc/common/checks.h), plus the CUDA-only head size limit.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/checks.h"
#include "cuda/kernels.h"

// r-like [T, H*N] fp32 input.
#define RWKV_CUDA_CHECK_ROWS(op, x, T, C) \
  RWKV_CHECK_DTYPE(op, x, at::kFloat);    \
  RWKV_CHECK_SHAPE(op, x, "[T, H*N]", T, C)

// The [H, N, N] fp32 contiguous state (in place) and the compiled head sizes; declares H and N.
#define RWKV_CUDA_CHECK_STATE(op, state, H, N)                                            \
  RWKV_CHECK_DTYPE(op, state, at::kFloat);                                                \
  RWKV_CHECK_DIM(op, state, "[H, N, N]", 3);                                              \
  const int64_t H = state.size(0), N = state.size(1);                                     \
  RWKV_CHECK_SHAPE(op, state, "[H, N, N]", H, N, N);                                      \
  RWKV_CHECK_CONTIGUOUS(op, state);                                                       \
  TORCH_CHECK(N <= ::rwkv::cuda::kWkvMaxHeadSize, op,                                     \
              ": state must have a head size N (state.size(1)) of at most ",              \
              ::rwkv::cuda::kWkvMaxHeadSize, " on CUDA, got ", N)

// r: the first [T, H*N] argument; declares T.
#define RWKV_CUDA_CHECK_T(op, r, T)        \
  RWKV_CHECK_DTYPE(op, r, at::kFloat);     \
  RWKV_CHECK_DIM(op, r, "[T, H*N]", 2);    \
  const int64_t T = r.size(0)
