// CPU instruction-set choice and the one-token kernels' read order (see cpu_features.h) and their
// test-hook ops rwkv::_cpu_isa, rwkv::_cpu_isa_tables, rwkv::_set_cpu_isa, rwkv::_cpu_read_order,
// rwkv::_set_cpu_read_order and rwkv::_bf16_round (schemas in rwkv/ops/_schemas.py). Compiled for
// the baseline ISA.
#include "cpu/cpu_features.h"
#include "cpu/pooled.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <string>

namespace rwkv {
namespace cpu {
namespace {

constexpr int kAutomatic = -1;
std::atomic<int> g_forced{kAutomatic};

bool parse_isa(const std::string& s, Isa* out) {
  if (s == "scalar") *out = Isa::scalar;
  else if (s == "avx2") *out = Isa::avx2;
  else if (s == "avx512") *out = Isa::avx512;
  else if (s == "avx512vnni") *out = Isa::avx512vnni;
  else if (s == "avx512bf16") *out = Isa::avx512bf16;
  else return false;
  return true;
}

Isa detect() {
#if defined(RWKV_HAVE_X86_ISAS)
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0 via xgetbv).
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    if (!__builtin_cpu_supports("avx512vnni")) return Isa::avx512;
    return __builtin_cpu_supports("avx512bf16") ? Isa::avx512bf16 : Isa::avx512vnni;
  }
  if (avx2) return Isa::avx2;
#endif
  return Isa::scalar;
}

// The automatic choice: the detected ISA. (The RWKV_CPU_ISA setting is applied from Python, as a
// forced ISA, when rwkv.ops loads the extension: this file reads no environment.)
Isa automatic_isa() { return detected_isa(); }

// One kernel table per ISA, filled only for the ISAs this CPU and OS support: each fill function is
// compiled with its ISA's flags, so even filling a wider ISA's table may execute its instructions
// (the compiler is free to store the pointers with zmm registers) and would kill the process with
// SIGILL on a CPU without them. Rows above detected_isa() stay empty and are never handed out:
// active_isa() never exceeds detected_isa().
struct Tables {
  KernelTable row[5] = {};
  int filled = 0;  // rows 0 .. filled-1 hold kernels (test hook: _cpu_isa_tables)
  Tables() {
    using Fill = void (*)(KernelTable*);
    const Fill fill[5] = {
        &scalar::fill_kernel_table,
#if defined(RWKV_HAVE_X86_ISAS)
        &avx2::fill_kernel_table, &avx512::fill_kernel_table, &avx512vnni::fill_kernel_table,
        &avx512bf16::fill_kernel_table,
#else
        nullptr, nullptr, nullptr, nullptr,
#endif
    };
    const int highest = static_cast<int>(detected_isa());
    for (int i = 0; i <= highest && fill[i] != nullptr; ++i) {
      fill[i](&row[i]);
      filled = i + 1;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

std::string cpu_isa_op() { return isa_name(active_isa()); }

int64_t cpu_isa_tables_op() { return tables().filled; }

// ----------------------------------------------------------------------- one-token read order
constexpr int kStreams = 0, kSequential = 1;
std::atomic<int> g_forced_order{kAutomatic};

bool parse_order(const std::string& s, int* out) {
  if (s == "sequential") *out = kSequential;
  else if (s == "streams" || s == "pairs") *out = kStreams;  // "pairs": another name of streams
  else return false;
  return true;
}

const char* order_name(int order) { return order == kSequential ? "sequential" : "streams"; }

// The automatic read order, by CPU. (The RWKV_CPU_READ_ORDER setting is applied from Python, as a
// forced order, when rwkv.ops loads the extension.)
int automatic_order() {
  static const int order = [] {
    int chosen = kStreams;
#if defined(RWKV_HAVE_X86_ISAS)
    // Sequential only where it reads faster: AMD Zen 4 (with AVX-512). AVX2-only AMD CPUs (Zen 3)
    // read faster as streams in every strategy (docs/kernels.md).
    __builtin_cpu_init();
    const bool avx512 = static_cast<int>(detected_isa()) >= static_cast<int>(Isa::avx512);
    if (__builtin_cpu_is("amd") && avx512) chosen = kSequential;
#endif
    return chosen;
  }();
  return order;
}

int active_order() {
  const int forced = g_forced_order.load(std::memory_order_relaxed);
  return forced == kAutomatic ? automatic_order() : forced;
}

std::string cpu_read_order_op() { return order_name(active_order()); }

// Forces `order` ("" or "auto": back to the automatic choice); returns the previously forced one.
std::string set_cpu_read_order_op(std::string order) {
  const int previous = g_forced_order.load();
  std::string previous_name = previous == kAutomatic ? "" : order_name(previous);
  int wanted = kAutomatic;
  TORCH_CHECK(order.empty() || order == "auto" || parse_order(order, &wanted),
              "_set_cpu_read_order: order must be sequential, streams or empty, got '", order, "'");
  g_forced_order.store(wanted);
  return previous_name;
}

// Forces `isa` ("" or "auto": back to the automatic choice); returns the previously forced one.
std::string set_cpu_isa_op(std::string isa) {
  const int previous = g_forced.load();
  std::string previous_name = previous == kAutomatic ? "" : isa_name(static_cast<Isa>(previous));
  if (isa.empty() || isa == "auto") {
    g_forced.store(kAutomatic);
    return previous_name;
  }
  Isa wanted;
  TORCH_CHECK(parse_isa(isa, &wanted),
              "_set_cpu_isa: isa must be scalar, avx2, avx512, avx512vnni, avx512bf16 or empty, "
              "got '", isa, "'");
  TORCH_CHECK(static_cast<int>(wanted) <= static_cast<int>(detected_isa()), "_set_cpu_isa: isa ",
              isa, " is not supported by this CPU/OS or build, got highest ",
              isa_name(detected_isa()));
  g_forced.store(static_cast<int>(wanted));
  return previous_name;
}

// Test hook: x (fp32, contiguous, CPU) rounded to bf16 by the active ISA's bf16_round kernel,
// whatever its length (the ops use it for one-token results only).
at::Tensor bf16_round_op(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "_bf16_round: x must be a contiguous float32 CPU tensor, got ", x.scalar_type(),
              " on ", x.device());
  at::Tensor out = pooled_empty(x.sizes(), at::kBFloat16);
  kernels().bf16_round(x.numel(), x.data_ptr<float>(),
                       reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  return out;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::avx512vnni: return "avx512vnni";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "scalar";
  }
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced == kAutomatic ? automatic_isa() : static_cast<Isa>(forced);
}

const KernelTable& kernels() { return tables().row[static_cast<int>(active_isa())]; }

bool read_sequential() { return active_order() == kSequential; }

}  // namespace cpu
}  // namespace rwkv

// These ops take no tensor, so they are registered for CompositeExplicitAutograd (any device).
TORCH_LIBRARY_IMPL(rwkv, CompositeExplicitAutograd, m) {
  m.impl("_cpu_isa", &rwkv::cpu::cpu_isa_op);
  m.impl("_cpu_isa_tables", &rwkv::cpu::cpu_isa_tables_op);
  m.impl("_set_cpu_isa", &rwkv::cpu::set_cpu_isa_op);
  m.impl("_cpu_read_order", &rwkv::cpu::cpu_read_order_op);
  m.impl("_set_cpu_read_order", &rwkv::cpu::set_cpu_read_order_op);
}

TORCH_LIBRARY_IMPL(rwkv, CPU, m) { m.impl("_bf16_round", &rwkv::cpu::bf16_round_op); }
