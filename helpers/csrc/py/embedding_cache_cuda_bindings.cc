// CudaEmbeddingCache: the HPS embedding cache in GPU memory (csrc/core/embedding_cache_cuda.cu)
// over DLPack device arrays (PyTorch, CuPy, ...). Compiled only with CUDA. Thin, like every
// binding (common.h): validate, translate, call core.
//
// Streams: every method takes `stream`, the caller's cudaStream_t as an int
// (torch.cuda.current_stream().cuda_stream, cupy.cuda.get_current_stream().ptr; 0 = the legacy
// default stream). lookup_mask() enqueues and returns (no synchronization): the hit path for
// timed loops. lookup() also compacts the miss positions and synchronizes once to learn their
// number; insert()/update()/erase()/size()/stats() synchronize to return their counts.
// Calls on one object are serialized by a lock; their work must not overlap on different
// streams (see embedding_cache.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "embedding_cache.h"
#include "embedding_cache_bindings.h"
#include "registry.h"

namespace nb = nanobind;
using namespace embedlab;
using namespace embedlab_py;

namespace {

// The module the array's type comes from: "torch", "cupy", or "" for anything else.
std::string framework_of(const nb::handle& obj) {
  nb::object mod = nb::getattr(obj.type(), "__module__", nb::none());
  if (mod.is_none()) return "";
  const std::string m = nb::cast<std::string>(mod);
  if (m.rfind("torch", 0) == 0) return "torch";
  if (m.rfind("cupy", 0) == 0) return "cupy";
  return "";
}

class PyCudaEmbeddingCache {
 public:
  PyCudaEmbeddingCache(int64_t capacity, int64_t dim, int ways, bool is_static, int device) {
    const char* fn = "CudaEmbeddingCache";
    check_cache_args(fn, capacity, dim, ways);
    const int n = require_gpu(fn);
    if (device < -1 || device >= n)
      fail(fn, "device must be -1 (current) or in [0, " + std::to_string(n) + "), got " + std::to_string(device));
    if (device >= 0) cuda_check(fn, cudaSetDevice(device), "cudaSetDevice");
    cudaError_t err = cudaSuccess;
    {
      nb::gil_scoped_release r;
      cache_ = std::make_unique<EmbeddingCacheCuda>(capacity, dim, ways, is_static, &err);
    }
    cuda_check(fn, err, "allocating the cache");
  }

  // Checks the arrays and makes the cache's device current.
  void prepare(const std::string& fn, const Arr& keys, const Arr* rows, const char* rows_name) {
    if (rows) expect_keys_rows(fn, keys, rows_name, *rows, cache_->dim(), true);
    else expect<int64_t>(fn, "keys", keys, 1, true);
    if (keys.device_id() != cache_->device() || (rows && rows->device_id() != cache_->device()))
      fail(fn, "arrays must be on the cache's device " + std::to_string(cache_->device()) + ", got device " +
                   std::to_string(keys.device_id()));
    make_current(fn);
  }

  // cudaSetDevice only when needed (keeps the hit path free of runtime calls under graph capture).
  void make_current(const std::string& fn) {
    int cur = -1;
    cuda_check(fn, cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != cache_->device()) cuda_check(fn, cudaSetDevice(cache_->device()), "cudaSetDevice");
  }

  void lookup_mask(const Arr& keys, const Arr& out, const std::optional<Arr>& hit_mask, uintptr_t stream) {
    const std::string fn = "CudaEmbeddingCache.lookup_mask";
    prepare(fn, keys, &out, "out");
    uint8_t* mask = nullptr;
    if (hit_mask) {
      expect<uint8_t>(fn, "hit_mask", *hit_mask, 1, true);
      if (hit_mask->shape(0) != keys.shape(0))
        fail(fn, "hit_mask must have shape (" + std::to_string(keys.shape(0)) + ",), got " + shape_str(*hit_mask));
      mask = static_cast<uint8_t*>(hit_mask->data());
    }
    std::lock_guard<std::mutex> l(mu_);
    cuda_check(fn,
               cache_->lookup_mask(static_cast<const int64_t*>(keys.data()), static_cast<int64_t>(keys.shape(0)),
                                   static_cast<float*>(out.data()), mask, as_stream(stream)),
               "lookup kernel");
  }

