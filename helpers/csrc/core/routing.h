// Routing of embedding keys to the workers that own them (SparseOperationKit's exchange).
// Plain data only: raw pointers, sizes, a ThreadPool (CPU) or a cudaStream_t (CUDA).
//
// T tables' keys arrive concatenated: keys[table_offsets[t] .. table_offsets[t+1]) belong to
// table t. Each table has an owner rule (RouteMode):
//   kDistributed   key k lives on worker k % n as local row k / n     (0 <= k < rows)
//   kLocalized     the whole table lives on worker `rank`, local row k (0 <= k < rows; any
//                  key but -1 when rows < 0: a localized hash table)
//   kHashed        any int64 key, worker floormod(k, n), sent as the key itself (dynamic tables)
// Key -1 is padding: it goes nowhere and its inverse is -1. Any other key outside the rule's
// range is "bad": the first one in input order is reported and nothing else is meaningful.
//
// Buckets are (owner, table) pairs. Routing is two calls:
//   route_count   counts[o * T + t] = keys of table t owned by worker o, and the first bad key
//   route_scatter writes the local rows (or keys, kHashed) into send[], owner after owner,
//                 table after table within an owner, input order within a bucket (stable, so
//                 the result does not depend on threads), and inverse[i] = the position in
//                 send[] of input key i (-1 for padding).
// Owner o's keys start at o * stride in send[] (the padded [n, stride] layout an all-to-all
// needs; unused slots get -1), or right after owner o-1's with stride = 0 (compact).
// The inverse is what brings the rows that come back into input order again.
#pragma once

#include <cstdint>
#include <string>

#include "thread_pool.h"

namespace embedlab {

enum class RouteMode : int32_t { kDistributed = 0, kLocalized = 1, kHashed = 2 };

struct RouteTable {
  RouteMode mode = RouteMode::kDistributed;
  int64_t rows = 0;   // global rows (kDistributed, kLocalized; < 0: any key for kLocalized); unused for kHashed
  int32_t rank = 0;   // owner (kLocalized)
};

struct RouteArgs {
  const int64_t* keys = nullptr;           // [nnz]
  const int64_t* table_offsets = nullptr;  // [num_tables + 1] (host memory, also for CUDA): 0, ..., nnz
  const RouteTable* tables = nullptr;      // [num_tables] (host memory, also for CUDA)
  int32_t num_tables = 0;
  int32_t num_workers = 1;
  int64_t nnz = 0;
  int64_t* counts = nullptr;   // [num_workers * num_tables]: written by route_count, read by route_scatter
};

// The first bad key, if any.
struct RouteStatus {
  int64_t total = 0;        // non-padding keys
  int64_t max_per_owner = 0;  // max over owners of their keys: the smallest valid stride
  int64_t bad_index = -1;   // position in keys of the first bad key, -1 when all are valid
  int32_t bad_table = -1;
  int64_t bad_key = 0;
  int32_t error = 0;        // CUDA scatter: a RouteError (the outputs were left untouched unless kRouteOk)
};

// Owner and local row of one key (the reference rule; kernels inline the same arithmetic).
// Returns false for a bad key. Padding (-1) must be handled by the caller.
inline bool route_one(const RouteTable& t, int32_t n, int64_t key, int32_t* owner, int64_t* local) {
  switch (t.mode) {
    case RouteMode::kDistributed:
      if (key < 0 || key >= t.rows) return false;
      *owner = static_cast<int32_t>(key % n);
      *local = key / n;
      return true;
    case RouteMode::kLocalized:
      if (t.rows >= 0 && (key < 0 || key >= t.rows)) return false;
      *owner = t.rank;
      *local = key;
      return true;
    case RouteMode::kHashed: {
      int64_t m = key % n;
      *owner = static_cast<int32_t>(m < 0 ? m + n : m);
      *local = key;
      return true;
    }
  }
  return false;
}

// Validates the arguments that do not depend on key values ("" when fine).
std::string check_route_args(const RouteArgs& a);

// Multi-threaded CPU routing. route_count fills a.counts (nothing else is meaningful when a
// bad key is reported). route_scatter needs a.counts from route_count and the same keys;
// send has num_workers * stride entries (stride > 0) or total entries (stride == 0); stride
// must be >= max_per_owner. Both are two-pass over blocks of keys (count, scan, write).
RouteStatus route_count_cpu(const RouteArgs& a, ThreadPool* pool);
void route_scatter_cpu(const RouteArgs& a, int64_t stride, int64_t* send, int64_t* inverse, ThreadPool* pool);

#ifdef EMBEDLAB_WITH_CUDA
// CUDA routing on `stream` (a cudaStream_t): keys, counts, send, inverse and status are device
// pointers; `tables` and `table_offsets` stay on the host. Same results, bit for bit, as the
// CPU version. Neither call synchronizes, except route_count_cuda (which reads the status back
// once). Scratch: route_cuda_workspace_size(a) bytes in `workspace` (it depends on the sizes
// and the table offsets only). Up to kRouteFastTables tables and kRouteFastWorkers workers take
// the fast path (warp chunks, a stable counting sort, nothing copied from the host); others a
// stable radix sort of bucket ids.
//
// Status words (device int64[kRouteStatusWords]): total, max_per_owner, bad_index (-1: none),
// bad_table, bad_key, error (a RouteError). Both calls write them on the device.
//
// route_scatter_cuda counts the keys again itself (and writes those counts to a.counts), so it
// does not depend on what a.counts holds; before writing anything it checks on the device that
// the outputs can hold the keys: stride >= the busiest owner's count (stride > 0), or send_len
// >= the routed keys (stride == 0, compact; entries past them are left untouched), and that no
// key is bad. If not, it writes nothing to send and inverse and reports the error in status.
constexpr int kRouteStatusWords = 6;
constexpr int32_t kRouteFastTables = 64;
constexpr int32_t kRouteFastWorkers = 1024;
enum RouteError : int32_t { kRouteOk = 0, kRouteStrideTooSmall = 1, kRouteSendTooShort = 2, kRouteBadKey = 3 };

size_t route_cuda_workspace_size(const RouteArgs& a);
void route_count_cuda_async(const RouteArgs& a, int64_t* status, void* workspace, size_t workspace_bytes,
                            void* stream);
RouteStatus route_count_cuda(const RouteArgs& a, void* workspace, size_t workspace_bytes, void* stream);
void route_scatter_cuda(const RouteArgs& a, int64_t stride, int64_t* send, int64_t send_len, int64_t* inverse,
                        int64_t* status, void* workspace, size_t workspace_bytes, void* stream);
// Reads status words back (one stream synchronization).
RouteStatus read_route_status(const int64_t* status, void* stream);
#endif

}  // namespace embedlab
