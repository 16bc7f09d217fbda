#include "memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

namespace embedlab {
namespace {

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1 uapi value; older kernels answer EINVAL, which is fine
#endif

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("EMBEDLAB_HUGE_PAGES");
    return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0));
  }();
  return on;
}

}  // namespace

bool advise_huge_pages(const void* ptr, size_t bytes, size_t min_bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (!enabled() || ptr == nullptr || bytes < min_bytes) return false;
  // Advise a buffer the second time it is seen: a long-lived table is, while a buffer that a
  // variable gets anew every step (dense reassignments) never pays for a collapse. Both sets
  // are bounded: past kMaxTracked entries they start over.
  constexpr size_t kMaxTracked = 4096;
  static std::mutex mu;
  static std::set<std::pair<uintptr_t, size_t>> seen_once, advised;
  {
    std::lock_guard<std::mutex> l(mu);
    const std::pair<uintptr_t, size_t> key{reinterpret_cast<uintptr_t>(ptr), bytes};
    if (advised.count(key)) return false;
    if (seen_once.insert(key).second) {
      if (seen_once.size() > kMaxTracked) seen_once.clear();
      return false;
    }
    seen_once.erase(key);
    if (advised.size() >= kMaxTracked) advised.clear();
    advised.insert(key);
  }
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(ptr) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(ptr) + bytes) & ~(kHuge - 1);
  if (end <= begin) return false;
  void* p = reinterpret_cast<void*>(begin);
  if (madvise(p, end - begin, MADV_HUGEPAGE) != 0) return false;
  madvise(p, end - begin, MADV_COLLAPSE);  // may fail (old kernel, no free huge pages): advice stays
  return true;
#else
  (void)ptr, (void)bytes, (void)min_bytes;
  return false;
#endif
}

}  // namespace embedlab
