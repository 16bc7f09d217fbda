// Memory placement hints for large embedding tables (framework-free).
#pragma once

#include <cstddef>

namespace embedlab {

// Tables of this size and more get a mapping of their own (map_table), and are advised onto huge
// pages (advise_huge_pages' default min_bytes): below it a table sits in the caches anyway.
constexpr size_t kLargeTableBytes = size_t{32} << 20;
// Where such a table starts: on a 2 MiB boundary, the start of a huge page.
constexpr size_t kTableAlignment = size_t{2} << 20;

// Asks the kernel to back [ptr, ptr + bytes) with 2 MiB transparent huge pages: MADV_HUGEPAGE,
// then MADV_COLLAPSE (Linux >= 6.1) to do it now rather than whenever khugepaged gets there.
// Random row gathers over a table of gigabytes miss the TLB on almost every key with 4 KiB
// pages; NumPy already advises its large arrays this way, TensorFlow's allocator does not.
// Best effort: a buffer is advised the second time it is passed in (so buffers that live for
// one step are never collapsed) and only once; buffers under `min_bytes`, systems without THP
// and the EMBEDLAB_HUGE_PAGES=0 environment setting are left alone. Never changes contents.
// Returns true if the advice was given now.
bool advise_huge_pages(const void* ptr, size_t bytes, size_t min_bytes = kLargeTableBytes);

// An anonymous mapping of `bytes` (rounded up to kTableAlignment) that starts on a 2 MiB
// boundary, advised onto huge pages before anything touches it (MADV_HUGEPAGE, unless
// EMBEDLAB_HUGE_PAGES=0), so its pages fault in as huge pages. Why: TensorFlow's CPU allocator
// starts a large buffer 64 bytes into a page, so a 256-byte row
// straddles three 128-byte line pairs instead of two and the first and last 2 MiB of the
// table are never huge pages. Contents are zero. nullptr if the mapping fails.
void* map_table(size_t bytes);
// Releases a map_table mapping (the same `bytes`).
void unmap_table(void* ptr, size_t bytes);
// False when EMBEDLAB_ALIGNED_TABLES=0 (or off): tables then stay in the buffers their framework
// gave them (huge-page advice still applies, under EMBEDLAB_HUGE_PAGES).
bool aligned_tables_enabled();

}  // namespace embedlab
