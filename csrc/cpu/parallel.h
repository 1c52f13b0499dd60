// Splitting a kernel's independent units (output columns, channels) between threads, for the
// CPU glue: blocks of `block` units, so the kernels' unit groups stay whole, and at least ~64k
// units of work (multiply-adds, or bytes read) per task, so small ops stay on one thread.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace rwkv {
namespace cpu {

// Several members' units (a group's products, each with its own columns): their blocks laid end
// to end, member after member, and shared out by work (member i's units cost work[i] each).
// Calls body(i, u0, u1) for sub-ranges of member i's [0, units[i]) whose bounds are multiples of
// `block` (or units[i]); every block exactly once. The work is cut into chunks of at most
// kChunkWork, and each task owns an equal contiguous share of them, which it runs from the front,
// in order (a thread reads one run of consecutive memory across the members, what the hardware
// prefetchers stream best); a task whose share is done then takes chunks from the backs of the
// others' shares. The threads thus finish together even when one ran slower (it started later,
// or its core read less): with a static split the faster one would wait ~1-2% of every product.
// Small shared chunks taken in turn would alternate between the threads instead, and a thread
// reading every other 32 KiB streams at about half the rate of one reading a single run
// (docs/kernels.md).
// (Small arrays, not heap vectors, for up to 8 tasks: while decoding this runs for every product.)

// n default-constructed T (atomics, ChunkRange: neither copyable nor movable), in place for up
// to K, else on the heap: no allocation in the usual case, which runs for every one-token call.
template <class T, size_t K = 8>
class SmallArray {
 public:
  explicit SmallArray(size_t n) {
    if (n > K) {
      heap_.reset(new T[n]);
      p_ = heap_.get();
    }
  }
  SmallArray(const SmallArray&) = delete;
  SmallArray& operator=(const SmallArray&) = delete;
  T& operator[](size_t i) const { return p_[i]; }

 private:
  T local_[K];
  std::unique_ptr<T[]> heap_;
  T* p_ = local_;
};

// The most work in one for_member_blocks chunk (each task's share is at least 16 chunks).
constexpr int64_t kChunkWork = 256 * 1024;

// Unclaimed chunks [front, back) of one task's share, claimed from either end.
struct alignas(64) ChunkRange {
  std::atomic<uint64_t> word{0};  // front << 32 | back
  void init(int64_t front, int64_t back) {
    word.store(static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back),
               std::memory_order_relaxed);
  }
  // The chunk taken, or -1 when none is left.
  int64_t take_front() { return take(true); }
  int64_t take_back() { return take(false); }

 private:
  int64_t take(bool front) {
    uint64_t w = word.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t f = w >> 32, b = w & 0xffffffffu;
      if (f >= b) return -1;
      const uint64_t next = front ? (f + 1) << 32 | b : f << 32 | (b - 1);
      if (word.compare_exchange_weak(w, next, std::memory_order_relaxed))
        return static_cast<int64_t>(front ? f : b - 1);
    }
  }
};

template <class F>
void for_member_blocks(c10::ArrayRef<int64_t> units, c10::ArrayRef<int64_t> work, int64_t block,
                       const F& body) {
  const size_t n = units.size();
  c10::SmallVector<int64_t, 16> base(n + 1, 0);  // the work before member i's first block
  for (size_t i = 0; i < n; ++i) base[i + 1] = base[i] + units[i] * std::max<int64_t>(1, work[i]);
  const int64_t total = base[n];
  if (total == 0) return;
  // The blocks whose first unit's work offset lies in [lo, hi).
  auto run = [&](int64_t lo, int64_t hi) {
    for (size_t i = 0; i < n; ++i) {
      if (base[i + 1] <= lo || base[i] >= hi || units[i] == 0) continue;
      const int64_t step = block * std::max<int64_t>(1, work[i]);  // the work of one block
      const int64_t blocks = (units[i] + block - 1) / block;
      auto first_block_from = [&](int64_t offset) {  // ceil((offset - base) / step), clamped
        return std::clamp<int64_t>((offset - base[i] + step - 1) / step, 0, blocks);
      };
      const int64_t b0 = first_block_from(lo), b1 = first_block_from(hi);
      if (b0 < b1) body(i, b0 * block, std::min(units[i], b1 * block));
    }
  };
  const int64_t tasks = std::clamp<int64_t>(total / 65536, 1, at::get_num_threads());
  if (tasks == 1) {
    run(0, total);
    return;
  }
  // Task t owns chunks [chunks*t/tasks, chunks*(t+1)/tasks) and takes them from the front, in
  // order; when its own are gone it takes other tasks' chunks from their backs.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(kChunkWork, total / (tasks * 16)));
  const int64_t chunks = (total + chunk - 1) / chunk;
  SmallArray<ChunkRange> ranges(static_cast<size_t>(tasks));
  for (int64_t t = 0; t < tasks; ++t) ranges[t].init(chunks * t / tasks, chunks * (t + 1) / tasks);
  auto run_chunk = [&](int64_t c) { run(c * chunk, std::min(total, (c + 1) * chunk)); };
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c; (c = ranges[t].take_front()) >= 0;) run_chunk(c);
      for (int64_t u = 1; u < tasks; ++u) {
        ChunkRange& other = ranges[(t + u) % tasks];
        for (int64_t c; (c = other.take_back()) >= 0;) run_chunk(c);
      }
    }
  });
}

// One member: calls body(u0, u1) on sub-ranges of [0, n) whose bounds are multiples of `block`
// (or n); each unit costs work_per_unit.
template <class F>
void for_blocks(int64_t n, int64_t block, int64_t work_per_unit, const F& body) {
  for_member_blocks({n}, {work_per_unit}, block,
                    [&](size_t, int64_t u0, int64_t u1) { body(u0, u1); });
}

}  // namespace cpu
}  // namespace rwkv
