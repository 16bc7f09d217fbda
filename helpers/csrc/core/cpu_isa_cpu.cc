// Which compiled copy of the CPU kernels this process runs (see cpu_isa.h).
#include "cpu_isa.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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

namespace {
// Zen 4 (AMD family 0x19, models 0x10-0x1f, 0x60-0x7f, 0xa0-0xaf): the core whose forward runs
// faster with its prefetches into L2 (cpu_isa.h).
bool is_zen4() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  const unsigned base_family = (a >> 8) & 0xfu;
  const unsigned family = base_family == 0xfu ? base_family + ((a >> 20) & 0xffu) : base_family;
  const unsigned model = ((a >> 4) & 0xfu) | (base_family == 0xfu ? ((a >> 16) & 0xfu) << 4 : 0u);
  return family == 0x19u && ((model >= 0x10u && model <= 0x1fu) || (model >= 0x60u && model <= 0x7fu) ||
                             (model >= 0xa0u && model <= 0xafu));
#else
  return false;
#endif
}

bool choose_prefetch_to_l2() {
  const char* want = std::getenv("EMBEDLAB_PREFETCH_LEVEL");
  if (want != nullptr && std::strcmp(want, "l1") == 0) return false;
  if (want != nullptr && std::strcmp(want, "l2") == 0) return true;
  return is_zen4();
}
}  // namespace

namespace detail {
// Set when the library loads (a static initializer, as the instruction set is chosen then).
bool forward_prefetch_l2_flag = choose_prefetch_to_l2();
}  // namespace detail

const char* forward_prefetch_level() { return forward_prefetch_to_l2() ? "l2" : "l1"; }

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
extern "C" const char* embedlab_prefetch_level() { return embedlab::forward_prefetch_level(); }
