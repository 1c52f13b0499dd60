// A small CPU emulation of the CUDA execution model, just enough to run the kernels of
// csrc/cuda/*.cu on a machine without a GPU (tests/cuda/test_cuda_emulated.py). Each block runs
// with one OS thread per CUDA thread; blocks run one after another, so `__shared__` can be a
// function-local static. __syncthreads is a block-wide barrier, __shfl_xor_sync a warp-wide
// exchange through a buffer between two warp barriers. The test rewrites `k<<<g, b, s, st>>>(...)`
// into `rwkv_emu::launch(k, g, b, s, st, ...)`. Only for testing index math, masks and reductions:
// timing, memory model and fast-math rounding are not emulated.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace rwkv_emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const unsigned gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  unsigned gen_ = 0;
};

struct BlockState {
  std::unique_ptr<Barrier> block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<float> shfl;  // one slot per thread
};

inline thread_local uint3 t_thread;
inline thread_local uint3 t_block;
inline dim3 g_block_dim;
inline dim3 g_grid_dim;
inline BlockState* g_state = nullptr;

inline unsigned linear_tid() {
  return t_thread.x + g_block_dim.x * (t_thread.y + g_block_dim.y * t_thread.z);
}

inline void syncthreads() { g_state->block->wait(); }

inline float shfl_xor(float v, int off, int width) {
  const unsigned tid = linear_tid();
  const unsigned lane = tid % 32, base = tid - lane;
  Barrier& warp = *g_state->warps[tid / 32];
  g_state->shfl[tid] = v;
  warp.wait();
  const unsigned src = base + ((lane ^ off) % 32);
  // Partners outside the group of `width` lanes never occur in the kernels (off < width).
  (void)width;
  const float r = g_state->shfl[src];
  warp.wait();
  return r;
}

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t, cudaStream_t,
            Args&&... args) {
  g_grid_dim = grid;
  g_block_dim = block;
  const unsigned n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        BlockState st;
        st.block = std::make_unique<Barrier>(n);
        for (unsigned w = 0; w < (n + 31) / 32; ++w)
          st.warps.push_back(std::make_unique<Barrier>(n - 32 * w < 32 ? n - 32 * w : 32));
        st.shfl.assign(n, 0.f);
        g_state = &st;
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (unsigned t = 0; t < n; ++t) {
          threads.emplace_back([&, t] {
            t_block = uint3{bx, by, bz};
            t_thread = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            kernel(args...);
          });
        }
        for (auto& th : threads) th.join();
        g_state = nullptr;
      }
}

inline float int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

inline unsigned byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = (s >> (4 * i)) & 7;
    r |= static_cast<unsigned>((v >> (8 * sel)) & 0xff) << (8 * i);
  }
  return r;
}

}  // namespace rwkv_emu

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __global__
#define __global__
#define threadIdx (::rwkv_emu::t_thread)
#define blockIdx (::rwkv_emu::t_block)
#define blockDim (::rwkv_emu::g_block_dim)
#define gridDim (::rwkv_emu::g_grid_dim)
#define __syncthreads() ::rwkv_emu::syncthreads()
#define __shfl_xor_sync(mask, v, off, width) ::rwkv_emu::shfl_xor((v), (off), (width))
#define __expf(x) std::exp(x)
#define __int_as_float(i) ::rwkv_emu::int_as_float(static_cast<int>(i))
#define __byte_perm(x, y, s) ::rwkv_emu::byte_perm((x), (y), (s))
