// RWKV-7 WKV recurrence, per head h and step t (i: value channel, j: key channel):
//   sa[i] = Σ_j a[t,h,j]·S[h,i,j]                     (old state)
//   S[h,i,j] <- S[h,i,j]·w[t,h,j] + sa[i]·b[t,h,j] + v[t,h,i]·k[t,h,j]
//   y[t,h,i] = Σ_j S[h,i,j]·r[t,h,j]                  (new state)
// state S [H, N, N] fp32, layout [head, value i, key j], in place; r, w, k, v, a, b, y [T, H*N]
// fp32, w the decay factor in (0, 1). Compiled for a bucket NB >= N; channels N..NB-1 read as
// zero, so they add nothing and stay zero. Grid (H, ceil(N / JB)): a block owns JB value rows i; thread
// (i, g) keeps key columns j = g + G·q (q < P) of row i in registers for all T steps. Both sums
// over j are reduced over the G consecutive lanes of a row with a fixed-order xor butterfly
// (deterministic). r, w, k, a, b of a step are staged in shared memory; the next step's values are
// prefetched into registers while the current step computes.
#include "common.cuh"
#include "dispatch.cuh"
#include "kernels.h"

namespace {

template <int NB>
__global__ void __launch_bounds__(rwkv::cuda::WkvSplit<NB>::kThreads)
wkv7_kernel(const int64_t T, const int64_t H, const int n, float* __restrict__ state,
            const float* __restrict__ r, const float* __restrict__ w,
            const float* __restrict__ k, const float* __restrict__ v,
            const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y) {
  using Split = rwkv::cuda::WkvSplit<NB>;
  constexpr int G = Split::G, P = Split::P, JB = Split::JB;
  __shared__ float r_s[NB];
  __shared__ float w_s[NB];
  __shared__ float k_s[NB];
  __shared__ float a_s[NB];
  __shared__ float b_s[NB];

  const int tid = threadIdx.x;
  const int i = blockIdx.y * JB + tid / G;
  const int g = tid % G;
  const bool i_ok = i < n;
  const int64_t h = blockIdx.x;
  const int64_t N = n;
  const int64_t C = H * N;
  float* S = state + h * N * N + static_cast<int64_t>(i_ok ? i : 0) * N;

  float s[P];
#pragma unroll
  for (int q = 0; q < P; ++q) s[q] = (i_ok && g + G * q < n) ? S[g + G * q] : 0.f;

  // Threads tid < n stage channel tid every step; channels n..NB-1 are zeroed once.
  const bool loader = tid < n;
  if (!loader && tid < NB) r_s[tid] = w_s[tid] = k_s[tid] = a_s[tid] = b_s[tid] = 0.f;
  float r_n = 0.f, w_n = 0.f, k_n = 0.f, a_n = 0.f, b_n = 0.f, v_n = 0.f;
  auto prefetch = [&](const int64_t off) {
    if (loader) {
      r_n = r[off + tid];
      w_n = w[off + tid];
      k_n = k[off + tid];
      a_n = a[off + tid];
      b_n = b[off + tid];
    }
    if (i_ok) v_n = v[off + i];
  };
  if (T > 0) prefetch(h * N);

  for (int64_t t = 0; t < T; ++t) {
    const int64_t off = t * C + h * N;
    __syncthreads();  // every thread is done reading the previous step's shared values
    if (loader) {
      r_s[tid] = r_n;
      w_s[tid] = w_n;
      k_s[tid] = k_n;
      a_s[tid] = a_n;
      b_s[tid] = b_n;
    }
    __syncthreads();
    const float vi = v_n;
    if (t + 1 < T) prefetch(off + C);
    float sa = 0.f;
#pragma unroll
    for (int q = 0; q < P; ++q) sa += a_s[g + G * q] * s[q];
    sa = rwkv::cuda::group_sum<G>(sa);
    float acc = 0.f;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int j = g + G * q;
      s[q] = s[q] * w_s[j] + sa * b_s[j] + vi * k_s[j];
      acc += s[q] * r_s[j];
    }
    acc = rwkv::cuda::group_sum<G>(acc);
    if (g == 0 && i_ok) y[off + i] = acc;
  }

#pragma unroll
  for (int q = 0; q < P; ++q) {
    if (i_ok && g + G * q < n) S[g + G * q] = s[q];
  }
}

}  // namespace

namespace rwkv {
namespace cuda {

void wkv7_forward(int64_t T, int64_t H, int64_t N, float* state, const float* r, const float* w,
                  const float* k, const float* v, const float* a, const float* b, float* y,
                  cudaStream_t stream) {
  if (H == 0 || N == 0) return;
  RWKV_HEAD_SIZE_SWITCH(N, kNB, {
    using Split = WkvSplit<kNB>;
    const dim3 grid(static_cast<unsigned>(H),
                    static_cast<unsigned>((N + Split::JB - 1) / Split::JB));
    wkv7_kernel<kNB><<<grid, Split::kThreads, 0, stream>>>(T, H, static_cast<int>(N), state, r, w,
                                                           k, v, a, b, y);
  });
}

}  // namespace cuda
}  // namespace rwkv