  nb::object lookup(nb::handle keys_obj, const Arr& out, uintptr_t stream, nb::handle missing_obj) {
    const std::string fn = "CudaEmbeddingCache.lookup";
    Arr keys;
    if (!nb::try_cast(keys_obj, keys)) fail(fn, "keys must be a CUDA device array (a torch.cuda tensor or a CuPy array)");
    prepare(fn, keys, &out, "out");
    const int64_t n = static_cast<int64_t>(keys.shape(0));
    int64_t* given = nullptr;
    if (!missing_obj.is_none()) {
      Arr mis;
      if (!nb::try_cast(missing_obj, mis)) fail(fn, "missing must be a CUDA device array of int64");
      expect<int64_t>(fn, "missing", mis, 1, true);
      if (static_cast<int64_t>(mis.shape(0)) < n)
        fail(fn, "missing must have room for every key: at least " + std::to_string(n) + " entries, got " +
                     std::to_string(mis.shape(0)));
      if (mis.device_id() != cache_->device())
        fail(fn, "arrays must be on the cache's device " + std::to_string(cache_->device()) + ", got device " +
                     std::to_string(mis.device_id()));
      given = static_cast<int64_t*>(mis.data());
    }
    const cudaStream_t s = as_stream(stream);
    const size_t ws_bytes = EmbeddingCacheCuda::lookup_workspace_bytes(n);
    int64_t* missing = given;
    int64_t m = 0;
    cudaError_t e = cudaSuccess;
    {
      nb::gil_scoped_release r;
      std::lock_guard<std::mutex> l(mu_);
      if (!missing)
        e = cudaMalloc(reinterpret_cast<void**>(&missing), sizeof(int64_t) * static_cast<size_t>(std::max<int64_t>(n, 1)));
      // lookup() synchronizes its stream before returning, so the object's scratch is free again
      // for the next call (on any stream); it grows once to the largest batch seen.
      if (e == cudaSuccess && ws_bytes > ws_bytes_) {
        if (ws_) cudaFree(ws_);
        ws_ = nullptr;
        ws_bytes_ = 0;
        e = cudaMalloc(&ws_, ws_bytes);
        if (e == cudaSuccess) ws_bytes_ = ws_bytes;
      }
      if (e == cudaSuccess)
        e = cache_->lookup(static_cast<const int64_t*>(keys.data()), n, static_cast<float*>(out.data()), missing, &m,
                           ws_, ws_bytes_, s);
    }
    if (e != cudaSuccess) {
      if (!given) cudaFree(missing);
      cuda_check(fn, e, "lookup");
    }
    if (given) return missing_obj[nb::slice(nb::none(), nb::int_(m), nb::none())];  // a view of the caller's array
    // The miss positions, as an array of the keys' framework (a DLPack capsule for others).
    nb::capsule owner(missing, [](void* p) noexcept { cudaFree(p); });
    const size_t shape[1] = {static_cast<size_t>(m)};
    const int dev = cache_->device();
    const std::string fw = framework_of(keys_obj);
    if (fw == "torch")
      return nb::cast(nb::ndarray<nb::pytorch, int64_t>(missing, 1, shape, owner, nullptr, nb::dtype<int64_t>(),
                                                        nb::device::cuda::value, dev));
    if (fw == "cupy")
      return nb::cast(nb::ndarray<nb::cupy, int64_t>(missing, 1, shape, owner, nullptr, nb::dtype<int64_t>(),
                                                     nb::device::cuda::value, dev));
    return nb::cast(
        nb::ndarray<int64_t>(missing, 1, shape, owner, nullptr, nb::dtype<int64_t>(), nb::device::cuda::value, dev));
  }

