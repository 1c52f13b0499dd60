// Scratch: a per-thread buffer for the one-token glue (cpu/one_token.cpp, cpu/mm8.cpp,
// cpu/wkv.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>

namespace rwkv {
namespace cpu {

// A buffer that grows on demand, 64-byte aligned so that full-width vector loads never straddle
// a cache line (as with at::empty's memory). The one-token glue keeps one per thread: two tensor
// allocations per call would be a measurable share of a small product's time.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(ptr_); }
  template <class T>
  T* get(int64_t n) {
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
    if (bytes > size_) {
      void* fresh = std::aligned_alloc(64, bytes);
      if (fresh == nullptr) throw std::bad_alloc();
      std::free(ptr_);
      ptr_ = fresh;
      size_ = bytes;
    }
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cpu
}  // namespace rwkv
