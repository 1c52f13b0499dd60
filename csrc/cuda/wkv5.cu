// RWKV-5.x WKV (constant per-channel decay w [H, N]); the kernel is shared with wkv6, see wkv56.cuh.
#include "kernels.h"
#include "wkv56.cuh"

namespace rwkv {
namespace cuda {

void wkv5_forward(int64_t T, int64_t H, int64_t N, float* state, const float* r, const float* k,
                  const float* v, const float* w, const float* u, float* y, cudaStream_t stream) {
  launch_wkv56<false>(T, H, N, state, r, k, v, w, u, y, stream);
}

}  // namespace cuda
}  // namespace rwkv
