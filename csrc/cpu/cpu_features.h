// Which CPU instruction set the kernels use: the highest of scalar < avx2 < avx512 < avx512vnni
// < avx512bf16 that both the CPU and the OS support, capped by the RWKV_CPU_ISA environment variable (read
// when first needed; an invalid value warns and is ignored), or forced by the test hook
// rwkv::_set_cpu_isa.
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
// sequential on AMD CPUs with AVX-512 (Zen 4), streams elsewhere (each measured fastest there);
// the environment variable RWKV_CPU_READ_ORDER=sequential|streams overrides it ("pairs", the old
// name of streams, is accepted too; read when first needed; an invalid value warns and is
// ignored); the test hook rwkv::_set_cpu_read_order forces it.
bool read_sequential();

}  // namespace cpu
}  // namespace rwkv