  // sync = false: enqueue only (no synchronization, no count: returns -1); the caller orders
  // later work on the cache after it with an event.
  int64_t write(const char* name, int mode, const Arr& keys, const Arr* values, uintptr_t stream, bool sync = true) {
    const std::string fn = std::string("CudaEmbeddingCache.") + name;
    prepare(fn, keys, values, "values");
    if (mode != 0 && cache_->is_static())
      fail(fn, "this cache is static (read-only once filled); use a dynamic cache to " + std::string(name) + " rows");
    const int64_t n = static_cast<int64_t>(keys.shape(0));
    const int64_t* k = static_cast<const int64_t*>(keys.data());
    const float* v = values ? static_cast<const float*>(values->data()) : nullptr;
    int64_t count = 0;
    cudaError_t e;
    {
      nb::gil_scoped_release r;
      std::lock_guard<std::mutex> l(mu_);
      int64_t* cnt = sync ? &count : nullptr;
      if (mode == 0) e = cache_->insert(k, v, n, cnt, as_stream(stream));
      else if (mode == 1) e = cache_->update(k, v, n, cnt, as_stream(stream));
      else e = cache_->erase(k, n, cnt, as_stream(stream));
    }
    cuda_check(fn, e, name);
    return sync ? count : -1;
  }

  int64_t size(uintptr_t stream) {
    int64_t s = 0;
    cudaError_t e;
    {
      nb::gil_scoped_release r;
      std::lock_guard<std::mutex> l(mu_);
      e = cudaSetDevice(cache_->device());
      if (e == cudaSuccess) e = cache_->size(&s, as_stream(stream));
    }
    cuda_check("CudaEmbeddingCache.size", e, "size");
    return s;
  }

  void clear(uintptr_t stream) {
    std::lock_guard<std::mutex> l(mu_);
    make_current("CudaEmbeddingCache.clear");
    cuda_check("CudaEmbeddingCache.clear", cache_->clear(as_stream(stream)), "clear");
  }

  void advance_epoch(uintptr_t stream) {
    std::lock_guard<std::mutex> l(mu_);
    make_current("CudaEmbeddingCache.advance_epoch");
    cuda_check("CudaEmbeddingCache.advance_epoch", cache_->advance_epoch(as_stream(stream)), "advance_epoch");
  }

  nb::dict stats(uintptr_t stream) {
    EmbeddingCacheStats s;
    {
      std::lock_guard<std::mutex> l(mu_);
      make_current("CudaEmbeddingCache.stats");
      cuda_check("CudaEmbeddingCache.stats", cache_->stats(&s, as_stream(stream)), "reading the counters");
    }
    return cache_stats_dict(s, size(stream), cache_->capacity());
  }

  const EmbeddingCacheCuda& core() const { return *cache_; }
  EmbeddingCacheCuda& core() { return *cache_; }
  std::mutex& mutex() { return mu_; }

 private:
  std::unique_ptr<EmbeddingCacheCuda> cache_;
  std::mutex mu_;
  void* ws_ = nullptr;  // lookup()'s scratch (flags, count, the compaction's temporary storage)
  size_t ws_bytes_ = 0;

 public:
  ~PyCudaEmbeddingCache() {
    if (ws_) cudaFree(ws_);
  }
};

// The lookups of several caches of one device as one request (EmbeddingCacheCudaMultiLookup):
// a constant number of CUDA operations whatever the number of tables (one lookup kernel per group
// of caches sharing a kernel variant, one miss compaction, one split into per-table positions,
// one copy of the counts), then one synchronization. The core object owns the descriptors,
// the workspace and the page-locked counts (grown to the largest request seen); one thread uses
// it at a time (a lock serializes calls).
class PyCudaCacheLookup {
 public:
  explicit PyCudaCacheLookup(int device) {
    const char* fn = "CudaCacheLookup";
    const int n = require_gpu(fn);
    if (device < 0 || device >= n)
      fail(fn, "device must be in [0, " + std::to_string(n) + "), got " + std::to_string(device));
    device_ = device;
  }

