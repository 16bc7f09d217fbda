// CUDA routing (csrc/core/routing_cuda.cu) over DLPack device arrays (PyTorch, CuPy), checked
// on the GPU against route_keys (CPU) and a NumPy oracle. Conventions as in cuda_bindings.cc:
// `stream` is the caller's cudaStream_t as an int; scratch is a stream-ordered allocation.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "registry.h"
#include "routing.h"

namespace nb = nanobind;
using namespace embedlab;

namespace embedlab_py {
std::vector<RouteTable> route_tables(const char* fn, const std::vector<int>& modes, const std::vector<int64_t>& rows,
                                     const std::vector<int>& ranks);
std::string bad_key_message(const RouteStatus& st, const std::vector<int64_t>& offsets, const RouteTable& t);
}  // namespace embedlab_py

namespace {

using Arr = nb::ndarray<>;
using H1 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

[[noreturn]] void fail(const char* fn, const std::string& msg) {
  throw nb::value_error((std::string(fn) + ": " + msg).c_str());
}

int64_t* dev_i64(const char* fn, const char* name, const Arr& a, size_t expected_size) {
  if (a.device_type() != nb::device::cuda::value) fail(fn, std::string(name) + " must be a CUDA array");
  if (a.dtype() != nb::dtype<int64_t>()) fail(fn, std::string(name) + " must be int64");
  if (a.size() != expected_size)
    fail(fn, std::string(name) + " has " + std::to_string(a.size()) + " elements, needs " + std::to_string(expected_size));
  if (a.ndim() >= 1 && a.size() > 1 && a.stride(a.ndim() - 1) != 1) fail(fn, std::string(name) + " must be C-contiguous");
  return static_cast<int64_t*>(a.data());
}

struct Call {
  std::vector<RouteTable> tables;
  std::vector<int64_t> offsets;
  RouteArgs args;
};

Call prepare(const char* fn, const Arr& keys, const H1& table_offsets, const std::vector<int>& modes,
             const std::vector<int64_t>& rows, const std::vector<int>& ranks, int num_workers, const Arr& counts) {
  Call c;
  c.tables = embedlab_py::route_tables(fn, modes, rows, ranks);
  if (table_offsets.shape(0) != c.tables.size() + 1) fail(fn, "table_offsets needs num_tables + 1 entries");
  c.offsets.assign(table_offsets.data(), table_offsets.data() + table_offsets.shape(0));
  c.args.keys = dev_i64(fn, "keys", keys, keys.size());
  c.args.table_offsets = c.offsets.data();
  c.args.tables = c.tables.data();
  c.args.num_tables = static_cast<int32_t>(c.tables.size());
  c.args.num_workers = num_workers;
  c.args.nnz = static_cast<int64_t>(keys.size());
  c.args.counts = dev_i64(fn, "counts", counts, static_cast<size_t>(num_workers) * c.tables.size());
  const std::string err = check_route_args(c.args);
  if (!err.empty()) fail(fn, err);
  if (keys.size() > 0) cudaSetDevice(keys.device_id());
  return c;
}

struct Scratch {
  void* p = nullptr;
  cudaStream_t s;
  Scratch(size_t bytes, cudaStream_t stream) : s(stream) {
    const cudaError_t e = cudaMallocAsync(&p, bytes, s);
    if (e != cudaSuccess) throw std::runtime_error(std::string("routing: cudaMallocAsync failed: ") + cudaGetErrorString(e));
  }
  ~Scratch() { cudaFreeAsync(p, s); }
};

}  // namespace

EMBEDLAB_PY_BINDINGS(routing_cuda) {
  m.def(
      "route_count_cuda",
      [](Arr keys, H1 table_offsets, std::vector<int> modes, std::vector<int64_t> rows, std::vector<int> ranks,
         int num_workers, Arr counts, uintptr_t stream) {
        const char* fn = "route_count_cuda";
        Call c = prepare(fn, keys, table_offsets, modes, rows, ranks, num_workers, counts);
        cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        const size_t bytes = route_cuda_workspace_size(c.args.nnz, c.args.num_tables, num_workers);
        RouteStatus st;
        {
          nb::gil_scoped_release release;
          Scratch ws(bytes, s);
          st = route_count_cuda(c.args, ws.p, bytes, s);
        }
        if (st.bad_index >= 0)
          fail(fn, embedlab_py::bad_key_message(st, c.offsets, c.tables[st.bad_table]));
        return nb::make_tuple(st.total, st.max_per_owner);
      },
      nb::arg("keys"), nb::arg("table_offsets"), nb::arg("modes"), nb::arg("rows"), nb::arg("ranks"),
      nb::arg("num_workers"), nb::arg("counts"), nb::arg("stream") = 0,
      "Counts (into the device array counts [n, T]) the keys each owner gets; returns (total, max_per_owner).\n"
      "keys: device int64; table_offsets: host int64 [T + 1]. Raises ValueError naming the first bad key.\n"
      "Synchronizes the stream once (the status read).");
  m.def(
      "route_scatter_cuda",
      [](Arr keys, H1 table_offsets, std::vector<int> modes, std::vector<int64_t> rows, std::vector<int> ranks,
         int num_workers, Arr counts, int64_t stride, Arr send, Arr inverse, uintptr_t stream) {
        const char* fn = "route_scatter_cuda";
        Call c = prepare(fn, keys, table_offsets, modes, rows, ranks, num_workers, counts);
        if (stride < 0) fail(fn, "stride must be >= 0");
        if (stride > 0 && send.size() != static_cast<size_t>(num_workers) * stride)
          fail(fn, "send must have num_workers * stride elements");
        int64_t* s_ptr = send.size() ? dev_i64(fn, "send", send, send.size()) : nullptr;
        int64_t* i_ptr = dev_i64(fn, "inverse", inverse, static_cast<size_t>(c.args.nnz));
        cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        const size_t bytes = route_cuda_workspace_size(c.args.nnz, c.args.num_tables, num_workers);
        nb::gil_scoped_release release;
        Scratch ws(bytes, s);
        route_scatter_cuda(c.args, stride, s_ptr, i_ptr, ws.p, bytes, s);
      },
      nb::arg("keys"), nb::arg("table_offsets"), nb::arg("modes"), nb::arg("rows"), nb::arg("ranks"),
      nb::arg("num_workers"), nb::arg("counts"), nb::arg("stride"), nb::arg("send"), nb::arg("inverse"),
      nb::arg("stream") = 0,
      "Writes the routed keys into send (num_workers * stride, -1 where unused; or the compact total with\n"
      "stride 0) and each key's position into inverse (-1 for padding). counts: from route_count_cuda.");
}
