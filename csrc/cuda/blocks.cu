// The fused per-layer ops of the one-token decode path on CUDA: ln_mix and wkv7_block
// (docs/kernels.md has their math). Decoding one token is a sequence of small launches; upstream
// and the torch-op path spend ~35 of them on RWKV-7's time mix around the recurrence and 5-6 on
// each layer norm with its token-shift mixes. Here each is one to three launches.
//
// Activations (x, sx; r, w, k, v, a, g, v_first, v_gate; the results) are fp32, fp16 or bf16
// (template A); parameters (layer norm weights, mixes, the 8 rows of p) are fp32. Everything is
// computed in fp32 and each result is rounded to A once. Reductions go through block_sum: warp
// butterflies, then the warp totals added in warp order, so results are deterministic.
#include "common.cuh"
#include "kernels.h"

namespace {

using rwkv::cuda::from_f32;
using rwkv::cuda::to_f32;

constexpr int kMaxWarps = 32;

__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds kMaxWarps floats; the leading barrier lets a caller reuse it right away.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = rwkv::cuda::warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < warps; ++i) total += scratch[i];
  return total;
}

// ------------------------------------------------------------------------------------ ln_mix
// Grid (chunks, rows): block (j, t) writes channels [j*span, (j+1)*span) of row t (a grid-stride
// loop over rows); each thread owns channels c = c0 + tid + q*blockDim. Every block computes its
// row's statistics over all C channels itself, in the same order, so the chunking never changes a
// result: one token's layer norm is spread over C/blockDim blocks instead of one (one block would
// serialise a 7B token's whole layer norm on one SM). prev[t] is sx for t = 0, else the previous
// row's layer norm in fp32 (recomputed here: the CPU kernel uses the same fp32 values).

template <typename A>
__device__ void row_stats(const A* __restrict__ xt, int64_t C, float eps, float* scratch,
                          float* mean, float* rstd) {
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f32(xt[c]);
  const float m = block_sum(s, scratch) / static_cast<float>(C);
  float q = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = to_f32(xt[c]) - m;
    q += d * d;
  }
  const float var = block_sum(q, scratch) / static_cast<float>(C);
  *mean = m;
  *rstd = 1.f / sqrtf(var + eps);
}

template <typename A>
__global__ void ln_mix_kernel(int64_t T, int64_t C, int64_t n, const A* __restrict__ x,
                              const A* __restrict__ sx, const float* __restrict__ w,
                              const float* __restrict__ b, const float* __restrict__ mix,
                              bool lerp, float eps, A* __restrict__ xx, A* __restrict__ out) {
  __shared__ float scratch[kMaxWarps];
  const int64_t span = (C + gridDim.x - 1) / gridDim.x;
  const int64_t c0 = blockIdx.x * span, c1 = c0 + span < C ? c0 + span : C;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const A* xt = x + t * C;
    float mean, rstd, pmean = 0.f, prstd = 0.f;
    row_stats(xt, C, eps, scratch, &mean, &rstd);
    if (t > 0) row_stats(xt - C, C, eps, scratch, &pmean, &prstd);
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
      const float cur = (to_f32(xt[c]) - mean) * rstd * w[c] + b[c];
      const float prev =
          t > 0 ? (to_f32(xt[c - C]) - pmean) * prstd * w[c] + b[c] : to_f32(sx[c]);
      xx[t * C + c] = from_f32<A>(cur);
      for (int64_t i = 0; i < n; ++i) {
        const float m = mix[i * C + c];
        const float y = lerp ? cur * m + prev * (1.f - m) : cur + (prev - cur) * m;
        out[(i * T + t) * C + c] = from_f32<A>(y);
      }
    }
  }
}

// -------------------------------------------------------------------------------- wkv7_block
// Three launches: prepare (per token and head) writes the recurrence's fp32 inputs into tmp,
// wkv7_forward (wkv7.cu) runs the recurrence into o, finish (per token and head) applies the
// group norm, the bonus term and the gate. Blocks of 32-256 threads, thread i = channel i of the
// head; threads i >= N only join the reductions.

