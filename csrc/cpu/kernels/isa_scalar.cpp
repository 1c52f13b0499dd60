// The CPU kernels compiled for the scalar instruction set: one row of the kernel table.
// Rules (csrc/README.md): no torch headers, no std containers, no static data with initializers,
// everything in namespace rwkv::cpu::scalar; the target pragma comes before every include so that
// all code in this file, and only here, may use the wider instructions.
// No target pragma: the baseline instruction set of the build.


#define RWKV_ISA scalar
#include "cpu/kernel_table.h"
#include "cpu/kernels/vec_scalar.h"
#include "cpu/kernels/linear.h"
#include "cpu/kernels/mm8.h"
#include "cpu/kernels/wkv4.h"
#include "cpu/kernels/wkv56.h"
#include "cpu/kernels/wkv7.h"

namespace rwkv {
namespace cpu {
namespace scalar {

void fill_kernel_table(KernelTable* table) {
  using V = VecScalar;
  table->wkv4 = &wkv4<V>;
  table->wkv56 = &wkv56<V>;
  table->wkv7 = &wkv7<V>;
  table->mm8 = &mm8<V>;
  table->mm8_prepare = &mm8_prepare<V>;
  table->linear_one_bf16 = &linear_one<V>;
}

}  // namespace scalar
}  // namespace cpu
}  // namespace rwkv

