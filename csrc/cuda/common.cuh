// Torch-free device helpers shared by the CUDA kernel files (csrc/cuda/*.cu).
// Nothing here includes a torch header: the .cu files are compiled by nvcc once per architecture,
// and keeping ATen out of them keeps that compile short (see docs/cuda.md). Launchers with the
// torch glue live in the matching *_op.cpp files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace rwkv {
namespace cuda {

// Conversions between the three activation types and fp32, all done in fp32 registers.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Sum over aligned groups of `Width` consecutive lanes (Width a power of two <= 32). The xor
// butterfly gives every lane of the group the same, fixed-order result, so reductions built on it
// are deterministic.
template <int Width>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = Width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off, Width);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return group_sum<32>(v); }

// Work split of the wkv5/6/7 kernels for head size n. The reduction axis of the recurrence (key
// i for wkv5/6, key j for wkv7) is split over G threads in consecutive lanes, each keeping
// P = n / G state values in registers and combining partial sums with group_sum<G>. The other
// axis (value channels) is independent, so a block takes wkv_block_channels(n) of them and a head
// spans n / wkv_block_channels(n) blocks: small blocks (<= 256 threads), more blocks for decode.
__host__ __device__ constexpr int wkv_group(int n) {
  return n >= 16 ? (n / 16 < 8 ? n / 16 : 8) : 1;
}
__host__ __device__ constexpr int wkv_per_thread(int n) { return n / wkv_group(n); }
__host__ __device__ constexpr int wkv_block_channels(int n) { return n < 32 ? n : 32; }
__host__ __device__ constexpr int wkv_threads(int n) {
  return wkv_block_channels(n) * wkv_group(n);
}

template <int N>
struct WkvSplit {
  static constexpr int G = wkv_group(N);            // threads sharing one reduction
  static constexpr int P = wkv_per_thread(N);       // state values per thread
  static constexpr int JB = wkv_block_channels(N);  // value channels per block
  static constexpr int kThreads = wkv_threads(N);
  static_assert(G * P == N && N % JB == 0, "head size must split evenly");
  static_assert(kThreads >= N, "every channel needs a loader thread");
};

}  // namespace cuda
}  // namespace rwkv