  // One array each for every table's keys, rows and miss positions (three DLPack imports per
  // request, not two per table: an import costs microseconds in the frameworks).
  std::vector<int64_t> lookup(nb::list caches, const Arr& keys, const std::vector<int64_t>& sizes, const Arr& out,
                              const std::vector<int64_t>& out_offsets, const Arr& missing, uintptr_t stream) {
    const std::string fn = "CudaCacheLookup.lookup";
    const size_t t = nb::len(caches);
    if (sizes.size() != t || out_offsets.size() != t)
      fail(fn, "caches, sizes and out_offsets must have one entry per table, got " + std::to_string(t) + ", " +
                   std::to_string(sizes.size()) + " and " + std::to_string(out_offsets.size()));
    expect<int64_t>(fn, "keys", keys, 1, true);
    expect<float>(fn, "out", out, 1, true);
    expect<int64_t>(fn, "missing", missing, 1, true);
    if (keys.device_id() != device_ || out.device_id() != device_ || missing.device_id() != device_)
      fail(fn, "keys, out and missing must be on device " + std::to_string(device_) + ", got devices " +
                   std::to_string(keys.device_id()) + ", " + std::to_string(out.device_id()) + " and " +
                   std::to_string(missing.device_id()));
    std::vector<PyCudaEmbeddingCache*> cs(t);
    int64_t total = 0, out_end = 0;
    const int64_t out_len = static_cast<int64_t>(out.shape(0));
    for (size_t i = 0; i < t; ++i) {
      const std::string at = "[" + std::to_string(i) + "]";
      if (!nb::try_cast(caches[i], cs[i])) fail(fn, "caches" + at + " must be a CudaEmbeddingCache");
      if (cs[i]->core().device() != device_)
        fail(fn, "caches" + at + " is on device " + std::to_string(cs[i]->core().device()) + ", this lookup's device is " +
                     std::to_string(device_));
      const int64_t n = sizes[i];
      if (n < 0) fail(fn, "sizes" + at + " must be >= 0, got " + std::to_string(n));
      const int64_t o = out_offsets[i];
      if (o < out_end || o > out_len || n * cs[i]->core().dim() > out_len - o)
        fail(fn, "out_offsets" + at + " = " + std::to_string(o) + " must be at least " + std::to_string(out_end) +
                     " (the end of the previous table's rows) and leave room for " + std::to_string(n) + " x " +
                     std::to_string(cs[i]->core().dim()) + " floats in out of " + std::to_string(out_len));
      out_end = o + n * cs[i]->core().dim();
      total += n;
    }
    if (static_cast<int64_t>(keys.shape(0)) != total)
      fail(fn, "keys must hold sum(sizes) = " + std::to_string(total) + " keys, got " + std::to_string(keys.shape(0)));
    if (static_cast<int64_t>(missing.shape(0)) < total)
      fail(fn, "missing must have room for every key of every table: at least " + std::to_string(total) +
                   " entries, got " + std::to_string(missing.shape(0)));
    std::vector<int64_t> counts(t, 0);
    const cudaStream_t s = as_stream(stream);
    std::vector<EmbeddingCacheCuda*> cores(t);
    for (size_t i = 0; i < t; ++i) cores[i] = &cs[i]->core();
    // Every cache's lock, taken in address order (a cache listed twice once), held while the
    // lookups are enqueued, as one lookup() holds its own.
    std::vector<PyCudaEmbeddingCache*> locked(cs);
    std::sort(locked.begin(), locked.end());
    locked.erase(std::unique(locked.begin(), locked.end()), locked.end());
    cudaError_t e = cudaSuccess;
    const char* what = "lookup";
    {
      nb::gil_scoped_release r;
      std::lock_guard<std::mutex> l(mu_);
      int cur = -1;
      e = cudaGetDevice(&cur);
      if (e == cudaSuccess && cur != device_) e = cudaSetDevice(device_);
      if (e == cudaSuccess) {
        std::vector<std::unique_lock<std::mutex>> held;
        held.reserve(locked.size());
        for (PyCudaEmbeddingCache* c : locked) held.emplace_back(c->mutex());
        e = many_.enqueue(cores.data(), sizes.data(), out_offsets.data(), static_cast<int64_t>(t),
                          static_cast<const int64_t*>(keys.data()), static_cast<float*>(out.data()),
                          static_cast<int64_t*>(missing.data()), s);
      }
      // One synchronization for every table (also after an error, so that no enqueued work
      // still uses the buffers).
      if (total > 0) {
        const cudaError_t se = cudaStreamSynchronize(s);
        if (e == cudaSuccess) {
          e = se;
          what = "synchronizing the stream";
        }
      }
      if (e == cudaSuccess)
        for (size_t i = 0; i < t; ++i) counts[i] = many_.counts()[i];
    }
    cuda_check(fn, e, what);
    return counts;
  }

