// Dense matrix-vector product for decode: y[m] = Σ_n x[n]·w[n,m], x [N] and w [N, M] bf16 with w
// column-major (column m = N contiguous values at w + m·N, the model's weight layout), y [M] bf16,
// fp32 accumulation. Memory bound: a warp computes 4 columns, streaming each column once with
// 16-byte loads (8 values), then a fixed-order warp sum (deterministic, no atomics).
#include "common.cuh"
#include "kernels.h"

namespace {

using rwkv::cuda::from_f32;
using rwkv::cuda::to_f32;
using rwkv::cuda::warp_sum;

constexpr int kWarps = 4;  // warps per block
constexpr int kCols = 4;   // output columns per warp

// Eight consecutive values as fp32 (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float (&o)[8]) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = to_f32(e[i]);
}

// Grid ceil(M / (kWarps·kCols)); block kWarps warps. Columns past M are clamped for loading and
// never written.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
linear_one_kernel(const int64_t N, const int64_t M, const T* __restrict__ x,
                  const T* __restrict__ w, T* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kCols;
  if (m0 >= M) return;  // whole warps only: the shuffles below need all 32 lanes
  const T* col[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) col[c] = w + (m0 + c < M ? m0 + c : M - 1) * N;
  float acc[kCols] = {};
  if (kVec) {
    const int64_t chunks = N / 8;
#pragma unroll 2
    for (int64_t ch = lane; ch < chunks; ch += 32) {
      float xv[8];
      load8(x + ch * 8, xv);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float wv[8];
        load8(col[c] + ch * 8, wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[c] += xv[e] * wv[e];
      }
    }
  } else {
    for (int64_t n = lane; n < N; n += 32) {
      const float xf = to_f32(x[n]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] += xf * to_f32(col[c][n]);
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float total = warp_sum(acc[c]);
    if (lane == c && m0 + c < M) y[m0 + c] = from_f32<T>(total);
  }
}

}  // namespace

namespace rwkv {
namespace cuda {

void linear_one_bf16(int64_t N, int64_t M, const void* x, const void* w, void* y, bool vec,
                     cudaStream_t stream) {
  if (M == 0) return;
  using T = __nv_bfloat16;
  const unsigned blocks = static_cast<unsigned>((M + kWarps * kCols - 1) / (kWarps * kCols));
  const T* X = static_cast<const T*>(x);
  const T* W = static_cast<const T*>(w);
  T* Y = static_cast<T*>(y);
  if (vec)
    linear_one_kernel<T, true><<<blocks, kWarps * 32, 0, stream>>>(N, M, X, W, Y);
  else
    linear_one_kernel<T, false><<<blocks, kWarps * 32, 0, stream>>>(N, M, X, W, Y);
}

}  // namespace cuda
}  // namespace rwkv
