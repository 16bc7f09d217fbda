// The embedding kernels on the GPU (csrc/core embedding, sparse_optimizer: the _cuda.cu files)
// over DLPack arrays (PyTorch, CuPy, JAX...) that live on a CUDA device. Compiled only with CUDA.
// Thin, like every binding (common.h): validate, translate, call core.
//
// Streams: every function takes `stream`, the caller's cudaStream_t as an int
// (torch.cuda.current_stream().cuda_stream, cupy.cuda.get_current_stream().ptr; 0 = the legacy
// default stream). All work is enqueued there; nothing else is synchronized, except:
//   * check=True (the default) validates keys on the device and reads a 24-byte status back:
//     one stream synchronization per table. Pass check=False in timed loops once inputs are
//     known to be valid; invalid keys then read or write out of bounds.
//   * workspace=None allocates scratch with cudaMallocAsync on the stream and frees it with
//     cudaFreeAsync (stream ordered, no sync). Pass a uint8 device array of at least
//     lookup_backward_cuda_workspace_size(...) bytes to avoid the allocator.
// Arrays must be C-contiguous with the documented dtypes and all on one device; nothing is
// copied. Errors raise ValueError naming the function and argument; CUDA failures RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "embedding.h"
#include "embedding_bindings.h"
#include "registry.h"
#include "sparse_optimizer.h"

namespace nb = nanobind;
using namespace embedlab;

