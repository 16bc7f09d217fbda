// The instruction sets of the CPU kernels, and the one this process runs.
//
// The kernel files whose speed depends on the vector width (embedding_cpu.cc: the lookup and
// its backward; sparse_optimizer_cpu.cc: the optimizers; csr_cpu.cc: the key sorts) are
// compiled once per instruction set, into namespace embedlab::baseline (x86-64's SSE2) and,
// where CMake builds it (EMBEDLAB_CPU_ISA=AUTO on x86-64), embedlab::avx2 (cpu_isa_kernels.h
// opens the namespace and the target). Each copy of each file exports one table of its entry
// points; the public functions of embedding.h, sparse_optimizer.h and csr.h (compiled once, with
// the baseline copy) call through the table chosen on first use (table_for_cpu_isa): one
// predictable branch and one indirect call per kernel call, nothing per row or per key.
// The rest of the core is compiled for the baseline only: with AVX2 nothing in it vectorizes
// beyond a few copies.
//
// The choice: the best instruction set this CPU supports among those built, unless the
// environment variable EMBEDLAB_CPU_ISA_RUNTIME=baseline forces the baseline (tests compare
// both paths bit for bit; `auto`, unset or empty choose). Python's embedlab._native reads the
// same variable, rejects any other value and refuses `avx2` where it cannot run, before it
// loads a library; this code never raises and never picks what the CPU lacks.
#pragma once

#include <cstdint>

namespace embedlab {

enum class CpuIsa : int32_t { kBaseline = 0, kAvx2 = 1 };

// The instruction set this process's kernels use (chosen once, at the first call).
CpuIsa cpu_isa();
// "baseline" | "avx2".
const char* cpu_isa_name(CpuIsa isa);
// The instruction sets compiled into this library, comma-separated: "baseline" or "baseline,avx2".
const char* cpu_isas_built();

// The copy of a kernel file's table of entry points that this process runs: `avx2` (nullptr
// where that copy is not built) when cpu_isa() chose it, else `baseline`. Each kernel file keeps
// the result in a function-local static reference: every later call is a load and a call
// through it.
template <typename Table>
const Table& table_for_cpu_isa(const Table& baseline, const Table* avx2) {
  return avx2 != nullptr && cpu_isa() == CpuIsa::kAvx2 ? *avx2 : baseline;
}

}  // namespace embedlab

// For callers that see only the shared library (ctypes, tests): the instruction set its
// kernels run, "baseline" or "avx2" (cpu_isa_name(cpu_isa())).
extern "C" __attribute__((visibility("default"))) const char* embedlab_cpu_isa();
