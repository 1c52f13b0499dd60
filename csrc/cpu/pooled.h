// Output tensors of the CPU ops from a pool of reused blocks (cpu/pooled.cpp). While decoding,
// every op returns tensors of a few KB to 512 KB, which glibc's malloc serves from its bins
// (tcache takes only the smallest), with metadata the streamed weights have flushed from the
// caches. The pool keeps freed blocks by exact size (a token's sizes repeat every token) and
// hands the most recently freed back first, still in the caches. The tensors
// are ordinary resizable CPU tensors; only their memory comes from the pool (their storage's
// allocator).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace rwkv {
namespace cpu {

// An uninitialized contiguous CPU tensor, as at::empty(sizes, dtype).
at::Tensor pooled_empty(at::IntArrayRef sizes, at::ScalarType dtype);

// Bytes the pool keeps now: [in blocks up to 1 MiB, in larger blocks] (test hook rwkv::_pooled_kept).
std::vector<int64_t> pooled_kept();

}  // namespace cpu
}  // namespace rwkv
