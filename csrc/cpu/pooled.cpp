// The block pool behind pooled_empty (cpu/pooled.h says why). Blocks carry a 64-byte header
// holding their size, so the deleter knows where a freed block belongs; data starts 64-byte
// aligned, as at::empty's does. Freed blocks are kept by exact size, at most kMaxPerSize of one
// size, within two budgets: blocks up to kSmallBlock bytes (what a decoded token's ops return)
// and larger ones up to kMaxBlock (a prompt's [T, C] results) each have kMaxKept bytes. With one
// budget for both, a 512-token prompt's 4 MiB results filled it, and from then on no decoded
// token's block was kept: every one went back to malloc. Beyond the budgets, and for blocks over
// kMaxBlock bytes, memory goes back to malloc.
#include "cpu/pooled.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <torch/library.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace rwkv {
namespace cpu {
namespace {

constexpr size_t kHeader = 64;
constexpr size_t kSmallBlock = size_t{1} << 20;
constexpr size_t kMaxBlock = size_t{4} << 20;
constexpr size_t kMaxKept = size_t{64} << 20;  // per budget
constexpr size_t kMaxPerSize = 64;

class BlockPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const size_t size = (n + 63) / 64 * 64;
    void* block = take(size);
    if (block == nullptr) {
      block = std::aligned_alloc(64, kHeader + size);
      if (block == nullptr) throw std::bad_alloc();
      *static_cast<size_t*>(block) = size;
    }
    void* data = static_cast<char*>(block) + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Bytes kept now: [blocks up to kSmallBlock, larger blocks] (the test hook _pooled_kept).
  std::array<size_t, 2> kept() {
    std::lock_guard<std::mutex> lock(mu_);
    return kept_;
  }

  static BlockPool& instance() {
    static BlockPool* pool = new BlockPool();  // never destroyed: blocks may be freed at exit
    return *pool;
  }

 private:
  void* take(size_t size) {
    if (size > kMaxBlock) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* block = it->second.back();
    it->second.pop_back();
    kept_[budget(size)] -= size;
    return block;
  }

  static size_t budget(size_t size) { return size <= kSmallBlock ? 0 : 1; }

  static void release(void* data) {
    void* block = static_cast<char*>(data) - kHeader;
    const size_t size = *static_cast<size_t*>(block);
    if (!instance().keep(block, size)) std::free(block);
  }

  bool keep(void* block, size_t size) {
    if (size > kMaxBlock) return false;
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*>& blocks = free_[size];
    size_t& kept = kept_[budget(size)];
    if (kept + size > kMaxKept || blocks.size() >= kMaxPerSize) return false;
    blocks.push_back(block);
    kept += size;
    return true;
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by size, most recently freed last
  std::array<size_t, 2> kept_{};
};

}  // namespace

std::vector<int64_t> pooled_kept() {
  const std::array<size_t, 2> k = BlockPool::instance().kept();
  return {static_cast<int64_t>(k[0]), static_cast<int64_t>(k[1])};
}

at::Tensor pooled_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, &BlockPool::instance(),
                                   c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                   std::nullopt);
}

}  // namespace cpu
}  // namespace rwkv

// Takes no tensor, so registered for CompositeExplicitAutograd (as _cpu_isa).
TORCH_LIBRARY_IMPL(rwkv, CompositeExplicitAutograd, m) {
  m.impl("_pooled_kept", &rwkv::cpu::pooled_kept);
}
