#include "huge_pages.h"

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

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0));
}

bool enabled() {
  static const bool on = env_on("EMBEDLAB_HUGE_PAGES");
  return on;
}

size_t mapped_bytes(size_t bytes) { return (bytes + kTableAlignment - 1) & ~(kTableAlignment - 1); }

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

bool aligned_tables_enabled() {
  static const bool on = env_on("EMBEDLAB_ALIGNED_TABLES");
  return on;
}

void* map_table(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = mapped_bytes(bytes);
  // Map one alignment more than needed, then give back the unaligned head and the tail.
  void* raw = mmap(nullptr, size + kTableAlignment, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t p = (r + kTableAlignment - 1) & ~(uintptr_t{kTableAlignment} - 1);
  if (p > r) munmap(raw, p - r);
  const uintptr_t tail = r + size + kTableAlignment - (p + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(p + size), tail);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (enabled()) madvise(reinterpret_cast<void*>(p), size, MADV_HUGEPAGE);  // a hint: failure changes nothing
#endif
  return reinterpret_cast<void*>(p);
}

void unmap_table(void* ptr, size_t bytes) {
  if (ptr != nullptr && bytes > 0) munmap(ptr, mapped_bytes(bytes));
}

}  // namespace embedlab
