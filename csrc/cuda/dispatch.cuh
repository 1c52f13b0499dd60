// Compile-time head size bucket for the wkv5/6/7 kernels: the smallest of 16, 32, 64, 128, 256
// that holds the runtime head size n (the kernels mask channels >= n). The torch glue rejects
// n > kWkvMaxHeadSize first (kernels.h); a larger n would launch nothing.
#pragma once

#define RWKV_HEAD_SIZE_CASE(bucket, CONST_NAME, ...) \
  if (n_ <= bucket) {                                \
    constexpr int CONST_NAME = bucket;               \
    __VA_ARGS__;                                     \
    break;                                           \
  }

#define RWKV_HEAD_SIZE_SWITCH(n, CONST_NAME, ...)     \
  do {                                                \
    const int64_t n_ = (n);                           \
    RWKV_HEAD_SIZE_CASE(16, CONST_NAME, __VA_ARGS__)  \
    RWKV_HEAD_SIZE_CASE(32, CONST_NAME, __VA_ARGS__)  \
    RWKV_HEAD_SIZE_CASE(64, CONST_NAME, __VA_ARGS__)  \
    RWKV_HEAD_SIZE_CASE(128, CONST_NAME, __VA_ARGS__) \
    RWKV_HEAD_SIZE_CASE(256, CONST_NAME, __VA_ARGS__) \
  } while (0)
