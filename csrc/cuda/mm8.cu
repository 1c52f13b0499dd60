// Int8 matmul y = x @ ((w + 0.5) ⊙ ry ⊙ rx + my + mx) for x [T, N] (fp32, fp16 or bf16), w [N, M]
// uint8 stored column-major (column m = N contiguous bytes at w + m·N), mx, rx [M], my, ry [N]
// in x's dtype; y [T, M] in x's dtype. The dequantized matrix is never formed: with xs = x ⊙ ry,
//   y[t,m] = rx[m]·(Σ_n xs[t,n]·w[n,m] + 0.5·Σ_n xs[t,n]) + Σ_n x[t,n]·my[n] + mx[m]·Σ_n x[t,n]
// accumulated in fp32. Deterministic: no atomics; every sum is reduced in a fixed order.
// T <= 16 (decode, short prompts): mm8_rows_kernel, a warp per 4 columns streams the weights once
// with 16-byte loads (memory bound) for up to RT rows at a time. T > 16: mm8_tiled_kernel, a
// 64 x 64 output tile per block with the x and w tiles staged in shared memory (compute bound).
#include "common.cuh"
#include "kernels.h"

namespace {

using rwkv::cuda::from_f32;
using rwkv::cuda::to_f32;
using rwkv::cuda::warp_sum;

constexpr int kWarps = 4;  // warps per block of the row kernel
constexpr int kCols = 4;   // output columns per warp of the row kernel

// Byte b of `word` as an exact float: the bits 0x4B0000bb are the float 2^23 + bb. Cheaper than
// an int-to-float conversion, whose throughput would cap the memory-bound row kernel.
__device__ __forceinline__ float byte_to_f32(uint32_t word, int b) {
  return __int_as_float(__byte_perm(word, 0x4B000000u, 0x7440 + b)) - 8388608.f;
}

// Sixteen consecutive activations as fp32 (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load16(const T* __restrict__ p, float (&o)[16]) {
  constexpr int kPer = 16 / sizeof(T);
#pragma unroll
  for (int c = 0; c < 16 / kPer; ++c) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + c * kPer);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPer; ++i) o[c * kPer + i] = to_f32(e[i]);
  }
}

template <typename T>
__device__ __forceinline__ T finish(float dot, float sxs, float sxmy, float sx, T rx, T mx) {
  return from_f32<T>(to_f32(rx) * (dot + 0.5f * sxs) + sxmy + to_f32(mx) * sx);
}

// Grid (ceil(M / (kWarps·kCols)), ceil(T / RT)); block kWarps warps. Out-of-range columns and
// rows are clamped for loading (always in bounds) and never written.
template <typename T, int RT, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
mm8_rows_kernel(const int64_t rows, const int64_t N, const int64_t M, const T* __restrict__ x,
                const int64_t ldx, const uint8_t* __restrict__ w, const T* __restrict__ mx,
                const T* __restrict__ rx, const T* __restrict__ my, const T* __restrict__ ry,
                T* __restrict__ y, const int64_t ldy) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kCols;
  if (m0 >= M) return;  // whole warps only: the shuffles below need all 32 lanes
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * RT;

  const uint8_t* col[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) col[c] = w + (m0 + c < M ? m0 + c : M - 1) * N;
  const T* xr[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) xr[r] = x + (t0 + r < rows ? t0 + r : rows - 1) * ldx;

  float acc[RT][kCols];
  float sxs[RT], sx[RT], sxmy[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    sxs[r] = sx[r] = sxmy[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.f;
  }

  if (kVec) {
    const int64_t chunks = N / 16;
#pragma unroll 2
    for (int64_t ch = lane; ch < chunks; ch += 32) {
      const int64_t n0 = ch * 16;
      uint4 wv[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) wv[c] = *reinterpret_cast<const uint4*>(col[c] + n0);
      float ryv[16], myv[16];
      load16(ry + n0, ryv);
      load16(my + n0, myv);
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        float xv[16];
        load16(xr[r] + n0, xv);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const float xs = xv[e] * ryv[e];
          sxs[r] += xs;
          sx[r] += xv[e];
          sxmy[r] += xv[e] * myv[e];
          xv[e] = xs;
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const uint32_t words[4] = {wv[c].x, wv[c].y, wv[c].z, wv[c].w};
#pragma unroll
          for (int e = 0; e < 16; ++e) acc[r][c] += xv[e] * byte_to_f32(words[e / 4], e % 4);
        }
      }
    }
  } else {
    for (int64_t n = lane; n < N; n += 32) {
      const float ryn = to_f32(ry[n]);
      const float myn = to_f32(my[n]);
      float wn[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) wn[c] = static_cast<float>(col[c][n]);
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const float xf = to_f32(xr[r][n]);
        const float xs = xf * ryn;
        sxs[r] += xs;
        sx[r] += xf;
        sxmy[r] += xf * myn;
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] += xs * wn[c];
      }
    }
  }

#pragma unroll
  for (int r = 0; r < RT; ++r) {
    sxs[r] = warp_sum(sxs[r]);
    sx[r] = warp_sum(sx[r]);
    sxmy[r] = warp_sum(sxmy[r]);
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = warp_sum(acc[r][c]);
  }
  // Every lane holds the totals; lane r·kCols + c writes output (r, c).
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int64_t t = t0 + r, m = m0 + c;
      if (lane == (r * kCols + c) % 32 && t < rows && m < M)
        y[t * ldy + m] = finish(acc[r][c], sxs[r], sxmy[r], sx[r], rx[m], mx[m]);
    }
  }
}

constexpr int kBM = 64;  // rows of x per tile
constexpr int kBN = 64;  // columns of w per tile
constexpr int kBK = 32;  // inner (N) depth per step; one warp lane per k