  int device() const { return device_; }

 private:
  int device_ = 0;
  std::mutex mu_;
  EmbeddingCacheCudaMultiLookup many_;
};

}  // namespace

EMBEDLAB_PY_BINDINGS(embedding_cache_cuda) {
  nb::class_<PyCudaEmbeddingCache>(
      m, "CudaEmbeddingCache",
      "The HPS embedding cache in GPU memory: EmbeddingCache's layout, eviction and results, over\n"
      "CUDA arrays (torch.cuda tensors, CuPy arrays: int64 keys, float32 rows). Every method takes\n"
      "`stream` (the caller's cudaStream_t as an int; 0 = legacy default stream). lookup_mask() is\n"
      "the asynchronous hit path; lookup(), insert(), update(), erase(), size() synchronize once.\n"
      "For a key repeated in one insert, one of its values wins (the CPU cache: the last).")
      .def(nb::init<int64_t, int64_t, int, bool, int>(), nb::arg("capacity"), nb::arg("dim"), nb::arg("ways") = 8,
           nb::arg("static") = false, nb::arg("device") = -1)
      .def("lookup", &PyCudaEmbeddingCache::lookup, nb::arg("keys"), nb::arg("out"), nb::arg("stream") = 0,
           nb::arg("missing").none() = nb::none(),
           "Copies the cached rows of keys into out (float32[n, dim]); returns the miss positions\n"
           "(int64[m], ascending, on the device). Synchronizes once. missing=None allocates them (cudaMalloc,\n"
           "which also synchronizes the device) in the keys' framework; a given int64 device array of at\n"
           "least n entries receives them instead and missing[:m] is returned.")
      .def("lookup_mask", &PyCudaEmbeddingCache::lookup_mask, nb::arg("keys"), nb::arg("out"),
           nb::arg("hit_mask").none() = nb::none(), nb::arg("stream") = 0,
           "The hit path without synchronization: hit rows copied into out, hit_mask[i] (uint8, optional)\n"
           "set to 1 for a hit and 0 for a miss; miss rows untouched.")
      .def("insert",
           [](PyCudaEmbeddingCache& c, const Arr& k, const Arr& v, uintptr_t s, bool sync) {
             return c.write("insert", 0, k, &v, s, sync);
           },
           nb::arg("keys"), nb::arg("values"), nb::arg("stream") = 0, nb::arg("sync") = true,
           "Returns the number of positions stored. sync=False only enqueues the insert on `stream`\n"
           "(no synchronization) and returns -1: order later calls after it with an event, and keep\n"
           "keys and values alive until it has run.")
      .def("update",
           [](PyCudaEmbeddingCache& c, const Arr& k, const Arr& v, uintptr_t s, bool sync) {
             return c.write("update", 1, k, &v, s, sync);
           },
           nb::arg("keys"), nb::arg("values"), nb::arg("stream") = 0, nb::arg("sync") = true,
           "Overwrites present keys only; returns how many positions were present (-1 with sync=False,\n"
           "which only enqueues, as insert's).")
      .def("erase", [](PyCudaEmbeddingCache& c, const Arr& k, uintptr_t s) { return c.write("erase", 2, k, nullptr, s); },
           nb::arg("keys"), nb::arg("stream") = 0, "Removes present keys; returns the number removed.")
      .def("clear", &PyCudaEmbeddingCache::clear, nb::arg("stream") = 0)
      .def("advance_epoch", &PyCudaEmbeddingCache::advance_epoch, nb::arg("stream") = 0,
           "Advance the LRU clock as every insert() does (asynchronous, no rows change): later lookups\n"
           "stamp their hits again. Between insert() calls a hit is stamped once; this lets a benchmark\n"
           "time the hit path as it runs after each insert() of serving.")
      .def("size", &PyCudaEmbeddingCache::size, nb::arg("stream") = 0)
      .def("stats", &PyCudaEmbeddingCache::stats, nb::arg("stream") = 0)
      .def_prop_ro("capacity", [](const PyCudaEmbeddingCache& c) { return c.core().capacity(); })
      .def_prop_ro("dim", [](const PyCudaEmbeddingCache& c) { return c.core().dim(); })
      .def_prop_ro("ways", [](const PyCudaEmbeddingCache& c) { return c.core().ways(); })
      .def_prop_ro("num_sets", [](const PyCudaEmbeddingCache& c) { return c.core().num_sets(); })
      .def_prop_ro("static", [](const PyCudaEmbeddingCache& c) { return c.core().is_static(); })
      .def_prop_ro("device", [](const PyCudaEmbeddingCache& c) { return c.core().device(); });

  nb::class_<PyCudaCacheLookup>(
      m, "CudaCacheLookup",
      "The lookups of several CudaEmbeddingCache objects of one device as one request, with one host\n"
      "synchronization and a constant number of CUDA launches whatever the number of tables: one lookup\n"
      "kernel per group of caches sharing a kernel variant (dim class, static/dynamic, 16-byte alignment\n"
      "of the rows), one miss compaction over every key, one kernel splitting the misses per table, one\n"
      "copy of the counts into page-locked memory. Each cache's rows, misses, LRU stamps and stats() are\n"
      "those of its own lookup(). Holds its descriptors and workspace (grown, with a cudaMalloc, to the\n"
      "largest request seen); one thread at a time.\n\n"
      "Example:\n"
      "    >>> look = CudaCacheLookup(0)                                          # doctest: +SKIP\n"
      "    >>> counts = look.lookup([c0, c1], keys, [n0, n1], out, [0, o1], missing, stream)  # doctest: +SKIP")
      .def(nb::init<int>(), nb::arg("device"))
      .def("lookup", &PyCudaCacheLookup::lookup, nb::arg("caches"), nb::arg("keys"), nb::arg("sizes"), nb::arg("out"),
           nb::arg("out_offsets"), nb::arg("missing"), nb::arg("stream") = 0,
           "For each table i: looks up keys[k_i : k_i + sizes[i]] (k_i = sizes[0] + ... + sizes[i-1]) in\n"
           "caches[i], copies the cached rows into out[out_offsets[i] :] as float32[sizes[i], dim_i] (out: a\n"
           "1-D float32 array; offsets ascending, each table's rows after the previous one's; a multiple\n"
           "of 4 keeps the 16-byte copies) and writes the miss positions, ascending, to missing[k_i : k_i + m_i].\n"
           "Returns [m_0, m_1, ...]. Enqueues everything on `stream` and synchronizes it once (not at all when\n"
           "every size is 0).")
      .def_prop_ro("device", &PyCudaCacheLookup::device);
}
