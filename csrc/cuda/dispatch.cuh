// Compile-time head size for the wkv5/6/7 kernels. The torch glue rejects unsupported sizes
// first (rwkv::cuda::wkv_head_size_supported, kernels.h), so the default branch is unreachable
// through the ops; it returns without launching.
#pragma once

#define RWKV_HEAD_SIZE_CASE(n_value, CONST_NAME, ...) \
  case n_value: {                                     \
    constexpr int CONST_NAME = n_value;               \
    __VA_ARGS__;                                      \
    break;                                            \
  }

#define RWKV_HEAD_SIZE_SWITCH(n, CONST_NAME, ...)      \
  switch (n) {                                         \
    RWKV_HEAD_SIZE_CASE(16, CONST_NAME, __VA_ARGS__)   \
    RWKV_HEAD_SIZE_CASE(32, CONST_NAME, __VA_ARGS__)   \
    RWKV_HEAD_SIZE_CASE(64, CONST_NAME, __VA_ARGS__)   \
    RWKV_HEAD_SIZE_CASE(128, CONST_NAME, __VA_ARGS__)  \
    RWKV_HEAD_SIZE_CASE(256, CONST_NAME, __VA_ARGS__)  \
    default:                                           \
      break;                                           \
  }