// Grid (ceil(M / kBN), ceil(T / kBM)); 256 threads, thread (ty, tx) computes a 4 x 4 block of
// outputs. Warp `warp` loads rows warp + 8e of the x tile and columns warp + 8e of the w tile,
// lanes along n (coalesced), and keeps the three row sums for its rows; out-of-range elements
// load as zero, so they add nothing to any sum.
template <typename T>
__global__ void __launch_bounds__(256)
mm8_tiled_kernel(const int64_t rows, const int64_t N, const int64_t M, const T* __restrict__ x,
                 const int64_t ldx, const uint8_t* __restrict__ w, const T* __restrict__ mx,
                 const T* __restrict__ rx, const T* __restrict__ my, const T* __restrict__ ry,
                 T* __restrict__ y, const int64_t ldy) {
  __shared__ __align__(16) float xs_s[kBK][kBM + 4];
  __shared__ __align__(16) float w_s[kBK][kBN + 4];
  __shared__ float red_s[3][kBM];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBN;

  float acc[4][4] = {};
  float psxs[8] = {}, psx[8] = {}, psxmy[8] = {};
  for (int64_t k0 = 0; k0 < N; k0 += kBK) {
    const int64_t n = k0 + lane;
    const bool nv = n < N;
    const float ryn = nv ? to_f32(ry[n]) : 0.f;
    const float myn = nv ? to_f32(my[n]) : 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int r = warp + 8 * e;
      const int64_t t = t0 + r;
      const float xf = (nv && t < rows) ? to_f32(x[t * ldx + n]) : 0.f;
      const float xs = xf * ryn;
      psxs[e] += xs;
      psx[e] += xf;
      psxmy[e] += xf * myn;
      xs_s[lane][r] = xs;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int c = warp + 8 * e;
      const int64_t m = m0 + c;
      w_s[lane][c] = (nv && m < M) ? static_cast<float>(w[m * N + n]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&xs_s[kk][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&w_s[kk][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w};
      const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float a = warp_sum(psxs[e]);
    const float b = warp_sum(psx[e]);
    const float c = warp_sum(psxmy[e]);
    if (lane == 0) {
      red_s[0][warp + 8 * e] = a;
      red_s[1][warp + 8 * e] = b;
      red_s[2][warp + 8 * e] = c;
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty * 4 + i;
    const int64_t t = t0 + r;
    if (t >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + tx * 4 + j;
      if (m < M)
        y[t * ldy + m] = finish(acc[i][j], red_s[0][r], red_s[2][r], red_s[1][r], rx[m], mx[m]);
    }
  }
}

template <typename T, int RT>
void launch_rows(int64_t rows, int64_t N, int64_t M, const T* x, int64_t ldx, const uint8_t* w,
                 const T* mx, const T* rx, const T* my, const T* ry, T* y, int64_t ldy, bool vec,
                 cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((M + kWarps * kCols - 1) / (kWarps * kCols)),
                  static_cast<unsigned>((rows + RT - 1) / RT));
  if (vec)
    mm8_rows_kernel<T, RT, true>
        <<<grid, kWarps * 32, 0, stream>>>(rows, N, M, x, ldx, w, mx, rx, my, ry, y, ldy);
  else
    mm8_rows_kernel<T, RT, false>
        <<<grid, kWarps * 32, 0, stream>>>(rows, N, M, x, ldx, w, mx, rx, my, ry, y, ldy);
}

template <typename T>
void launch(int64_t rows, int64_t N, int64_t M, const void* x, int64_t ldx, const uint8_t* w,
            const void* mx, const void* rx, const void* my, const void* ry, void* y, int64_t ldy,
            bool vec, cudaStream_t stream) {
  const T* X = static_cast<const T*>(x);
  const T* MX = static_cast<const T*>(mx);
  const T* RX = static_cast<const T*>(rx);
  const T* MY = static_cast<const T*>(my);
  const T* RY = static_cast<const T*>(ry);
  T* Y = static_cast<T*>(y);
  if (rows > 16) {
    const dim3 grid(static_cast<unsigned>((M + kBN - 1) / kBN),
                    static_cast<unsigned>((rows + kBM - 1) / kBM));
    mm8_tiled_kernel<T><<<grid, 256, 0, stream>>>(rows, N, M, X, ldx, w, MX, RX, MY, RY, Y, ldy);
  } else if (rows == 1) {
    launch_rows<T, 1>(rows, N, M, X, ldx, w, MX, RX, MY, RY, Y, ldy, vec, stream);
  } else if (rows <= 4) {
    launch_rows<T, 4>(rows, N, M, X, ldx, w, MX, RX, MY, RY, Y, ldy, vec, stream);
  } else {
    launch_rows<T, 8>(rows, N, M, X, ldx, w, MX, RX, MY, RY, Y, ldy, vec, stream);
  }
}

}  // namespace

namespace rwkv {
namespace cuda {

void mm8_forward(Act act, int64_t T, int64_t N, int64_t M, const void* x, int64_t ldx,
                 const uint8_t* w, const void* mx, const void* rx, const void* my, const void* ry,
                 void* y, int64_t ldy, bool vec, cudaStream_t stream) {
  if (T == 0 || M == 0) return;
  switch (act) {
    case Act::f32:
      launch<float>(T, N, M, x, ldx, w, mx, rx, my, ry, y, ldy, vec, stream);
      break;
    case Act::f16:
      launch<__half>(T, N, M, x, ldx, w, mx, rx, my, ry, y, ldy, vec, stream);
      break;
    case Act::bf16:
      launch<__nv_bfloat16>(T, N, M, x, ldx, w, mx, rx, my, ry, y, ldy, vec, stream);
      break;
  }
}

}  // namespace cuda
}  // namespace rwkv