namespace {

using embedlab_py::Arr;
using embedlab_py::as_stream;
using embedlab_py::combiner_of;
using embedlab_py::cuda_check;
using embedlab_py::fail;
using embedlab_py::optimizer_of;
using embedlab_py::require_gpu;
using embedlab_py::shape_str;

// Checks device (CUDA), dtype, rank and C-contiguity; returns the device id.
template <typename T>
int expect(const char* fn, const std::string& name, const Arr& a, size_t ndim) {
  return embedlab_py::expect<T>(fn, name, a, ndim, /*cuda=*/true);
}

template <typename T>
T* ptr(const Arr& a) {
  return static_cast<T*>(a.data());
}

// All arrays of one call on one device, made current for the launches.
struct DeviceGuard {
  const char* fn;
  int dev = -1;
  void add(int d) {
    if (dev < 0) dev = d;
    else if (d != dev) fail(fn, "all arrays must be on the same CUDA device (got " + std::to_string(dev) + " and " +
                                    std::to_string(d) + ")");
  }
  void activate() const {
    require_gpu(fn);
    cuda_check(fn, cudaSetDevice(dev < 0 ? 0 : dev), "cudaSetDevice");
  }
};

// Scratch memory of max(bytes, 256) bytes: the caller's uint8 array, checked here, or a
// stream-ordered allocation freed on scope exit.
class Workspace {
 public:
  Workspace(const char* fn, const std::optional<Arr>& given, size_t bytes, cudaStream_t stream, DeviceGuard& dev)
      : bytes_(std::max<size_t>(bytes, 256)), scratch_(fn, checked(fn, given, bytes_, dev), bytes_, stream) {}
  void* get() const { return scratch_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  static void* checked(const char* fn, const std::optional<Arr>& given, size_t bytes, DeviceGuard& dev) {
    if (!given) {
      dev.activate();  // the allocation goes to the arrays' device
      return nullptr;
    }
    dev.add(expect<uint8_t>(fn, "workspace", *given, 1));
    if (given->shape(0) < bytes)
      fail(fn, "workspace has " + std::to_string(given->shape(0)) + " bytes, needs " + std::to_string(bytes));
    return given->data();
  }
  size_t bytes_;
  embedlab_py::StreamScratch scratch_;
};

std::string idx(const char* name, size_t t) { return std::string(name) + "[" + std::to_string(t) + "]"; }

CsrIds csr_of(const char* fn, DeviceGuard& dev, const std::string& suffix, const Arr& offsets, const Arr& keys,
              const std::optional<Arr>& weights) {
  dev.add(expect<int64_t>(fn, "row_offsets" + suffix, offsets, 1));
  dev.add(expect<int64_t>(fn, "keys" + suffix, keys, 1));
  if (offsets.shape(0) < 1) fail(fn, "row_offsets" + suffix + " is empty; it needs batch + 1 entries");
  CsrIds ids;
  ids.row_offsets = ptr<const int64_t>(offsets);
  ids.keys = ptr<const int64_t>(keys);
  ids.batch = static_cast<int64_t>(offsets.shape(0)) - 1;
  ids.nnz = static_cast<int64_t>(keys.shape(0));
  if (weights) {
    dev.add(expect<float>(fn, "weights" + suffix, *weights, 1));
    if (weights->shape(0) != keys.shape(0))
      fail(fn, "weights" + suffix + " has " + std::to_string(weights->shape(0)) + " entries but keys" + suffix +
                   " has " + std::to_string(keys.shape(0)));
    ids.weights = ptr<const float>(*weights);
  }
  return ids;
}

// Device-side key check (synchronizes `stream`); raises ValueError with the CPU's wording.
void check_on_device(const char* fn, const std::string& what, const CsrIds& ids, int64_t num_rows, bool allow_missing,
                     void* ws, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  std::string msg;
  {
    nb::gil_scoped_release r;
    msg = check_ids_cuda(ids, num_rows, allow_missing, ws, stream, &err);
  }
  cuda_check(fn, err, "key validation");
  if (!msg.empty()) fail(fn, what + ": " + msg + "; nothing was changed");
}

void lookup_forward(const std::vector<Arr>& tables, const std::vector<Arr>& offsets, const std::vector<Arr>& keys,
                    const std::optional<std::vector<Arr>>& weights, const std::vector<std::string>& combiners,
                    const std::vector<Arr>& outs, uintptr_t stream_i, bool check) {
  const char* fn = "lookup_forward_cuda";
  const size_t n = tables.size();
  if (offsets.size() != n || keys.size() != n || combiners.size() != n || outs.size() != n ||
      (weights && weights->size() != n))
    fail(fn, "tables, row_offsets, keys, combiners, outs (and weights) must have the same length");
  DeviceGuard dev{fn};
  std::vector<LookupArgs> args(n);
  for (size_t t = 0; t < n; ++t) {
    LookupArgs& a = args[t];
    dev.add(expect<float>(fn, idx("tables", t), tables[t], 2));
    a.table = ptr<const float>(tables[t]);
    a.num_rows = static_cast<int64_t>(tables[t].shape(0));
    a.dim = static_cast<int64_t>(tables[t].shape(1));
    a.ids = csr_of(fn, dev, "[" + std::to_string(t) + "]", offsets[t], keys[t],
                   weights ? std::optional<Arr>((*weights)[t]) : std::nullopt);
    a.combiner = combiner_of(fn, combiners[t]);
    dev.add(expect<float>(fn, idx("outs", t), outs[t], 2));
    if (outs[t].shape(0) != static_cast<size_t>(a.ids.batch) || outs[t].shape(1) != static_cast<size_t>(a.dim))
      fail(fn, idx("outs", t) + " must have shape (" + std::to_string(a.ids.batch) + ", " + std::to_string(a.dim) +
                   "), got " + shape_str(outs[t]));
    a.out = ptr<float>(outs[t]);
  }
  if (n == 0) return;
  dev.activate();
  const cudaStream_t stream = as_stream(stream_i);
  if (check) {
    Workspace ws(fn, std::nullopt, check_ids_cuda_workspace(), stream, dev);
    for (size_t t = 0; t < n; ++t) check_on_device(fn, "table " + std::to_string(t), args[t].ids, args[t].num_rows, true, ws.get(), stream);
  }
  cudaError_t e;
  {
    nb::gil_scoped_release r;
    e = lookup_forward_cuda(args.data(), static_cast<int>(n), stream);
  }
  cuda_check(fn, e, "the forward launch");
}

size_t workspace_size(const char* fn, int64_t batch, int64_t nnz, int64_t dim, int64_t num_rows) {
  if (nnz >= (int64_t{1} << 31) - 1 || batch >= (int64_t{1} << 31) - 1)
    fail(fn, "at most 2^31 - 2 keys and rows per table (got nnz " + std::to_string(nnz) + ", batch " +
                 std::to_string(batch) + ")");
  require_gpu(fn);
  cudaError_t e = cudaSuccess;
  const size_t bytes = lookup_backward_cuda_workspace(batch, nnz, dim, num_rows, &e);
  cuda_check(fn, e, "the workspace size query");
  return std::max(bytes, check_ids_cuda_workspace());
}

LookupGradArgs grad_args(const char* fn, DeviceGuard& dev, const Arr& offsets, const Arr& keys,
                         const std::optional<Arr>& weights, const std::string& combiner, const Arr& grad_out) {
  LookupGradArgs g;
  g.ids = csr_of(fn, dev, "", offsets, keys, weights);
  g.combiner = combiner_of(fn, combiner);
  dev.add(expect<float>(fn, "grad_out", grad_out, 2));
  if (grad_out.shape(0) != static_cast<size_t>(g.ids.batch))
    fail(fn, "grad_out has " + std::to_string(grad_out.shape(0)) + " rows, ids have " + std::to_string(g.ids.batch));
  g.dim = static_cast<int64_t>(grad_out.shape(1));
  g.grad_out = ptr<const float>(grad_out);
  return g;
}

void lookup_backward(const Arr& offsets, const Arr& keys, const std::optional<Arr>& weights, const std::string& combiner,
                     const Arr& grad_out, int64_t num_rows, const Arr& unique_keys, const Arr& rows,
                     const Arr& num_unique, uintptr_t stream_i, bool check, const std::optional<Arr>& workspace) {
  const char* fn = "lookup_backward_cuda";
  DeviceGuard dev{fn};
  LookupGradArgs g = grad_args(fn, dev, offsets, keys, weights, combiner, grad_out);
  if (num_rows < 0) fail(fn, "num_rows must be >= 0");
  dev.add(expect<int64_t>(fn, "unique_keys", unique_keys, 1));
  dev.add(expect<float>(fn, "rows", rows, 2));
  dev.add(expect<int64_t>(fn, "num_unique", num_unique, 1));
  if (unique_keys.shape(0) < static_cast<size_t>(g.ids.nnz))
    fail(fn, "unique_keys needs room for every key: at least " + std::to_string(g.ids.nnz) + " entries");
  if (rows.shape(0) < static_cast<size_t>(g.ids.nnz) || rows.shape(1) != static_cast<size_t>(g.dim))
    fail(fn, "rows must have shape (>= " + std::to_string(g.ids.nnz) + ", " + std::to_string(g.dim) + "), got " +
                 shape_str(rows));
  if (num_unique.shape(0) < 1) fail(fn, "num_unique must have one entry");
  const cudaStream_t stream = as_stream(stream_i);
  dev.activate();
  Workspace ws(fn, workspace, workspace_size(fn, g.ids.batch, g.ids.nnz, g.dim, num_rows), stream, dev);
  if (check) check_on_device(fn, "ids", g.ids, num_rows, true, ws.get(), stream);
  cudaError_t e;
  {
    nb::gil_scoped_release r;
    e = lookup_backward_cuda(g, num_rows, ptr<int64_t>(unique_keys), ptr<float>(rows), ptr<int64_t>(num_unique),
                             ws.get(), ws.bytes(), stream);
  }
  cuda_check(fn, e, "the backward");
}

SparseUpdateArgs target_of(const char* fn, DeviceGuard& dev, const Arr& table, const std::optional<Arr>& s1,
                           const char* n1, const std::optional<Arr>& s2, const char* n2) {
  SparseUpdateArgs a;
  dev.add(expect<float>(fn, "table", table, 2));
  a.table = ptr<float>(table);
  a.num_rows = static_cast<int64_t>(table.shape(0));
  a.dim = static_cast<int64_t>(table.shape(1));
  auto slot = [&](const std::optional<Arr>& s, const char* name) -> float* {
    if (!s) return nullptr;
    dev.add(expect<float>(fn, name, *s, 2));
    if (s->shape(0) != table.shape(0) || s->shape(1) != table.shape(1))
      fail(fn, std::string(name) + " must have the table's shape " + shape_str(table) + ", got " + shape_str(*s));
    return ptr<float>(*s);
  };
  a.slot1 = slot(s1, n1);
  a.slot2 = slot(s2, n2);
  return a;
}

void run_apply(const char* fn, DeviceGuard& dev, const LookupGradArgs& g, const SparseUpdateArgs& t,
               const SparseOptimizer& o, uintptr_t stream_i, bool check, bool allow_missing,
               const std::optional<Arr>& workspace) {
  if (o.kind == OptimizerKind::kAdagrad && !t.slot1) fail(fn, "adagrad needs accumulator");
  if (o.kind == OptimizerKind::kAdam && (!t.slot1 || !t.slot2)) fail(fn, "adam needs m and v");
  if (o.kind == OptimizerKind::kFtrl && (!t.slot1 || !t.slot2)) fail(fn, "ftrl needs accumulator and linear");
  if (g.dim != t.dim)
    fail(fn, "gradient rows have " + std::to_string(g.dim) + " columns, the table " + std::to_string(t.dim));
  const cudaStream_t stream = as_stream(stream_i);
  dev.activate();
  Workspace ws(fn, workspace, workspace_size(fn, g.ids.batch, g.ids.nnz, g.dim, t.num_rows), stream, dev);
  if (check) check_on_device(fn, allow_missing ? "ids" : "indices", g.ids, t.num_rows, allow_missing, ws.get(), stream);
  cudaError_t e;
  {
    nb::gil_scoped_release r;
    e = lookup_backward_apply_cuda(g, t, o, ws.get(), ws.bytes(), stream);
  }
  cuda_check(fn, e, "the update");
}

// Optimizer indices (any order, duplicates summed) as "one key per row" gradient args.
LookupGradArgs index_args(const char* fn, DeviceGuard& dev, const Arr& indices, const Arr& grads, int64_t dim) {
  dev.add(expect<int64_t>(fn, "indices", indices, 1));
  dev.add(expect<float>(fn, "grads", grads, 2));
  if (grads.shape(0) != indices.shape(0) || static_cast<int64_t>(grads.shape(1)) != dim)
    fail(fn, "grads must have shape (len(indices), table dim) = (" + std::to_string(indices.shape(0)) + ", " +
                 std::to_string(dim) + "), got " + shape_str(grads));
  LookupGradArgs g;
  g.ids.row_offsets = nullptr;
  g.ids.keys = ptr<const int64_t>(indices);
  g.ids.batch = g.ids.nnz = static_cast<int64_t>(indices.shape(0));
  g.combiner = Combiner::kSum;
  g.dim = dim;
  g.grad_out = ptr<const float>(grads);
  return g;
}

}  // namespace

EMBEDLAB_PY_BINDINGS(embedding_cuda) {
  m.def(
      "cuda_device_count",
      []() {
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {
          cudaGetLastError();  // no driver / no device: report 0, not an error
          return 0;
        }
        return n;
      },
      "Number of CUDA devices visible (0 without a driver or GPU).");

  m.def(
      "_set_cuda_forward_variant",
      [](int rows, int unroll, int min_blocks) {
        if (!set_cuda_forward_variant(rows, unroll, min_blocks))
          fail("_set_cuda_forward_variant", "not a compiled variant (see kForwardVariants in embedding_cuda.cu)");
      },
      nb::arg("rows_per_group"), nb::arg("unroll"), nb::arg("min_blocks"),
      "Benchmark knob: forward rows per thread group, key unroll, min resident blocks per SM (same results).");
  m.def(
      "_set_cuda_backward_variant",
      [](bool prefetch, int min_blocks) {
        if (!set_cuda_backward_variant(prefetch, min_blocks))
          fail("_set_cuda_backward_variant", "min_blocks must be 1 or 4");
      },
      nb::arg("prefetch"), nb::arg("min_blocks"), "Benchmark knob for the backward reduction (same results).");
  m.def(
      "_cuda_backward_variant",
      []() {
        bool pf;
        int mb;
        get_cuda_backward_variant(&pf, &mb);
        return std::make_tuple(pf, mb);
      },
      "The backward variant in use: (prefetch, min_blocks).");
  m.def(
      "_cuda_forward_variant",
      []() {
        int r, u, b;
        get_cuda_forward_variant(&r, &u, &b);
        return std::make_tuple(r, u, b);
      },
      "The forward variant in use: (rows_per_group, unroll, min_blocks).");

  m.def(
      "_gather_rows_cuda",
      [](const Arr& table, const Arr& rows, const Arr& out, uintptr_t stream) {
        const char* fn = "_gather_rows_cuda";
        DeviceGuard dev{fn};
        dev.add(expect<float>(fn, "table", table, 2));
        dev.add(expect<int64_t>(fn, "rows", rows, 1));
        dev.add(expect<float>(fn, "out", out, 2));
        if (out.shape(0) != rows.shape(0) || out.shape(1) != table.shape(1))
          fail(fn, "out must have shape (" + std::to_string(rows.shape(0)) + ", " + std::to_string(table.shape(1)) +
                       "), got " + shape_str(out));
        if (rows.shape(0) == 0) return;
        dev.activate();
        cuda_check(fn,
                   gather_rows_cuda(ptr<const float>(table), static_cast<int64_t>(table.shape(0)),
                                    static_cast<int64_t>(table.shape(1)), ptr<const int64_t>(rows),
                                    static_cast<int64_t>(rows.shape(0)), ptr<float>(out), as_stream(stream)),
                   "the gather launch");
      },
      nb::arg("table"), nb::arg("rows"), nb::arg("out"), nb::arg("stream") = 0,
      "Benchmark floor: out[i] = table[rows[i]] with 16-byte loads, one thread per chunk (a row outside\n"
      "the table gives zeros). What every lookup of the same rows is measured against.");

  m.def(
      "lookup_backward_cuda_workspace_size",
      [](int64_t batch, int64_t nnz, int64_t dim, int64_t num_rows) {
        return workspace_size("lookup_backward_cuda_workspace_size", batch, nnz, dim, num_rows);
      },
      nb::arg("batch"), nb::arg("nnz"), nb::arg("dim"), nb::arg("num_rows"),
      "Bytes of scratch for lookup_backward_cuda / lookup_backward_apply_cuda / sparse_*_cuda (needs a GPU).");

  m.def("lookup_forward_cuda", &lookup_forward, nb::arg("tables"), nb::arg("row_offsets"), nb::arg("keys"),
        nb::arg("weights").none(), nb::arg("combiners"), nb::arg("outs"), nb::arg("stream") = 0,
        nb::arg("check") = true,
        "Fused pooled lookup of several tables on the GPU into preallocated outs[t] [batch_t, dim_t].\n"
        "Same results as lookup_forward (the CPU) bit for bit. check=True syncs the stream once per table.");

  m.def("lookup_backward_cuda", &lookup_backward, nb::arg("row_offsets"), nb::arg("keys"), nb::arg("weights").none(),
        nb::arg("combiner"), nb::arg("grad_out"), nb::arg("num_rows"), nb::arg("unique_keys"), nb::arg("rows"),
        nb::arg("num_unique"), nb::arg("stream") = 0, nb::arg("check") = true, nb::arg("workspace").none() = nb::none(),
        "Backward of one table's lookup on the GPU. Writes the count to num_unique[0] (int64, on the device),\n"
        "ascending unique keys to unique_keys[:count] and the summed rows to rows[:count] (both sized for nnz).\n"
        "No host sync unless check=True. Deterministic bits; equal to the CPU for keys touched <= 32 times.");

  m.def(
      "lookup_backward_apply_cuda",
      [](const Arr& table, const Arr& offsets, const Arr& keys, const std::optional<Arr>& weights,
         const std::string& combiner, const Arr& grad_out, const std::string& optimizer, float lr,
         const std::optional<Arr>& accumulator, const std::optional<Arr>& m, const std::optional<Arr>& v,
         float epsilon, double beta_1, double beta_2, int64_t step, uintptr_t stream, bool check,
         const std::optional<Arr>& workspace, const std::optional<Arr>& linear, float lr_power, float l1, float l2,
         float l2_shrinkage, float beta) {
        const char* fn = "lookup_backward_apply_cuda";
        DeviceGuard dev{fn};
        LookupGradArgs g = grad_args(fn, dev, offsets, keys, weights, combiner, grad_out);
        SparseUpdateArgs t = optimizer == "adagrad" ? target_of(fn, dev, table, accumulator, "accumulator", {}, "")
                             : optimizer == "ftrl"  ? target_of(fn, dev, table, accumulator, "accumulator", linear, "linear")
                                                    : target_of(fn, dev, table, m, "m", v, "v");
        run_apply(fn, dev, g, t,
                  optimizer_of(fn, optimizer, lr, epsilon, beta_1, beta_2, step,
                               embedlab_py::ftrl_of(lr_power, l1, l2, l2_shrinkage, beta)),
                  stream, check, true, workspace);
      },
      nb::arg("table"), nb::arg("row_offsets"), nb::arg("keys"), nb::arg("weights").none(), nb::arg("combiner"),
      nb::arg("grad_out"), nb::arg("optimizer"), nb::arg("lr"), nb::arg("accumulator").none() = nb::none(),
      nb::arg("m").none() = nb::none(), nb::arg("v").none() = nb::none(), nb::arg("epsilon") = 1e-7f,
      nb::arg("beta_1") = 0.9, nb::arg("beta_2") = 0.999, nb::arg("step") = 1, nb::arg("stream") = 0,
      nb::arg("check") = true, nb::arg("workspace").none() = nb::none(), nb::arg("linear").none() = nb::none(),
      nb::arg("lr_power") = -0.5f, nb::arg("l1") = 0.f, nb::arg("l2") = 0.f, nb::arg("l2_shrinkage") = 0.f,
      nb::arg("beta") = 0.f,
      "Fused backward + optimizer ('sgd' | 'adagrad' | 'adam' | 'ftrl') on the touched rows of `table` (in\n"
      "place); the gradient is never materialized. Same bits as lookup_backward_cuda followed by\n"
      "sparse_<opt>_cuda. ftrl: accumulator (n), linear (z), lr_power, l1, l2, l2_shrinkage, beta.");

  m.def(
      "lookup_backward_apply_multi_cuda_workspace_size",
      [](const std::vector<int64_t>& batches, const std::vector<int64_t>& nnzs, const std::vector<int64_t>& dims,
         const std::vector<int64_t>& num_rows) {
        const char* fn = "lookup_backward_apply_multi_cuda_workspace_size";
        const size_t n = batches.size();
        if (nnzs.size() != n || dims.size() != n || num_rows.size() != n)
          fail(fn, "batches, nnzs, dims and num_rows must have the same length");
        std::vector<LookupGradArgs> g(n);
        std::vector<SparseUpdateArgs> t(n);
        for (size_t i = 0; i < n; ++i) {
          g[i].ids.batch = batches[i];
          g[i].ids.nnz = nnzs[i];
          g[i].ids.row_offsets = reinterpret_cast<const int64_t*>(16);  // sizes only: never read
          g[i].dim = t[i].dim = dims[i];
          t[i].num_rows = num_rows[i];
        }
        require_gpu(fn);
        cudaError_t e = cudaSuccess;
        const size_t bytes = lookup_backward_apply_cuda_workspace(g.data(), t.data(), static_cast<int>(n), &e);
        cuda_check(fn, e, "the workspace size query (sizes: < 2^31 keys in all, dims >= 1)");
        return std::max(bytes, check_ids_cuda_workspace());
      },
      nb::arg("batches"), nb::arg("nnzs"), nb::arg("dims"), nb::arg("num_rows"),
      "Bytes of scratch for lookup_backward_apply_multi_cuda over tables of these sizes (needs a GPU).");

  m.def(
      "lookup_backward_apply_multi_cuda",
      [](const std::vector<Arr>& tables, const std::vector<Arr>& offsets, const std::vector<Arr>& keys,
         const std::optional<std::vector<Arr>>& weights, const std::vector<std::string>& combiners,
         const std::vector<Arr>& grad_outs, const std::string& optimizer, float lr,
         const std::optional<std::vector<Arr>>& accumulators, const std::optional<std::vector<Arr>>& ms,
         const std::optional<std::vector<Arr>>& vs, float epsilon, double beta_1, double beta_2, int64_t step,
         uintptr_t stream_i, bool check, const std::optional<Arr>& workspace,
         const std::optional<std::vector<Arr>>& linears, float lr_power, float l1, float l2, float l2_shrinkage,
         float beta) {
        const char* fn = "lookup_backward_apply_multi_cuda";
        const size_t n = tables.size();
        auto same = [&](const std::optional<std::vector<Arr>>& l) { return !l || l->size() == n; };
        if (offsets.size() != n || keys.size() != n || combiners.size() != n || grad_outs.size() != n ||
            !same(weights) || !same(accumulators) || !same(ms) || !same(vs) || !same(linears))
          fail(fn, "tables, row_offsets, keys, combiners, grad_outs (and weights / slots) must have the same length");
        const SparseOptimizer o = optimizer_of(fn, optimizer, lr, epsilon, beta_1, beta_2, step,
                                               embedlab_py::ftrl_of(lr_power, l1, l2, l2_shrinkage, beta));
        if (o.kind == OptimizerKind::kAdagrad && !accumulators) fail(fn, "adagrad needs accumulators");
        if (o.kind == OptimizerKind::kFtrl && (!accumulators || !linears))
          fail(fn, "ftrl needs accumulators and linears");
        if (o.kind == OptimizerKind::kAdam && (!ms || !vs)) fail(fn, "adam needs m and v");
        DeviceGuard dev{fn};
        std::vector<LookupGradArgs> g(n);
        std::vector<SparseUpdateArgs> t(n);
        for (size_t i = 0; i < n; ++i) {
          const std::string sfx = "[" + std::to_string(i) + "]";
          auto opt_at = [&](const std::optional<std::vector<Arr>>& l) {
            return l ? std::optional<Arr>((*l)[i]) : std::nullopt;
          };
          g[i].ids = csr_of(fn, dev, sfx, offsets[i], keys[i], opt_at(weights));
          g[i].combiner = combiner_of(fn, combiners[i]);
          dev.add(expect<float>(fn, "grad_outs" + sfx, grad_outs[i], 2));
          if (grad_outs[i].shape(0) != static_cast<size_t>(g[i].ids.batch))
            fail(fn, "grad_outs" + sfx + " has " + std::to_string(grad_outs[i].shape(0)) + " rows, ids have " +
                         std::to_string(g[i].ids.batch));
          g[i].dim = static_cast<int64_t>(grad_outs[i].shape(1));
          g[i].grad_out = ptr<const float>(grad_outs[i]);
          t[i] = o.kind == OptimizerKind::kAdagrad ? target_of(fn, dev, tables[i], opt_at(accumulators), "accumulator", {}, "")
                 : o.kind == OptimizerKind::kFtrl
                     ? target_of(fn, dev, tables[i], opt_at(accumulators), "accumulator", opt_at(linears), "linear")
                     : target_of(fn, dev, tables[i], opt_at(ms), "m", opt_at(vs), "v");
          if (t[i].dim != g[i].dim)
            fail(fn, "grad_outs" + sfx + " has " + std::to_string(g[i].dim) + " columns, tables" + sfx + " " +
                         std::to_string(t[i].dim));
        }
        if (n == 0) return;
        const cudaStream_t stream = as_stream(stream_i);
        dev.activate();
        cudaError_t e = cudaSuccess;
        const size_t need = lookup_backward_apply_cuda_workspace(g.data(), t.data(), static_cast<int>(n), &e);
        cuda_check(fn, e, "the workspace size query (< 2^31 keys and rows per 32 tables, dims >= 1)");
        Workspace ws(fn, workspace, std::max(need, check_ids_cuda_workspace()), stream, dev);
        if (check)
          for (size_t i = 0; i < n; ++i)
            check_on_device(fn, "table " + std::to_string(i), g[i].ids, t[i].num_rows, true, ws.get(), stream);
        {
          nb::gil_scoped_release r;
          e = lookup_backward_apply_cuda(g.data(), t.data(), static_cast<int>(n), o, ws.get(), ws.bytes(), stream);
        }
        cuda_check(fn, e, "the update");
      },
      nb::arg("tables"), nb::arg("row_offsets"), nb::arg("keys"), nb::arg("weights").none(), nb::arg("combiners"),
      nb::arg("grad_outs"), nb::arg("optimizer"), nb::arg("lr"), nb::arg("accumulators").none() = nb::none(),
      nb::arg("m").none() = nb::none(), nb::arg("v").none() = nb::none(), nb::arg("epsilon") = 1e-7f,
      nb::arg("beta_1") = 0.9, nb::arg("beta_2") = 0.999, nb::arg("step") = 1, nb::arg("stream") = 0,
      nb::arg("check") = true, nb::arg("workspace").none() = nb::none(), nb::arg("linears").none() = nb::none(),
      nb::arg("lr_power") = -0.5f, nb::arg("l1") = 0.f, nb::arg("l2") = 0.f, nb::arg("l2_shrinkage") = 0.f,
      nb::arg("beta") = 0.f,
      "Fused backward + optimizer over several tables: up to 32 tables share one sort and one set of\n"
      "launches. Same bits as one lookup_backward_apply_cuda call per table. ftrl: accumulators, linears.");

  m.def(
      "sparse_sgd_cuda",
      [](const Arr& table, const Arr& indices, const Arr& grads, float lr, uintptr_t stream, bool check,
         const std::optional<Arr>& workspace) {
        const char* fn = "sparse_sgd_cuda";
        DeviceGuard dev{fn};
        SparseUpdateArgs t = target_of(fn, dev, table, {}, "", {}, "");
        run_apply(fn, dev, index_args(fn, dev, indices, grads, t.dim), t, optimizer_of(fn, "sgd", lr, 0, 0, 0, 1),
                  stream, check, false, workspace);
      },
      nb::arg("table"), nb::arg("indices"), nb::arg("grads"), nb::arg("lr"), nb::arg("stream") = 0,
      nb::arg("check") = true, nb::arg("workspace").none() = nb::none(),
      "w[i] -= lr * g on the GPU; indices in any order, duplicates summed first (in input order).");

  m.def(
      "sparse_adagrad_cuda",
      [](const Arr& table, const Arr& acc, const Arr& indices, const Arr& grads, float lr, float eps, uintptr_t stream,
         bool check, const std::optional<Arr>& workspace) {
        const char* fn = "sparse_adagrad_cuda";
        DeviceGuard dev{fn};
        SparseUpdateArgs t = target_of(fn, dev, table, acc, "accumulator", {}, "");
        run_apply(fn, dev, index_args(fn, dev, indices, grads, t.dim), t,
                  optimizer_of(fn, "adagrad", lr, eps, 0, 0, 1), stream, check, false, workspace);
      },
      nb::arg("table"), nb::arg("accumulator"), nb::arg("indices"), nb::arg("grads"), nb::arg("lr"),
      nb::arg("epsilon"), nb::arg("stream") = 0, nb::arg("check") = true, nb::arg("workspace").none() = nb::none(),
      "Keras Adagrad on the given rows on the GPU; duplicates summed first.");

  m.def(
      "sparse_adam_cuda",
      [](const Arr& table, const Arr& mo, const Arr& ve, const Arr& indices, const Arr& grads, float lr, double b1,
         double b2, float eps, int64_t step, uintptr_t stream, bool check, const std::optional<Arr>& workspace) {
        const char* fn = "sparse_adam_cuda";
        DeviceGuard dev{fn};
        SparseUpdateArgs t = target_of(fn, dev, table, mo, "m", ve, "v");
        run_apply(fn, dev, index_args(fn, dev, indices, grads, t.dim), t,
                  optimizer_of(fn, "adam", lr, eps, b1, b2, step), stream, check, false, workspace);
      },
      nb::arg("table"), nb::arg("m"), nb::arg("v"), nb::arg("indices"), nb::arg("grads"), nb::arg("lr"),
      nb::arg("beta_1"), nb::arg("beta_2"), nb::arg("epsilon"), nb::arg("step"), nb::arg("stream") = 0,
      nb::arg("check") = true, nb::arg("workspace").none() = nb::none(),
      "Lazy Adam (Keras expression order) on the given rows on the GPU; duplicates summed first.");

  m.def(
      "sparse_ftrl_cuda",
      [](const Arr& table, const Arr& acc, const Arr& lin, const Arr& indices, const Arr& grads, float lr,
         float lr_power, float l1, float l2, float l2_shrinkage, float beta, uintptr_t stream, bool check,
         const std::optional<Arr>& workspace) {
        const char* fn = "sparse_ftrl_cuda";
        DeviceGuard dev{fn};
        SparseUpdateArgs t = target_of(fn, dev, table, acc, "accumulator", lin, "linear");
        run_apply(fn, dev, index_args(fn, dev, indices, grads, t.dim), t,
                  optimizer_of(fn, "ftrl", lr, 0, 0, 0, 1, embedlab_py::ftrl_of(lr_power, l1, l2, l2_shrinkage, beta)),
                  stream, check, false, workspace);
      },
      nb::arg("table"), nb::arg("accumulator"), nb::arg("linear"), nb::arg("indices"), nb::arg("grads"),
      nb::arg("lr"), nb::arg("lr_power") = -0.5f, nb::arg("l1") = 0.f, nb::arg("l2") = 0.f,
      nb::arg("l2_shrinkage") = 0.f, nb::arg("beta") = 0.f, nb::arg("stream") = 0, nb::arg("check") = true,
      nb::arg("workspace").none() = nb::none(),
      "Keras 3 FTRL on the given rows on the GPU (accumulator n, linear z); duplicates summed first.");
}
