// The CPU kernels compiled for the avx2 instruction set: one row of the kernel table.
// Rules (csrc/README.md): no torch headers, no std containers, no static data with initializers,
// everything in namespace rwkv::cpu::avx2; the target pragma comes before every include so that
// all code in this file, and only here, may use the wider instructions.
// Same condition as RWKV_HAVE_X86_ISAS in cpu/kernel_table.h (that header cannot come first).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx2,fma")

#define RWKV_ISA avx2
#include "cpu/kernel_table.h"
#include "cpu/kernels/vec_avx2.h"
#include "cpu/kernels/linear.h"
#include "cpu/kernels/mm8.h"
#include "cpu/kernels/wkv4.h"
#include "cpu/kernels/wkv56.h"
#include "cpu/kernels/wkv7.h"

namespace rwkv {
namespace cpu {
namespace avx2 {

void fill_kernel_table(KernelTable* table) {
  using V = VecAvx2;
  table->wkv4 = &wkv4<V>;
  table->wkv56 = &wkv56<V>;
  table->wkv7 = &wkv7<V>;
  table->mm8 = &mm8<V>;
  table->mm8_prepare = &mm8_prepare<V>;
  table->linear_one_bf16 = &linear_one<V>;
}

}  // namespace avx2
}  // namespace cpu
}  // namespace rwkv
#endif  // x86-64 GCC
