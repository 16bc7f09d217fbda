// Which compiled copy of the CPU kernels this process runs (see cpu_isa.h).
#include "cpu_isa.h"

#include <cstdlib>
#include <cstring>

namespace embedlab {
namespace {

// EMBEDLAB_CPU_ISA_RUNTIME=baseline forces the baseline; anything else (unset, "auto", "avx2")
// takes the best this CPU supports. embedlab._native has already rejected other values, and
// "avx2" where the CPU or the build lacks it, before loading a library.
CpuIsa choose() {
  const char* want = std::getenv("EMBEDLAB_CPU_ISA_RUNTIME");
  if (want != nullptr && std::strcmp(want, "baseline") == 0) return CpuIsa::kBaseline;
#if defined(EMBEDLAB_CPU_HAVE_AVX2)
  // libgcc's check: the CPUID bit and the OS saving the YMM registers (XGETBV).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

}  // namespace

CpuIsa cpu_isa() {
  static const CpuIsa isa = choose();
  return isa;
}

namespace {
// Chosen when the library loads (its static initializers run at dlopen), so that the variable is
// read then, as documented, and not at the first kernel call.
const CpuIsa g_isa_at_load = cpu_isa();
}  // namespace

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "baseline"; }

const char* cpu_isas_built() {
#if defined(EMBEDLAB_CPU_HAVE_AVX2)
  return "baseline,avx2";
#else
  return "baseline";
#endif
}

}  // namespace embedlab

extern "C" const char* embedlab_cpu_isa() { return embedlab::cpu_isa_name(embedlab::cpu_isa()); }
