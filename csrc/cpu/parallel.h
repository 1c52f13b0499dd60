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

namespace rwkv {
namespace cpu {

// Several members' units (a group's products, each with its own columns): their blocks laid end
// to end, member after member, and shared out by work (member i's units cost work[i] each).
// Calls body(i, u0, u1) for sub-ranges of member i's [0, units[i]) whose bounds are multiples of
// `block` (or units[i]); every block exactly once. Each task first takes one contiguous run of
// the first 7/8 of the work, at equal shares (a thread reads one run of consecutive memory
// across the members, what the hardware prefetchers stream best); the last 1/8 is then taken in
// small chunks, in order, by whichever task is free. The threads thus finish together even when
// one ran slower (it started later, or its core read less): with a static split the faster one
// waited ~1-2% of every product (0.85-1.6 ms per 1.5b token on the development machine).
// (Small arrays, not heap vectors: while decoding this runs for every product call.)
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
  const int64_t head = total - total / 8;
  const int64_t chunk = std::max<int64_t>(1, (total - head) / (8 * tasks));
  std::atomic<int64_t> next{head};
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    const int64_t lo = head / tasks * t0 + std::min(t0, head % tasks);
    const int64_t hi = head / tasks * t1 + std::min(t1, head % tasks);
    run(lo, hi);
    for (int64_t c = next.fetch_add(chunk); c < total; c = next.fetch_add(chunk)) {
      run(c, std::min(total, c + chunk));
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
