// The CPU kernels compiled for AVX-512 (F, BW, VL, DQ): one row of the kernel table. Rules
// (csrc/README.md): no torch headers, no std containers, no static data with initializers,
// everything in namespace rwkv::cpu::avx512; the target pragma comes before every include so that
// all code in this file, and only this file, may use these instructions.
// Same condition as RWKV_HAVE_X86_ISAS in cpu/kernel_table.h (that header cannot come first).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#define RWKV_ISA avx512
#define RWKV_VEC VecAvx512
#include "cpu/kernels/vec_avx512.h"
#include "cpu/kernels/isa_table.h"
#endif  // x86-64 GCC
