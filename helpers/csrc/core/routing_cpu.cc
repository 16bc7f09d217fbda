// CPU routing of keys to their owners (see routing.h). Keys are cut into blocks that never
// span tables. route_count: per block, count the keys of each owner and find the first bad
// key. route_scatter: the same counts again, an exclusive scan in (owner, table, block) order,
// then each block writes its keys at its own offsets. Blocks are contiguous ranges in input
// order, so the output is stable and identical for any thread count.
#include <algorithm>
#include <vector>

#include "routing.h"

namespace embedlab {

std::string check_route_args(const RouteArgs& a) {
  if (a.num_workers < 1) return "num_workers must be >= 1, got " + std::to_string(a.num_workers);
  if (a.num_tables < 1) return "num_tables must be >= 1, got " + std::to_string(a.num_tables);
  if (a.nnz < 0) return "nnz must be >= 0";
  if (a.table_offsets[0] != 0) return "table_offsets[0] must be 0";
  for (int32_t t = 0; t < a.num_tables; ++t)
    if (a.table_offsets[t + 1] < a.table_offsets[t])
      return "table_offsets must be non-decreasing (table " + std::to_string(t) + ")";
  if (a.table_offsets[a.num_tables] != a.nnz)
    return "table_offsets ends at " + std::to_string(a.table_offsets[a.num_tables]) + " but there are " +
           std::to_string(a.nnz) + " keys";
  for (int32_t t = 0; t < a.num_tables; ++t) {
    const RouteTable& rt = a.tables[t];
    if (rt.mode == RouteMode::kLocalized && (rt.rank < 0 || rt.rank >= a.num_workers))
      return "table " + std::to_string(t) + " is localized on rank " + std::to_string(rt.rank) + " but there are " +
             std::to_string(a.num_workers) + " workers";
    if (rt.mode == RouteMode::kDistributed && rt.rows < 0)
      return "table " + std::to_string(t) + " has a negative row count";
  }
  return "";
}

namespace {

struct Blocks {
  std::vector<int64_t> begin, end;
  std::vector<int32_t> table;
  std::vector<int64_t> first;  // table t's blocks are [first[t], first[t + 1])
  int64_t size() const { return static_cast<int64_t>(begin.size()); }
};

Blocks make_blocks(const RouteArgs& a, int num_threads) {
  // ~16 blocks per thread balance skewed tables; >= 4096 keys per block keep the per-block
  // histograms (num_workers entries) small next to the keys.
  const int64_t target = std::max<int64_t>(4096, a.nnz / (16 * std::max(1, num_threads)) + 1);
  Blocks b;
  b.first.assign(a.num_tables + 1, 0);
  for (int32_t t = 0; t < a.num_tables; ++t) {
    b.first[t] = b.size();
    const int64_t s = a.table_offsets[t], e = a.table_offsets[t + 1];
    for (int64_t x = s; x < e; x += target) {
      b.begin.push_back(x);
      b.end.push_back(std::min(e, x + target));
      b.table.push_back(t);
    }
  }
  b.first[a.num_tables] = b.size();
  return b;
}

// Per-block owner histograms (hist[b * n + o]); first_bad[b] = first bad position or -1.
void count_blocks(const RouteArgs& a, const Blocks& blk, ThreadPool& p, std::vector<int64_t>* hist,
                  std::vector<int64_t>* first_bad) {
  const int32_t n = a.num_workers;
  hist->assign(static_cast<size_t>(blk.size()) * n, 0);
  first_bad->assign(blk.size(), -1);
  p.parallel_for(blk.size(), 20000, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const RouteTable& rt = a.tables[blk.table[b]];
      int64_t* h = hist->data() + b * n;
      for (int64_t i = blk.begin[b]; i < blk.end[b]; ++i) {
        const int64_t k = a.keys[i];
        if (k == -1) continue;
        int32_t o;
        int64_t lr;
        if (!route_one(rt, n, k, &o, &lr)) {
          (*first_bad)[b] = i;
          break;
        }
        ++h[o];
      }
    }
  });
}

}  // namespace

RouteStatus route_count_cpu(const RouteArgs& a, ThreadPool* pool) {
  RouteStatus st;
  const int32_t n = a.num_workers, T = a.num_tables;
  std::fill(a.counts, a.counts + static_cast<int64_t>(n) * T, 0);
  if (a.nnz == 0) return st;
  ThreadPool& p = pool ? *pool : inline_pool();
  const Blocks blk = make_blocks(a, p.num_threads());
  std::vector<int64_t> hist, first_bad;
  count_blocks(a, blk, p, &hist, &first_bad);
  for (int64_t b = 0; b < blk.size(); ++b)
    if (first_bad[b] >= 0) {
      st.bad_index = first_bad[b];
      st.bad_table = blk.table[b];
      st.bad_key = a.keys[st.bad_index];
      return st;
    }
  for (int64_t b = 0; b < blk.size(); ++b)
    for (int32_t o = 0; o < n; ++o) a.counts[static_cast<int64_t>(o) * T + blk.table[b]] += hist[b * n + o];
  for (int32_t o = 0; o < n; ++o) {
    int64_t s = 0;
    for (int32_t t = 0; t < T; ++t) s += a.counts[static_cast<int64_t>(o) * T + t];
    st.total += s;
    st.max_per_owner = std::max(st.max_per_owner, s);
  }
  return st;
}

void route_scatter_cpu(const RouteArgs& a, int64_t stride, int64_t* send, int64_t* inverse, ThreadPool* pool) {
  const int32_t n = a.num_workers, T = a.num_tables;
  ThreadPool& p = pool ? *pool : inline_pool();
  if (stride > 0) {
    const int64_t size = static_cast<int64_t>(n) * stride;
    p.parallel_for(size, 1, [&](int64_t b, int64_t e) { std::fill(send + b, send + e, int64_t{-1}); });
  }
  if (a.nnz == 0) return;
  const Blocks blk = make_blocks(a, p.num_threads());
  std::vector<int64_t> hist, first_bad;
  count_blocks(a, blk, p, &hist, &first_bad);
  // off[b * n + o]: where block b's keys for owner o start in send[].
  std::vector<int64_t> off(static_cast<size_t>(blk.size()) * n, 0);
  int64_t compact = 0;
  for (int32_t o = 0; o < n; ++o) {
    int64_t run = stride > 0 ? static_cast<int64_t>(o) * stride : compact;
    for (int32_t t = 0; t < T; ++t)
      for (int64_t b = blk.first[t]; b < blk.first[t + 1]; ++b) {
        off[b * n + o] = run;
        run += hist[b * n + o];
      }
    compact = run;
  }
  p.parallel_for(blk.size(), 30000, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> cur(n);
    for (int64_t b = b0; b < b1; ++b) {
      const RouteTable& rt = a.tables[blk.table[b]];
      std::copy(off.begin() + b * n, off.begin() + (b + 1) * n, cur.begin());
      for (int64_t i = blk.begin[b]; i < blk.end[b]; ++i) {
        const int64_t k = a.keys[i];
        int32_t o;
        int64_t lr;
        if (k == -1 || !route_one(rt, n, k, &o, &lr)) {  // bad keys were refused by route_count
          inverse[i] = -1;
          continue;
        }
        const int64_t pos = cur[o]++;
        send[pos] = lr;
        inverse[i] = pos;
      }
    }
  });
}

}  // namespace embedlab
