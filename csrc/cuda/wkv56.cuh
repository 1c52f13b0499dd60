// RWKV-5.x / RWKV-6 WKV recurrence (shared by wkv5.cu and wkv6.cu), per head h and step t:
//   y[t,h,j]  = Σ_i r[t,h,i]·(u[h,i]·k[t,h,i]·v[t,h,j] + S[h,i,j])
//   S[h,i,j] <- w[h,i]·S[h,i,j] + k[t,h,i]·v[t,h,j]          (wkv6: w[t,h,i], a factor per token)
// state S [H, N, N] fp32, layout [head, key i, value j] (the classic Python layout), in place;
// r, k, v, y [T, H*N]; u [H, N]; w [H, N] (wkv5) or [T, H*N] (wkv6). All fp32.
// Compiled for a bucket NB >= N; channels N..NB-1 read as zero, so they add nothing and stay zero.
// Grid (H, ceil(N / JB)): a block owns JB value columns j of one head; thread (j, g) keeps key
// rows i = g + G·q (q < P) of column j in registers for all T steps (G, P, JB: WkvSplit). The G
// threads of a column sit in consecutive lanes and add their partial y with a fixed-order xor
// butterfly (deterministic). Each step's r, k (and w) are staged in shared memory; the next
// step's values are prefetched into registers while the current step computes.
#pragma once

#include "common.cuh"
#include "dispatch.cuh"

namespace {

template <int NB, bool kPerTokenW>
__global__ void __launch_bounds__(rwkv::cuda::WkvSplit<NB>::kThreads)
wkv56_kernel(const int64_t T, const int64_t H, const int n, float* __restrict__ state,
             const float* __restrict__ r, const float* __restrict__ k,
             const float* __restrict__ v, const float* __restrict__ w,
             const float* __restrict__ u, float* __restrict__ y) {
  using Split = rwkv::cuda::WkvSplit<NB>;
  constexpr int G = Split::G, P = Split::P, JB = Split::JB;
  __shared__ float r_s[NB];
  __shared__ float k_s[NB];
  __shared__ float w_s[NB];
  __shared__ float u_s[NB];

  const int tid = threadIdx.x;
  const int j = blockIdx.y * JB + tid / G;
  const int g = tid % G;
  const bool j_ok = j < n;
  const int64_t h = blockIdx.x;
  const int64_t N = n;
  const int64_t C = H * N;
  float* S = state + h * N * N;

  float s[P];
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int i = g + G * q;
    s[q] = (j_ok && i < n) ? S[i * N + j] : 0.f;
  }

  // Threads tid < n stage channel tid: u (and wkv5's constant w) once, r, k (w) every step.
  // Channels n..NB-1 are zeroed once and never written again.
  const bool loader = tid < n;
  if (loader) {
    u_s[tid] = u[h * N + tid];
    if (!kPerTokenW) w_s[tid] = w[h * N + tid];
  } else if (tid < NB) {
    r_s[tid] = k_s[tid] = w_s[tid] = u_s[tid] = 0.f;
  }
  float r_n = 0.f, k_n = 0.f, w_n = 0.f, v_n = 0.f;
  auto prefetch = [&](const int64_t off) {
    if (loader) {
      r_n = r[off + tid];
      k_n = k[off + tid];
      if (kPerTokenW) w_n = w[off + tid];
    }
    if (j_ok) v_n = v[off + j];
  };
  if (T > 0) prefetch(h * N);

  for (int64_t t = 0; t < T; ++t) {
    const int64_t off = t * C + h * N;
    __syncthreads();  // every thread is done reading the previous step's shared values
    if (loader) {
      r_s[tid] = r_n;
      k_s[tid] = k_n;
      if (kPerTokenW) w_s[tid] = w_n;
    }
    __syncthreads();
    const float vj = v_n;
    if (t + 1 < T) prefetch(off + C);
    float acc = 0.f;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int i = g + G * q;
      const float kv = k_s[i] * vj;
      acc += r_s[i] * (u_s[i] * kv + s[q]);
      s[q] = s[q] * w_s[i] + kv;
    }
    acc = rwkv::cuda::group_sum<G>(acc);
    if (g == 0 && j_ok) y[off + j] = acc;
  }

#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int i = g + G * q;
    if (j_ok && i < n) S[i * N + j] = s[q];
  }
}

// Host launcher for any head size 1 <= n <= 256 (bucketed by RWKV_HEAD_SIZE_SWITCH).
template <bool kPerTokenW>
void launch_wkv56(int64_t T, int64_t H, int64_t n, float* state, const float* r, const float* k,
                  const float* v, const float* w, const float* u, float* y, cudaStream_t stream) {
  if (H == 0 || n == 0) return;
  RWKV_HEAD_SIZE_SWITCH(n, kNB, {
    using Split = rwkv::cuda::WkvSplit<kNB>;
    const dim3 grid(static_cast<unsigned>(H),
                    static_cast<unsigned>((n + Split::JB - 1) / Split::JB));
    wkv56_kernel<kNB, kPerTokenW><<<grid, Split::kThreads, 0, stream>>>(
        T, H, static_cast<int>(n), state, r, k, v, w, u, y);
  });
}

}  // namespace
