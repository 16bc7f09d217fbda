// What the kernel files compiled once per instruction set (embedding_cpu.cc,
// sparse_optimizer_cpu.cc, csr_cpu.cc; cpu_isa.h says how a copy is chosen) share. Include it
// LAST, after every other #include: in the AVX2 copy (EMBEDLAB_ISA_AVX2) it opens the AVX2 target,
// in the AVX-512 copy (EMBEDLAB_ISA_AVX512) the AVX-512 F/BW/DQ/VL one, for the rest of the file.
// Everything here and after it lives in namespace embedlab::EMBEDLAB_ISA_NS (baseline, avx2 or
// avx512), so the copies never share a symbol.
//
// The AVX2 copy is compiled under `#pragma GCC target("avx2")` (the AVX-512 one likewise), opened
// after the last #include, rather than with -mavx2: only the functions defined in the kernel files become AVX2 code. The inline
// functions and templates of the headers (std::vector, std::function, ...) keep the baseline
// target wherever they are emitted out of line; the linker keeps one copy of each for the whole
// library, and with -mavx2 that copy could be an AVX2 one that a baseline caller then runs on a
// CPU without AVX2. Inlined into an AVX2 function they are compiled for AVX2 there.
//
// EMBEDLAB_ISA_BASELINE_COPY is 1 in the baseline copy: each kernel file compiles its public
// entry points (the same for every instruction set) in that copy only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "embedding.h"
#include "thread_pool.h"

namespace embedlab {
namespace {

// For the entry points' error messages (compiled in the baseline copy, before the target opens).
// Messages are built with std::to_string rather than iostreams: an ostringstream here
// segfaulted on the GPU test machine (cause not established), and these error paths must not
// fail themselves.
inline std::string str(int64_t v) { return std::to_string(v); }

}  // namespace
}  // namespace embedlab

// EMBEDLAB_CPU_ISA_KERNELS(Table, kName), in each kernel file's baseline-copy section (inside
// namespace embedlab): declares the other copies' tables `<isa>::kName` of type Table and defines
// kernels(), the copy this process runs (table_for_cpu_isa, kept in a function-local static
// reference: one load and an indirect call per kernel call).
#if defined(EMBEDLAB_CPU_HAVE_AVX2)
#define EMBEDLAB_CPU_ISA_DECLARE_AVX2(Table, kName) \
  namespace avx2 {                                  \
  extern const Table kName;                         \
  }
#define EMBEDLAB_CPU_ISA_AVX2_TABLE(kName) (&avx2::kName)
#else
#define EMBEDLAB_CPU_ISA_DECLARE_AVX2(Table, kName)
#define EMBEDLAB_CPU_ISA_AVX2_TABLE(kName) nullptr
#endif
#if defined(EMBEDLAB_CPU_HAVE_AVX512)
#define EMBEDLAB_CPU_ISA_DECLARE_AVX512(Table, kName) \
  namespace avx512 {                                  \
  extern const Table kName;                           \
  }
#define EMBEDLAB_CPU_ISA_AVX512_TABLE(kName) (&avx512::kName)
#else
#define EMBEDLAB_CPU_ISA_DECLARE_AVX512(Table, kName)
#define EMBEDLAB_CPU_ISA_AVX512_TABLE(kName) nullptr
#endif
#define EMBEDLAB_CPU_ISA_KERNELS(Table, kName)                                                             \
  EMBEDLAB_CPU_ISA_DECLARE_AVX2(Table, kName)                                                              \
  EMBEDLAB_CPU_ISA_DECLARE_AVX512(Table, kName)                                                            \
  namespace {                                                                                              \
  const Table& kernels() {                                                                                 \
    static const Table& k = table_for_cpu_isa<Table>(baseline::kName, EMBEDLAB_CPU_ISA_AVX2_TABLE(kName),  \
                                                     EMBEDLAB_CPU_ISA_AVX512_TABLE(kName));                \
    return k;                                                                                              \
  }                                                                                                        \
  }

#if defined(EMBEDLAB_ISA_AVX2)
#if !defined(__GNUC__) || defined(__clang__)
#error "the AVX2 kernels are compiled with GCC's #pragma GCC target (CMakeLists.txt builds them with GCC only)"
#endif
#define EMBEDLAB_ISA_NS avx2
#define EMBEDLAB_ISA_BASELINE_COPY 0
#pragma GCC push_options
#pragma GCC target("avx2")
#elif defined(EMBEDLAB_ISA_AVX512)
#if !defined(__GNUC__) || defined(__clang__)
#error "the AVX-512 kernels are compiled with GCC's #pragma GCC target (CMakeLists.txt builds them with GCC only)"
#endif
#define EMBEDLAB_ISA_NS avx512
#define EMBEDLAB_ISA_BASELINE_COPY 0
#pragma GCC push_options
// 512-bit vectors for the loops GCC vectorizes itself too (by default it prefers 256 bits with
// AVX-512, to keep older Intel cores from lowering their clock).
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#else
#define EMBEDLAB_ISA_NS baseline
#define EMBEDLAB_ISA_BASELINE_COPY 1
#endif

