// The CPU kernels compiled for the baseline instruction set of the build (no target pragma):
// one row of the kernel table. Rules (csrc/README.md): no torch headers, no std containers, no
// static data with initializers, everything in namespace rwkv::cpu::scalar.
#define RWKV_ISA scalar
#define RWKV_VEC VecScalar
#include "cpu/kernels/vec_scalar.h"
#include "cpu/kernels/isa_table.h"
