// CPU implementation of csr.h: the stable key sorts (the backward's and the optimizers') and the
// COO -> CSR conversion. The sorts are compiled once per instruction set (cpu_isa_kernels.h);
// the entry points of csr.h are compiled once, with the baseline copy, and call the copy that
// cpu_isa() chose.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_isa.h"
#include "csr.h"
#include "cpu_isa_kernels.h"  // last: opens the instruction set's namespace and target

namespace embedlab {

// The entry points of one compiled copy of this file's kernels.
struct CsrKernels {
  void (*sort_runs)(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
                    std::vector<int64_t>* run_starts, ThreadPool& pool);
};

namespace EMBEDLAB_ISA_NS {
namespace {

// Stable LSD radix sort of indices 0..n-1 by keys[i] in [0, key_bound).
void radix_order(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order) {
  order->resize(n);
  std::iota(order->begin(), order->end(), 0);
  if (n < 2) return;
  if (n < 64) {  // insertion sort is stable and beats histogram set-up here
    auto& o = *order;
    for (int64_t i = 1; i < n; ++i) {
      const int64_t v = o[i];
      int64_t j = i - 1;
      while (j >= 0 && keys[o[j]] > keys[v]) {
        o[j + 1] = o[j];
        --j;
      }
      o[j + 1] = v;
    }
    return;
  }
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < key_bound) ++bits;
  constexpr int kRadixBits = 11;
  constexpr int64_t kBuckets = int64_t{1} << kRadixBits;
  std::vector<int64_t> tmp(n);
  std::vector<int64_t> kbuf(n), ktmp(n);  // keys carried along: sequential reads per pass
  for (int64_t i = 0; i < n; ++i) kbuf[i] = keys[i];
  std::vector<int64_t> count(kBuckets);
  int64_t* src = order->data();
  int64_t* dst = tmp.data();
  int64_t* ksrc = kbuf.data();
  int64_t* kdst = ktmp.data();
  for (int shift = 0; shift < bits; shift += kRadixBits) {
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < n; ++i) ++count[(ksrc[i] >> shift) & (kBuckets - 1)];
    int64_t sum = 0;
    for (auto& c : count) {
      const int64_t t = c;
      c = sum;
      sum += t;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = count[(ksrc[i] >> shift) & (kBuckets - 1)]++;
      dst[p] = src[i];
      kdst[p] = ksrc[i];
    }
    std::swap(src, dst);
    std::swap(ksrc, kdst);
  }
  if (src != order->data()) std::memcpy(order->data(), src, sizeof(int64_t) * n);
}

}  // namespace

void sort_runs(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
               std::vector<int64_t>* run_starts, ThreadPool&) {
  radix_order(keys, n, key_bound, order);
  run_starts->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || keys[(*order)[i]] != keys[(*order)[i - 1]]) run_starts->push_back(i);
  }
  run_starts->push_back(n);
}

// Stable LSD radix sort of packed values by bits [lo, lo + nbits), in as few passes of at most
// 11 bits as cover them, the bits shared evenly (20 key bits: two passes of 10). The low bits
// hold the position, so equal keys stay in position order without a second array. One read
// pass counts the digits of every pass; a pass whose digit is the same for all values is
// skipped.
void radix_sort_packed(std::vector<uint64_t>* v, std::vector<uint64_t>* tmp, std::vector<int64_t>* counts, int lo,
                       int nbits) {
  constexpr int kMaxBits = 11;
  const int64_t n = static_cast<int64_t>(v->size());
  if (n < 2 || nbits == 0) return;
  const int passes = (nbits + kMaxBits - 1) / kMaxBits;
  const int bits = (nbits + passes - 1) / passes;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const int64_t buckets = int64_t{1} << bits;
  counts->assign(static_cast<size_t>(passes * buckets), 0);
  int64_t* count = counts->data();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t x = (*v)[i] >> lo;
    for (int p = 0; p < passes; ++p) ++count[p * buckets + ((x >> (p * bits)) & mask)];
  }
  tmp->resize(n);
  uint64_t* src = v->data();
  uint64_t* dst = tmp->data();
  for (int p = 0; p < passes; ++p) {
    int64_t* c = count + p * buckets;
    const int shift = lo + p * bits;
    if (c[(src[0] >> shift) & mask] == n) continue;  // one digit for all: already in order
    int64_t sum = 0;
    for (int64_t d = 0; d < buckets; ++d) {
      const int64_t t = c[d];
      c[d] = sum;
      sum += t;
    }
    for (int64_t i = 0; i < n; ++i) dst[c[(src[i] >> shift) & mask]++] = src[i];
    std::swap(src, dst);
  }
  if (src != v->data()) std::memcpy(v->data(), src, sizeof(uint64_t) * n);
}

extern const CsrKernels kCsrKernels = {&sort_runs};

}  // namespace EMBEDLAB_ISA_NS
}  // namespace embedlab

// ---- the entry points of csr.h (compiled once, in the baseline copy) ------------------------
#if EMBEDLAB_ISA_BASELINE_COPY
namespace embedlab {

EMBEDLAB_CPU_ISA_KERNELS(CsrKernels, kCsrKernels)

std::string coo_row_offsets_cpu(const int64_t* row_index, int64_t nnz, int64_t batch, int64_t* row_offsets,
                                bool* in_order, int64_t stride) {
  std::fill(row_offsets, row_offsets + batch + 1, 0);
  bool ordered = true;
  int64_t prev = 0;
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t r = row_index[i * stride];
    if (static_cast<uint64_t>(r) >= static_cast<uint64_t>(batch)) {
      return "row index " + str(r) + " at indices[" + str(i) + ", 0] is outside [0, " + str(batch) + ")";
    }
    ordered &= (r >= prev);
    prev = r;
    ++row_offsets[r + 1];
  }
  for (int64_t r = 0; r < batch; ++r) row_offsets[r + 1] += row_offsets[r];
  *in_order = ordered;
  return "";
}

std::string coo_to_csr_cpu(const int64_t* row_index, int64_t nnz, int64_t batch, int64_t* row_offsets,
                           int64_t* perm, int64_t stride) {
  bool in_order = false;
  const std::string err = coo_row_offsets_cpu(row_index, nnz, batch, row_offsets, &in_order, stride);
  if (!err.empty()) return err;
  if (in_order) {
    std::iota(perm, perm + nnz, int64_t{0});
    return "";
  }
  std::vector<int64_t> cursor(row_offsets, row_offsets + batch);
  for (int64_t i = 0; i < nnz; ++i) perm[cursor[row_index[i * stride]]++] = i;
  return "";
}

void sort_runs_cpu(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
                   std::vector<int64_t>* run_starts, ThreadPool& pool) {
  kernels().sort_runs(keys, n, key_bound, order, run_starts, pool);
}

}  // namespace embedlab
#endif  // EMBEDLAB_ISA_BASELINE_COPY
