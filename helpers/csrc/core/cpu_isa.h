// The instruction sets of the CPU kernels, and the one this process runs.
//
// The kernel files whose speed depends on the vector width (embedding_cpu.cc: the lookup and
// its backward; sparse_optimizer_cpu.cc: the optimizers; csr_cpu.cc: the key sorts) are
// compiled once per instruction set, into namespace embedlab::baseline (x86-64's SSE2) and,
// where CMake builds them (EMBEDLAB_CPU_ISA=AUTO on x86-64 with GCC), embedlab::avx2 and
// embedlab::avx512 (AVX-512 F/BW/DQ/VL; cpu_isa_kernels.h opens the namespace and the target). Each copy of each file exports one table of its entry
// points; the public functions of embedding.h, sparse_optimizer.h and csr.h (compiled once, with
// the baseline copy) call through the table chosen on first use (table_for_cpu_isa): one
// predictable branch and one indirect call per kernel call, nothing per row or per key.
// The rest of the core is compiled for the baseline only: with AVX2 nothing in it vectorizes
// beyond a few copies.
//
// The choice: the best instruction set this CPU (and its OS: XCR0 must enable the YMM, and for
// AVX-512 the ZMM and mask registers) supports among those built, unless the environment
// variable EMBEDLAB_CPU_ISA_RUNTIME names one: `baseline` or `avx2` caps the choice there (tests
// compare every copy with the baseline bit for bit; `auto`, unset or empty choose, and so does
// `avx512`, the widest). Python's embedlab._native reads the same variable, rejects any other
// value and refuses a copy that was not built or cannot run here, before it loads a library;
// this code never raises and never picks what the CPU lacks.
#pragma once

#include <cstdint>

namespace embedlab {

enum class CpuIsa : int32_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// The instruction set this process's kernels use (chosen once, at the first call).
CpuIsa cpu_isa();
// "baseline" | "avx2" | "avx512".
const char* cpu_isa_name(CpuIsa isa);
// The instruction sets compiled into this library, comma-separated: "baseline" or
// "baseline,avx2,avx512".
const char* cpu_isas_built();

// Where the forward's software prefetches put the table rows it is about to read: true for L2
// (PREFETCHT1), false for L1 (PREFETCHT0, FBGEMM's choice). The faster level depends on the core
// (docs/benchmarks/index.md), so it is chosen once, when the library loads: L2 on AMD Zen 4
// (family 0x19, models 0x10-0x1f, 0x60-0x7f, 0xa0-0xaf), L1 elsewhere,
// unless the environment variable EMBEDLAB_PREFETCH_LEVEL says `l1` or `l2` (embedlab._native
// rejects other values before a library loads). Never changes results, only speed.
// Read per key by the forward, hence an inline load of a flag set when the library loads.
namespace detail {
extern bool forward_prefetch_l2_flag;
}  // namespace detail
inline bool forward_prefetch_to_l2() { return detail::forward_prefetch_l2_flag; }
// "l1" | "l2": forward_prefetch_to_l2() as a name.
const char* forward_prefetch_level();

// The copy of a kernel file's table of entry points that this process runs: the one of the
// instruction set cpu_isa() chose (`avx2`, `avx512`: nullptr where that copy is not built, and
// cpu_isa() never chooses a copy that was not built). Each kernel file keeps the result in a
// function-local static reference (EMBEDLAB_CPU_ISA_KERNELS, cpu_isa_kernels.h): every later
// call is a load and a call through it.
template <typename Table>
const Table& table_for_cpu_isa(const Table& baseline, const Table* avx2, const Table* avx512) {
  switch (cpu_isa()) {
    case CpuIsa::kAvx512:
      if (avx512 != nullptr) return *avx512;
      break;
    case CpuIsa::kAvx2:
      if (avx2 != nullptr) return *avx2;
      break;
    case CpuIsa::kBaseline:
      break;
  }
  return baseline;
}

}  // namespace embedlab

// For callers that see only the shared library (ctypes, tests): the instruction set its
// kernels run, "baseline", "avx2" or "avx512" (cpu_isa_name(cpu_isa())).
extern "C" __attribute__((visibility("default"))) const char* embedlab_cpu_isa();
// Likewise, where the forward prefetches rows: "l1" or "l2" (forward_prefetch_level()).
extern "C" __attribute__((visibility("default"))) const char* embedlab_prefetch_level();
