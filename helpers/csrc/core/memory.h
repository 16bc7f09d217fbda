// Memory placement hints for large embedding tables (framework-free).
#pragma once

#include <cstddef>

namespace embedlab {

// Asks the kernel to back [ptr, ptr + bytes) with 2 MiB transparent huge pages: MADV_HUGEPAGE,
// then MADV_COLLAPSE (Linux >= 6.1) to do it now rather than whenever khugepaged gets there.
// Random row gathers over a table of gigabytes miss the TLB on almost every key with 4 KiB
// pages; NumPy already advises its large arrays this way, TensorFlow's allocator does not.
// Best effort: a buffer is advised the second time it is passed in (so buffers that live for
// one step are never collapsed) and only once; buffers under `min_bytes`, systems without THP
// and the EMBEDLAB_HUGE_PAGES=0 environment setting are left alone. Never changes contents.
// Returns true if the advice was given now.
bool advise_huge_pages(const void* ptr, size_t bytes, size_t min_bytes = size_t{32} << 20);

}  // namespace embedlab
