// The memory floor under the CPU lookup benchmark (lookup_cpu.py), without TensorFlow: the
// production forward kernel (lookup_forward_cpu on the core's own thread pool) against the
// fastest plain read of the same random rows this file can do, on the same tables and batches;
// and the SGD update kernel (sparse_sgd_cpu) against a plain read-modify-write of the same rows
// (each batch's unique keys in increasing order, as the backward hands them over).
//
// The floor ("plain read"): every key's table row read whole (all its cache lines) and summed
// into registers, nothing stored, the rows prefetched `distance` keys ahead with a PREFETCHT0
// (into L1, FBGEMM's hint) or PREFETCHT2 (into L3). It does less than any
// forward (no output rows, no offsets, no checks), so no forward reading these rows can be faster;
// every distance x hint pair is timed and the fastest is the floor. A plain gather (each row
// copied into a buffer of the same size) is kept for reference only: its stores double the memory
// traffic at dims 64-128, so it is slower than the forward there and is no floor.
//
// Tables: `tables` x `rows` x `dim` float32 in one buffer, on transparent huge pages (as EmbedLab
// advises its tables; `pages`=huge) or on 4 KiB pages (`pages`=4k, what torch's allocator gives).
// Batches: 4,096 output rows per table with 1-3 keys each, uniform over the table, eight batches
// used in turn (no batch finds its rows in cache from the one before). The plain loops run on the
// calling thread plus spinning helpers (no wake-up cost); kernel and plain loops are timed in
// alternating blocks of 10 batches (helpers stopped while the kernel runs, so neither steals the
// other's cores); the median and minimum are printed. Last, the whole table buffer read
// sequentially by all threads (the machine's streaming read rate).
// Built against the core library that `make setup` compiled (-march=native lets the plain loops
// use the widest loads the machine has):
//
//   g++ -O3 -march=native -DNDEBUG -pthread -I helpers/csrc/core -o /tmp/gather_floor (continued:)
//       helpers/benchmarks/gather_floor.cc helpers/build/*/libembedlab_core.a
//   /tmp/gather_floor [rows=1000000] [tables=26] [dim=16] [threads=2] [pages=huge|4k]
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "embedding.h"
#include "sparse_optimizer.h"
#include "thread_pool.h"

