// Which compiled copy of the CPU kernels this process runs (see cpu_isa.h).
#include "cpu_isa.h"

#include <cstdlib>
#include <cstring>

namespace embedlab {
namespace {

// The widest copy that was built and that this CPU and OS can run. libgcc's checks: the CPUID
// bits, and the OS saving the registers (XGETBV: YMM state for AVX2; YMM, ZMM and opmask state for
// AVX-512).
CpuIsa best_supported() {
#if defined(EMBEDLAB_CPU_HAVE_AVX2) || defined(EMBEDLAB_CPU_HAVE_AVX512)
  __builtin_cpu_init();
#endif
#if defined(EMBEDLAB_CPU_HAVE_AVX512)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return CpuIsa::kAvx512;
#endif
#if defined(EMBEDLAB_CPU_HAVE_AVX2)
  if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

// EMBEDLAB_CPU_ISA_RUNTIME=baseline or avx2 caps the choice there; anything else (unset, "auto",
// "avx512") takes the best this CPU supports. embedlab._native has already rejected other
// values, and a copy the CPU or the build lacks, before loading a library.
CpuIsa choose() {
  const char* want = std::getenv("EMBEDLAB_CPU_ISA_RUNTIME");
  CpuIsa cap = CpuIsa::kAvx512;
  if (want != nullptr && std::strcmp(want, "baseline") == 0) cap = CpuIsa::kBaseline;
  if (want != nullptr && std::strcmp(want, "avx2") == 0) cap = CpuIsa::kAvx2;
  if (cap == CpuIsa::kBaseline) return cap;
  const CpuIsa best = best_supported();
  return static_cast<int32_t>(best) < static_cast<int32_t>(cap) ? best : cap;
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

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kBaseline: break;
  }
  return "baseline";
}

const char* cpu_isas_built() {
#if defined(EMBEDLAB_CPU_HAVE_AVX2) && defined(EMBEDLAB_CPU_HAVE_AVX512)
  return "baseline,avx2,avx512";
#elif defined(EMBEDLAB_CPU_HAVE_AVX2)
  return "baseline,avx2";
#else
  return "baseline";
#endif
}

}  // namespace embedlab

extern "C" const char* embedlab_cpu_isa() { return embedlab::cpu_isa_name(embedlab::cpu_isa()); }