namespace embedlab {
namespace EMBEDLAB_ISA_NS {
namespace {

constexpr int kPrefetchDistance = 16;

// Prefetches a row about to be updated in place: fetched with intent to write (PREFETCHW),
// so the line arrives owned and the store does not need a second trip to upgrade it.
inline void prefetch_row_for_write(float* row, int64_t dim) {
  const int64_t lines = std::min<int64_t>((dim * 4 + 63) / 64, 16);
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(row + l * 16, 1, 1);
}

// Row arithmetic with the width known at compile time where it matters. D > 0 is the row width;
// D == 0 means "read it at run time". Fixed widths let the compiler unroll into straight vector
// code (no loop, no memset call per row), which is most of the per-key cost once rows are in
// cache. Every variant does the same float operations in the same order: same bits.
template <int D>
struct Width {
  static constexpr int64_t get(int64_t) { return D; }
};
template <>
struct Width<0> {
  static int64_t get(int64_t dim) { return dim; }
};

template <int D>
inline void axpy(float* __restrict out, const float* __restrict src, float w, int64_t dim) {
  const int64_t n = Width<D>::get(dim);
  for (int64_t d = 0; d < n; ++d) out[d] += w * src[d];
}
template <int D>
inline void add(float* __restrict out, const float* __restrict src, int64_t dim) {
  const int64_t n = Width<D>::get(dim);
  for (int64_t d = 0; d < n; ++d) out[d] += src[d];
}
template <int D>
inline void zero(float* __restrict out, int64_t dim) {
  const int64_t n = Width<D>::get(dim);
  for (int64_t d = 0; d < n; ++d) out[d] = 0.f;
}

// Calls fn(std::integral_constant<int, D>) with D = dim for the common widths, else D = 0.
template <typename F>
inline void dispatch_dim(int64_t dim, F fn) {
  switch (dim) {
    case 4: return fn(std::integral_constant<int, 4>());
    case 8: return fn(std::integral_constant<int, 8>());
    case 16: return fn(std::integral_constant<int, 16>());
    case 32: return fn(std::integral_constant<int, 32>());
    case 64: return fn(std::integral_constant<int, 64>());
    case 128: return fn(std::integral_constant<int, 128>());
    default: return fn(std::integral_constant<int, 0>());
  }
}

// Maps a flat unit index over several tables (unit = one row, or one index) to its table.
struct FlatIndex {
  std::vector<int64_t> starts;  // starts[t] = first unit of table t; starts[T] = total
  template <typename F>
  explicit FlatIndex(int num_tables, F units_of) : starts(num_tables + 1, 0) {
    for (int t = 0; t < num_tables; ++t) starts[t + 1] = starts[t] + units_of(t);
  }
  int64_t total() const { return starts.back(); }
  // Calls fn(t, begin, end) for the parts of [b, e) that fall in each table t.
  template <typename F>
  void for_each(int64_t b, int64_t e, F fn) const {
    int t = static_cast<int>(std::upper_bound(starts.begin(), starts.end(), b) - starts.begin()) - 1;
    while (b < e) {
      const int64_t te = std::min(e, starts[t + 1]);
      if (te > b) fn(t, b - starts[t], te - starts[t]);
      b = te;
      ++t;
    }
  }
};

// Per-thread scratch is kept between calls only up to this size: a one-off huge call must not
// pin its memory to a pool thread for the life of the process.
template <typename T>
void trim_scratch(std::vector<T>* v) {
  constexpr size_t kMaxKeptBytes = size_t{64} << 20;
  if (v->capacity() * sizeof(T) > kMaxKeptBytes) std::vector<T>().swap(*v);
}

}  // namespace

// Kernels of one file that another file's kernels call (same copy).

// csr_cpu.cc: the stable sort of sort_runs_cpu (csr.h), and the backward's sort of packed
// (key << lo | position) values by bits [lo, lo + nbits).
void sort_runs(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
               std::vector<int64_t>* run_starts, ThreadPool& pool);
void radix_sort_packed(std::vector<uint64_t>* v, std::vector<uint64_t>* tmp, std::vector<int64_t>* counts, int lo,
                       int nbits);

// embedding_cpu.cc: the backward's summed gradient rows of all nu unique keys (the fused
// backward + optimizer in sparse_optimizer_cpu.cc sums them as LookupGradCpu::fill does).
void sum_all_rows(const LookupGradArgs& g, const int64_t* slot_of_pos, int64_t nu, float* rows, ThreadPool& pool,
                  uint8_t* touched = nullptr);

}  // namespace EMBEDLAB_ISA_NS
}  // namespace embedlab