// The recurrence's inputs, planes of tmp [6, T, C]: r, decay w', k', v', a = -kk, b = kk * a'.
enum Plane { kR, kW, kK, kV, kA, kB, kPlanes };

constexpr float kNegDecayScale = -0.6065306597126334f;  // -exp(-0.5)

template <typename A>
__global__ void wkv7_prepare_kernel(int64_t T, int64_t H, int n, const A* __restrict__ r,
                                    const A* __restrict__ w, const A* __restrict__ k,
                                    const A* __restrict__ v, const A* __restrict__ a,
                                    const A* __restrict__ v_first, const A* __restrict__ v_gate,
                                    const float* __restrict__ p, float* __restrict__ tmp) {
  __shared__ float scratch[kMaxWarps];
  const int64_t C = H * n, plane = T * C;
  const int i = threadIdx.x;
  const bool ok = i < n;
  const int64_t c = blockIdx.x * static_cast<int64_t>(n) + (ok ? i : 0);
  const float* w0 = p;
  const float* a0 = p + C;
  const float* v0 = p + 2 * C;
  const float* k_k = p + 3 * C;
  const float* k_a = p + 4 * C;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int64_t o = t * C + c;
    const float kt = ok ? to_f32(k[o]) : 0.f;
    const float kn = kt * k_k[c];
    const float norm = sqrtf(block_sum(kn * kn, scratch));
    if (!ok) continue;  // after the reduction: every thread joined it
    const float kk = kn / fmaxf(norm, 1e-12f);  // F.normalize's eps
    const float at = sigmoid_f(a0[c] + to_f32(a[o]));
    float vt = to_f32(v[o]);
    if (v_first != nullptr) vt += (to_f32(v_first[o]) - vt) * sigmoid_f(v0[c] + to_f32(v_gate[o]));
    tmp[kR * plane + o] = to_f32(r[o]);
    tmp[kW * plane + o] = expf(kNegDecayScale * sigmoid_f(w0[c] + to_f32(w[o])));
    tmp[kK * plane + o] = kt * (1.f + (at - 1.f) * k_a[c]);
    tmp[kV * plane + o] = vt;
    tmp[kA * plane + o] = -kk;
    tmp[kB * plane + o] = kk * at;
  }
}

template <typename A>
__global__ void wkv7_finish_kernel(int64_t T, int64_t H, int n, const float* __restrict__ tmp,
                                   const float* __restrict__ o, const A* __restrict__ g,
                                   const float* __restrict__ p, float eps, A* __restrict__ y) {
  __shared__ float scratch[kMaxWarps];
  const int64_t C = H * n, plane = T * C;
  const int i = threadIdx.x;
  const bool ok = i < n;
  const int64_t c = blockIdx.x * static_cast<int64_t>(n) + (ok ? i : 0);
  const float* r_k = p + 5 * C;
  const float* lx_w = p + 6 * C;
  const float* lx_b = p + 7 * C;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int64_t at = t * C + c;
    const float ot = ok ? o[at] : 0.f;
    const float mean = block_sum(ot, scratch) / static_cast<float>(n);
    const float d = ok ? ot - mean : 0.f;
    const float var = block_sum(d * d, scratch) / static_cast<float>(n);
    const float rk = ok ? tmp[kR * plane + at] * tmp[kK * plane + at] * r_k[c] : 0.f;
    const float bonus = block_sum(rk, scratch);
    if (!ok) continue;
    const float yn = d / sqrtf(var + eps) * lx_w[c] + lx_b[c];
    y[at] = from_f32<A>((yn + bonus * tmp[kV * plane + at]) * to_f32(g[at]));
  }
}

constexpr unsigned kMaxGridY = 65535;

unsigned grid_rows(int64_t T) { return static_cast<unsigned>(T < kMaxGridY ? T : kMaxGridY); }

