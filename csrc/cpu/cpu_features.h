// Which CPU instruction set the kernels use: the highest of scalar < avx2 < avx512 < avx512vnni
// < avx512bf16 that both the CPU and the OS support, or the one forced by rwkv::_set_cpu_isa
// (which rwkv.ops calls for the RWKV_CPU_ISA setting when it loads the extension, and tests call
// as a hook). C++ reads no environment variable: settings come from Python (rwkv/settings.py).
#pragma once

#include "cpu/kernel_table.h"

namespace rwkv {
namespace cpu {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512vnni = 3, avx512bf16 = 4 };

const char* isa_name(Isa isa);

// The highest ISA this CPU and OS run (no cap, no forcing).
Isa detected_isa();

// The ISA the kernels use now.
Isa active_isa();

// The kernel row of the active ISA.
const KernelTable& kernels();

// How the one-token kernels read the matrix: true = one column after another (one sequential
// stream per thread, no software prefetch), false = "streams": 4 streams over the quarters of a
// call's columns, sharing each x load, with a software prefetch (kernels/streams.h). Automatic:
// sequential on AMD CPUs with AVX-512 (Zen 4), streams elsewhere (the order each reads fastest);
// rwkv::_set_cpu_read_order forces one (rwkv.ops calls it for the RWKV_CPU_READ_ORDER setting,
// tests as a hook).
bool read_sequential();

}  // namespace cpu
}  // namespace rwkv
