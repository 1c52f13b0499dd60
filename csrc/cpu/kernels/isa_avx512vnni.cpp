// The CPU kernels compiled for AVX-512 (F, BW, VL, DQ) with VNNI: one row of the kernel table,
// the avx512 row's kernels but for mm8_one_i16's integer dot (vec_avx512vnni.h). Rules as in
// isa_avx512.cpp (csrc/README.md).
// Same condition as RWKV_HAVE_X86_ISAS in cpu/kernel_table.h (that header cannot come first).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")
#define RWKV_ISA avx512vnni
#define RWKV_VEC VecAvx512Vnni
#include "cpu/kernels/vec_avx512vnni.h"
#include "cpu/kernels/isa_table.h"
#endif  // x86-64 GCC
