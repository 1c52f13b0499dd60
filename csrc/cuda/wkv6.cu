// RWKV-6 WKV (decay factor per token, w [T, H*N]); the kernel is shared with wkv5, see wkv56.cuh.
#include "kernels.h"
#include "wkv56.cuh"

namespace rwkv {
namespace cuda {

void wkv6_forward(int64_t T, int64_t H, int64_t N, float* state, const float* r, const float* k,
                  const float* v, const float* w, const float* u, float* y, cudaStream_t stream) {
  launch_wkv56<true>(T, H, N, state, r, k, v, w, u, y, stream);
}

}  // namespace cuda
}  // namespace rwkv
