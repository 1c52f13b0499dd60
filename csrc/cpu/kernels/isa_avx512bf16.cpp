// The CPU kernels compiled for AVX-512 (F, BW, VL, DQ) with VNNI and BF16: one row of the kernel
// table, the avx512vnni row's kernels plus linear_one's bf16 x bf16 dot (vec_avx512bf16.h).
// Rules as in isa_avx512.cpp (csrc/README.md).
// Same condition as RWKV_HAVE_X86_ISAS in cpu/kernel_table.h (that header cannot come first).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma")
#define RWKV_ISA avx512bf16
#define RWKV_VEC VecAvx512Bf16
#include "cpu/kernels/vec_avx512bf16.h"
#include "cpu/kernels/isa_table.h"
#endif  // x86-64 GCC