template <typename A>
void ln_mix_launch(int64_t T, int64_t C, int64_t n, const void* x, const void* sx,
                   const float* w, const float* b, const float* mix, bool lerp, float eps,
                   void* xx, void* out, cudaStream_t stream) {
  if (T <= 0 || C <= 0) return;
  const unsigned threads = C >= 1024 ? 256 : (C >= 256 ? 128 : 32);
  // Channel chunks: one per blockDim channels while there are few rows (decode), so that a launch
  // has about kWantBlocks blocks; one chunk per row once the rows alone give that many.
  constexpr int64_t kWantBlocks = 256;
  const int64_t by_rows = (kWantBlocks + T - 1) / T, by_channels = (C + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(by_rows < by_channels ? by_rows : by_channels), grid_rows(T));
  ln_mix_kernel<A><<<grid, threads, 0, stream>>>(
      T, C, n, static_cast<const A*>(x), static_cast<const A*>(sx), w, b, mix, lerp, eps,
      static_cast<A*>(xx), static_cast<A*>(out));
}

template <typename A>
void wkv7_block_launch(int64_t T, int64_t H, int64_t N, float* state, const void* r,
                       const void* w, const void* k, const void* v, const void* a, const void* g,
                       const void* v_first, const void* v_gate, const float* p, float eps,
                       float* tmp, void* y, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(H), grid_rows(T));
  const unsigned threads = static_cast<unsigned>((N + 31) / 32 * 32);
  const int n = static_cast<int>(N);
  const A* vf = static_cast<const A*>(v_first);
  const A* vg = static_cast<const A*>(v_gate);
  wkv7_prepare_kernel<A><<<grid, threads, 0, stream>>>(
      T, H, n, static_cast<const A*>(r), static_cast<const A*>(w), static_cast<const A*>(k),
      static_cast<const A*>(v), static_cast<const A*>(a), vf, vg, p, tmp);
  const int64_t plane = T * H * N;
  float* o = tmp + kPlanes * plane;
  rwkv::cuda::wkv7_forward(T, H, N, state, tmp + kR * plane, tmp + kW * plane, tmp + kK * plane,
                           tmp + kV * plane, tmp + kA * plane, tmp + kB * plane, o, stream);
  wkv7_finish_kernel<A><<<grid, threads, 0, stream>>>(T, H, n, tmp, o,
                                                      static_cast<const A*>(g), p, eps,
                                                      static_cast<A*>(y));
}

}  // namespace

namespace rwkv {
namespace cuda {

void ln_mix_forward(Act act, int64_t T, int64_t C, int64_t n, const void* x, const void* sx,
                    const float* w, const float* b, const float* mix, bool lerp, float eps,
                    void* xx, void* out, cudaStream_t stream) {
  if (T == 0 || C == 0) return;
  switch (act) {
    case Act::f32:
      return ln_mix_launch<float>(T, C, n, x, sx, w, b, mix, lerp, eps, xx, out, stream);
    case Act::f16:
      return ln_mix_launch<__half>(T, C, n, x, sx, w, b, mix, lerp, eps, xx, out, stream);
    case Act::bf16:
      return ln_mix_launch<__nv_bfloat16>(T, C, n, x, sx, w, b, mix, lerp, eps, xx, out, stream);
  }
}

void wkv7_block_forward(Act act, int64_t T, int64_t H, int64_t N, float* state, const void* r,
                        const void* w, const void* k, const void* v, const void* a,
                        const void* g, const void* v_first, const void* v_gate, const float* p,
                        float eps, float* tmp, void* y, cudaStream_t stream) {
  if (T == 0 || H == 0 || N == 0) return;
  switch (act) {
    case Act::f32:
      return wkv7_block_launch<float>(T, H, N, state, r, w, k, v, a, g, v_first, v_gate, p, eps,
                                      tmp, y, stream);
    case Act::f16:
      return wkv7_block_launch<__half>(T, H, N, state, r, w, k, v, a, g, v_first, v_gate, p, eps,
                                       tmp, y, stream);
    case Act::bf16:
      return wkv7_block_launch<__nv_bfloat16>(T, H, N, state, r, w, k, v, a, g, v_first, v_gate,
                                              p, eps, tmp, y, stream);
  }
}

}  // namespace cuda
}  // namespace rwkv
