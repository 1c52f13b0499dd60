// RWKV-4 WKV recurrence, numerically stable form (upstream's aa/bb/pp), one thread per channel c:
//   ww = u + k_t; p = max(pp, ww); y_t = (e^(pp-p)·aa + e^(ww-p)·v_t) / (e^(pp-p)·bb + e^(ww-p))
//   ww = w + pp;  p = max(ww, k_t); aa = e^(ww-p)·aa + e^(k_t-p)·v_t; bb = e^(ww-p)·bb + e^(k_t-p); pp = p
// w = -exp(time_decay), u [C]; k, v, y [T, C]; aa, bb, pp [C], read once, kept in registers over
// all T steps and written back (in place). Everything fp32. Channels are independent, so there is
// no synchronisation; consecutive threads read consecutive channels (coalesced).
#include "common.cuh"
#include "kernels.h"

namespace {

__global__ void __launch_bounds__(128)
wkv4_kernel(const int64_t T, const int64_t C, const float* __restrict__ w,
            const float* __restrict__ u, const float* __restrict__ k,
            const float* __restrict__ v, float* __restrict__ y, float* __restrict__ aa,
            float* __restrict__ bb, float* __restrict__ pp) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float wc = w[c];
  const float uc = u[c];
  float a = aa[c];
  float b = bb[c];
  float p = pp[c];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t i = t * C + c;
    const float kt = k[i];
    const float vt = v[i];
    float ww = uc + kt;
    float q = fmaxf(p, ww);
    float e1 = __expf(p - q);
    float e2 = __expf(ww - q);
    y[i] = (e1 * a + e2 * vt) / (e1 * b + e2);
    ww = wc + p;
    q = fmaxf(ww, kt);
    e1 = __expf(ww - q);
    e2 = __expf(kt - q);
    a = e1 * a + e2 * vt;
    b = e1 * b + e2;
    p = q;
  }
  aa[c] = a;
  bb[c] = b;
  pp[c] = p;
}

}  // namespace

namespace rwkv {
namespace cuda {

void wkv4_forward(int64_t T, int64_t C, const float* w, const float* u, const float* k,
                  const float* v, float* y, float* aa, float* bb, float* pp, cudaStream_t stream) {
  if (C == 0) return;
  constexpr int kThreads = 128;
  const unsigned blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  wkv4_kernel<<<blocks, kThreads, 0, stream>>>(T, C, w, u, k, v, y, aa, bb, pp);
}

}  // namespace cuda
}  // namespace rwkv