namespace {

constexpr int64_t kBatch = 4096;
int g_prefetch = 16;  // keys ahead that the plain loops prefetch (set per measurement)

struct Batch {
  std::vector<std::vector<int64_t>> offsets, keys;  // per table: CSR ids
  std::vector<int64_t> flat;                        // every key, as a row of the whole buffer
  std::vector<std::vector<int64_t>> unique;         // per table: the unique keys, increasing
  std::vector<int64_t> flat_unique;                 // the same as rows of the whole buffer
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void gather(const float* table, const int64_t* rows, float* out, int64_t b, int64_t e, int64_t dim) {
  for (int64_t j = b; j < e; ++j) {
    if (j + g_prefetch < e) {
      const float* p = table + rows[j + g_prefetch] * dim;
      for (int64_t l = 0; l < (dim * 4 + 63) / 64; ++l) __builtin_prefetch(p + l * 16, 0, 1);
    }
    std::memcpy(out + j * dim, table + rows[j] * dim, dim * sizeof(float));
  }
}

// The floor: rows [b, e) read whole and summed into 16 floats of registers (the sum is returned so
// that nothing is optimised away), each row prefetched g_prefetch keys ahead with locality kHint
// (3: PREFETCHT0, 1: PREFETCHT2). Row widths that are a multiple of 16 floats (every dim timed).
typedef float V16 __attribute__((vector_size(64), aligned(4), may_alias));
template <int kHint>
float read_rows(const float* table, const int64_t* rows, int64_t b, int64_t e, int64_t dim) {
  V16 acc0{}, acc1{};
  const int64_t lines = dim / 16;
  for (int64_t j = b; j < e; ++j) {
    if (j + g_prefetch < e) {
      const float* p = table + rows[j + g_prefetch] * dim;
      for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + l * 16, 0, kHint);
    }
    const V16* r = reinterpret_cast<const V16*>(table + rows[j] * dim);
    int64_t l = 0;
    for (; l + 2 <= lines; l += 2) {
      acc0 += r[l];
      acc1 += r[l + 1];
    }
    if (l < lines) acc0 += r[l];
  }
  const V16 s = acc0 + acc1;
  float t = 0.f;
  for (int i = 0; i < 16; ++i) t += s[i];
  return t;
}

void update(float* table, const int64_t* rows, const float* grads, int64_t b, int64_t e, int64_t dim) {
  for (int64_t j = b; j < e; ++j) {
    if (j + g_prefetch < e) {
      float* p = table + rows[j + g_prefetch] * dim;
      for (int64_t l = 0; l < (dim * 4 + 63) / 64; ++l) __builtin_prefetch(p + l * 16, 1, 1);
    }
    float* w = table + rows[j] * dim;
    const float* g = grads + j * dim;
    for (int64_t d = 0; d < dim; ++d) w[d] -= g[d] * 0.01f;
  }
}

// Sums [p, p + n) as 64-bit integers (vectorised; integer sums need no reassociation licence), so
// the loop does nothing but stream the bytes in.
uint64_t stream_read(const uint64_t* p, size_t n) {
  uint64_t acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
  for (; i < n; ++i) acc[0] += p[i];
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

void report(const char* what, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  std::printf("%-44s median %.2f ms, min %.2f ms\n", what, ms[ms.size() / 2], ms.front());
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const int64_t tables = argc > 2 ? std::atoll(argv[2]) : 26;
  const int64_t dim = argc > 3 ? std::atoll(argv[3]) : 16;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const std::string pages = argc > 5 ? argv[5] : "huge";
  if (rows < 1 || tables < 1 || dim < 1 || dim % 16 != 0 || threads < 1 || (pages != "huge" && pages != "4k")) {
    std::fprintf(stderr, "usage: %s [rows] [tables] [dim, a multiple of 16] [threads] [pages: huge | 4k]\n", argv[0]);
    return 2;
  }
  const size_t huge = size_t{2} << 20;
  const size_t bytes = ((static_cast<size_t>(rows * tables * dim) * sizeof(float) + huge - 1) / huge) * huge;
  float* table = static_cast<float*>(std::aligned_alloc(huge, bytes));
  if (table == nullptr) {
    std::fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
    return 1;
  }
  madvise(table, bytes, pages == "huge" ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(table, 0, bytes);  // touch every page before timing

  std::mt19937_64 rng(1);
  std::vector<Batch> batches(8);
  int64_t keys_per_batch = 0;
  for (Batch& b : batches) {
    b.offsets.resize(tables);
    b.keys.resize(tables);
    b.flat.clear();
    for (int64_t t = 0; t < tables; ++t) {
      b.offsets[t].assign(1, 0);
      for (int64_t r = 0; r < kBatch; ++r) {
        const int c = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < c; ++i) {
          const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(rows));
          b.keys[t].push_back(k);
          b.flat.push_back(t * rows + k);
        }
        b.offsets[t].push_back(static_cast<int64_t>(b.keys[t].size()));
      }
    }
    keys_per_batch = static_cast<int64_t>(b.flat.size());
    b.unique = b.keys;
    for (int64_t t = 0; t < tables; ++t) {
      std::vector<int64_t>& u = b.unique[t];
      std::sort(u.begin(), u.end());
      u.erase(std::unique(u.begin(), u.end()), u.end());
      for (int64_t k : u) b.flat_unique.push_back(t * rows + k);
    }
  }
  std::printf("%lld tables x %lld rows x %lld floats (%.2f GiB, %s pages), batch %lld, ~%lld keys per batch, "
              "%d threads\n", static_cast<long long>(tables), static_cast<long long>(rows),
              static_cast<long long>(dim), bytes / double(1 << 30), pages == "huge" ? "2 MiB huge" : "4 KiB",
              static_cast<long long>(kBatch), static_cast<long long>(keys_per_batch), threads);

  std::vector<float> out(static_cast<size_t>(tables * kBatch * dim));
  std::vector<float> gathered(static_cast<size_t>(keys_per_batch + tables * kBatch * 3) * dim);
  std::vector<float> grads(gathered.size());
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(rng() % 1000) * 1e-6f;
  auto pool = embedlab::make_thread_pool(threads);
  int next = 0;

  // Times kernel(batch) for 10 batches (after one untimed), then plain(batch, part) on the calling
  // thread plus threads - 1 spinning helpers for 10 batches, 8 times in turn (helpers stopped
  // while the kernel runs, so neither steals the other's cores).
  auto compare = [&](auto kernel, auto plain, std::vector<double>* kernel_ms, std::vector<double>* plain_ms) {
    for (int block = 0; block < 8; ++block) {
      for (int i = 0; i <= 10; ++i) {
        const Batch& b = batches[next++ % batches.size()];
        const auto t0 = std::chrono::steady_clock::now();
        kernel(b);
        if (i > 0) kernel_ms->push_back(ms_since(t0));
      }
      std::atomic<int> generation{0}, done{0};
      std::atomic<bool> stop{false};
      std::atomic<const Batch*> current{nullptr};
      std::vector<std::thread> helpers;
      for (int p = 1; p < threads; ++p) {
        helpers.emplace_back([&, p] {
          int seen = 0;
          for (;;) {
            while (generation.load() == seen && !stop.load()) {
            }
            if (stop.load()) return;
            seen = generation.load();
            plain(current.load(), p);
            done.fetch_add(1);
          }
        });
      }
      for (int i = 0; i <= 10; ++i) {
        const Batch& b = batches[next++ % batches.size()];
        const auto t0 = std::chrono::steady_clock::now();
        current.store(&b);
        done.store(0);
        generation.fetch_add(1);
        plain(&b, 0);
        while (done.load() < threads - 1) {
        }
        if (i > 0) plain_ms->push_back(ms_since(t0));
      }
      stop.store(true);
      for (auto& h : helpers) h.join();
    }
  };

  std::vector<double> kernel_ms, gather_ms, sgd_ms, rmw_ms;
  auto forward = [&](const Batch& b) {
    std::vector<embedlab::LookupArgs> args(tables);
    for (int64_t t = 0; t < tables; ++t) {
      embedlab::LookupArgs& a = args[t];
      a.table = table + t * rows * dim;
      a.num_rows = rows;
      a.dim = dim;
      a.ids.row_offsets = b.offsets[t].data();
      a.ids.keys = b.keys[t].data();
      a.ids.batch = kBatch;
      a.ids.nnz = static_cast<int64_t>(b.keys[t].size());
      a.out = out.data() + t * kBatch * dim;
    }
    if (embedlab::lookup_forward_cpu(args.data(), static_cast<int>(tables), *pool) >= 0) std::abort();
  };
  // The floor's candidates: every prefetch distance x hint, each timed against the kernel.
  struct Read {
    int distance, hint;
    std::vector<double> ms;
  };
  std::vector<Read> reads;
  for (int distance : {4, 8, 16, 32, 64})
    for (int hint : {3, 1}) reads.push_back({distance, hint, {}});
  std::vector<float> read_sums(threads);
  for (Read& r : reads) {
    compare(forward,
            [&](const Batch* b, int p) {
              g_prefetch = r.distance;
              const int64_t n = static_cast<int64_t>(b->flat.size());
              const int64_t jb = n * p / threads, je = n * (p + 1) / threads;
              read_sums[p] += r.hint == 3 ? read_rows<3>(table, b->flat.data(), jb, je, dim)
                                          : read_rows<1>(table, b->flat.data(), jb, je, dim);
            },
            &kernel_ms, &r.ms);
  }
  g_prefetch = 16;
  compare(forward,
          [&](const Batch* b, int p) {
            const int64_t n = static_cast<int64_t>(b->flat.size());
            gather(table, b->flat.data(), gathered.data(), n * p / threads, n * (p + 1) / threads, dim);
          },
          &kernel_ms, &gather_ms);
  compare(
      [&](const Batch& b) {
        std::vector<embedlab::SparseUpdateArgs> args(tables);
        int64_t first = 0;
        for (int64_t t = 0; t < tables; ++t) {
          embedlab::SparseUpdateArgs& a = args[t];
          a.table = table + t * rows * dim;
          a.num_rows = rows;
          a.dim = dim;
          a.indices = b.unique[t].data();
          a.n = static_cast<int64_t>(b.unique[t].size());
          a.grads = grads.data() + first * dim;
          first += a.n;
        }
        embedlab::sparse_sgd_cpu(args.data(), static_cast<int>(tables), embedlab::SgdParams{0.01f}, *pool);
      },
      [&](const Batch* b, int p) {
        const int64_t n = static_cast<int64_t>(b->flat_unique.size());
        update(table, b->flat_unique.data(), grads.data(), n * p / threads, n * (p + 1) / threads, dim);
      },
      &sgd_ms, &rmw_ms);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const Read* best = &reads[0];
  for (const Read& r : reads) {
    char what[64];
    std::snprintf(what, sizeof what, "plain read, prefetch %2d keys ahead, %s:", r.distance,
                  r.hint == 3 ? "T0" : "T2");
    report(what, r.ms);
    if (median(r.ms) < median(best->ms)) best = &r;
  }
  std::printf("(read sums %g: keeps the reads)\n", static_cast<double>(read_sums[0]));
  report("lookup_forward_cpu (sum, core thread pool):", kernel_ms);
  report("plain gather, copies each row (old floor):", gather_ms);
  report("sparse_sgd_cpu (unique keys, core pool):", sgd_ms);
  report("plain read-modify-write of those rows:", rmw_ms);
  std::printf("floor: the plain read at %d keys ahead, %s, median %.2f ms; the forward runs at %.0f %% of it "
              "(floor / forward, medians)\n",
              best->distance, best->hint == 3 ? "T0" : "T2", median(best->ms),
              100.0 * median(best->ms) / median(kernel_ms));

  // Streaming read of the whole buffer, split over `threads` threads, 8 times: median GB/s.
  std::vector<double> stream_ms;
  std::vector<uint64_t> sums(threads);
  const size_t words = bytes / sizeof(uint64_t);
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> readers;
    auto part = [&](int p) {
      const size_t b = words * p / threads, e = words * (p + 1) / threads;
      sums[p] = stream_read(reinterpret_cast<const uint64_t*>(table) + b, e - b);
    };
    for (int p = 1; p < threads; ++p) readers.emplace_back(part, p);
    part(0);
    for (auto& r : readers) r.join();
    stream_ms.push_back(ms_since(t0));
  }
  std::sort(stream_ms.begin(), stream_ms.end());
  const double median_gbps = bytes / stream_ms[stream_ms.size() / 2] / 1e6, best_gbps = bytes / stream_ms[0] / 1e6;
  const double row_mb = keys_per_batch * dim * sizeof(float) / 1e6;
  std::printf("streaming read of the whole buffer (checksum %llu): median %.1f GB/s, best %.1f GB/s\n",
              static_cast<unsigned long long>(sums[0] % 10), median_gbps, best_gbps);
  std::printf("one batch's rows (%.1f MB) read at the best rate:  %.2f ms (a bound under any forward)\n", row_mb,
              row_mb / best_gbps);
  std::free(table);
  return 0;
}
