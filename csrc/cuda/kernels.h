// Host-side entry points of the CUDA kernels: raw pointers, sizes and a stream, no torch types.
// Implemented in the torch-free csrc/cuda/*.cu files and called by the torch glue in
// csrc/cuda/*_op.cpp, which validates every argument before calling (these functions trust
// their inputs: contiguous, on the current device, sizes already checked).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace rwkv {
namespace cuda {

// Largest head size N of the wkv5/6/7 kernels. Any N in [1, 256] runs: the kernels are compiled
// for N = 16, 32, 64, 128, 256 and mask the channels beyond N (RWKV_HEAD_SIZE_SWITCH).
constexpr int64_t kWkvMaxHeadSize = 256;

// wkv4: w, u [C]; k, v, y [T, C]; aa, bb, pp [C] updated in place. All fp32.
void wkv4_forward(int64_t T, int64_t C, const float* w, const float* u, const float* k,
                  const float* v, float* y, float* aa, float* bb, float* pp, cudaStream_t stream);

// wkv5: state [H, N, N] ([head, key, value]) in place; r, k, v, y [T, H*N]; w, u [H, N]. fp32.
void wkv5_forward(int64_t T, int64_t H, int64_t N, float* state, const float* r, const float* k,
                  const float* v, const float* w, const float* u, float* y, cudaStream_t stream);

// wkv6: as wkv5 but w [T, H*N] (a decay factor per token).
void wkv6_forward(int64_t T, int64_t H, int64_t N, float* state, const float* r, const float* k,
                  const float* v, const float* w, const float* u, float* y, cudaStream_t stream);

// wkv7: state [H, N, N] ([head, value, key]) in place; r, w, k, v, a, b, y [T, H*N]. fp32.
void wkv7_forward(int64_t T, int64_t H, int64_t N, float* state, const float* r, const float* w,
                  const float* k, const float* v, const float* a, const float* b, float* y,
                  cudaStream_t stream);

// Activation dtype of mm8 (x, mx, rx, my, ry and y share it).
enum class Act { f32, f16, bf16 };

// mm8: y [T, M] (row stride ldy) = x [T, N] (row stride ldx) times the int8 matrix w [N, M]
// stored column-major (column m = N contiguous bytes at w + m * N); mx, rx [M]; my, ry [N].
// `vec` selects 16-byte loads: the caller guarantees N % 16 == 0, ldx % 16 == 0 and 16-byte
// aligned x, w, my, ry. Deterministic: every output is reduced in a fixed order.
void mm8_forward(Act act, int64_t T, int64_t N, int64_t M, const void* x, int64_t ldx,
                 const uint8_t* w, const void* mx, const void* rx, const void* my, const void* ry,
                 void* y, int64_t ldy, bool vec, cudaStream_t stream);

// ln_mix (blocks.cu): x [T, C] and sx [C] of type `act`; w, b [C] and mix [n, C] fp32; writes
// xx [T, C] and out [n, T, C] of type `act` (the layer norm of x and its n token-shift mixes).
void ln_mix_forward(Act act, int64_t T, int64_t C, int64_t n, const void* x, const void* sx,
                    const float* w, const float* b, const float* mix, bool lerp, float eps,
                    void* xx, void* out, cudaStream_t stream);

// wkv7_block (blocks.cu): state [H, N, N] fp32 in place; r, w, k, v, a, g, y [T, H*N] of type
// `act`; v_first and v_gate likewise, or both null (first layer); p [8, H*N] fp32; tmp: fp32
// scratch of wkv7_block_tmp_floats(T, H, N) values.
void wkv7_block_forward(Act act, int64_t T, int64_t H, int64_t N, float* state, const void* r,
                        const void* w, const void* k, const void* v, const void* a,
                        const void* g, const void* v_first, const void* v_gate, const float* p,
                        float eps, float* tmp, void* y, cudaStream_t stream);
constexpr int64_t wkv7_block_tmp_floats(int64_t T, int64_t H, int64_t N) { return 7 * T * H * N; }

// linear_one: y [M] = x [N] @ w [N, M], all bf16, w column-major (column m at w + m * N), fp32
// accumulation. `vec`: N % 8 == 0 and 16-byte aligned x and w (16-byte loads).
void linear_one_bf16(int64_t N, int64_t M, const void* x, const void* w, void* y, bool vec,
                     cudaStream_t stream);

}  // namespace cuda
}  // namespace rwkv
