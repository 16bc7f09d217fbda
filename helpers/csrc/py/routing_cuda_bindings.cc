// CUDA routing (csrc/core/routing_cuda.cu) over DLPack device arrays (PyTorch, CuPy), checked
// on the GPU against route_keys (CPU) and a NumPy oracle. Conventions as in embedding_cuda_bindings.cc:
// `stream` is the caller's cudaStream_t as an int; scratch is a stream-ordered allocation.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "registry.h"
#include "routing.h"
#include "routing_bindings.h"

namespace nb = nanobind;
using namespace embedlab;

namespace {

using Arr = nb::ndarray<>;
using H1 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

using embedlab_py::fail;

// A C-contiguous int64 CUDA array of `expected_size` elements (any size when expected_size < 0)
// on `device` (-1: any; the first array fixes it).
int64_t* dev_i64(const char* fn, const char* name, const Arr& a, int64_t expected_size, int* device) {
  if (a.device_type() != nb::device::cuda::value)
    fail(fn, std::string(name) + " must be a CUDA device array (a torch.cuda tensor or a CuPy array)");
  if (a.dtype() != nb::dtype<int64_t>())
    fail(fn, std::string(name) + " must have dtype int64, got " + embedlab_py::dtype_name(a.dtype()));
  if (expected_size >= 0 && a.size() != static_cast<size_t>(expected_size))
    fail(fn, std::string(name) + " has " + std::to_string(a.size()) + " elements, needs " + std::to_string(expected_size));
  if (a.size() > 1) {
    int64_t want = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) > 1 && a.stride(i) != want) fail(fn, std::string(name) + " must be C-contiguous");
      want *= static_cast<int64_t>(a.shape(i));
    }
  }
  if (*device < 0) *device = a.device_id();
  else if (a.device_id() != *device)
    fail(fn, std::string(name) + " is on device " + std::to_string(a.device_id()) + ", keys on device " +
                 std::to_string(*device));
  return static_cast<int64_t*>(a.data());
}

struct Call {
  std::vector<RouteTable> tables;
  std::vector<int64_t> offsets;
  RouteArgs args;
  int device = -1;
};

Call prepare(const char* fn, const Arr& keys, const H1& table_offsets, const std::vector<int>& modes,
             const std::vector<int64_t>& rows, const std::vector<int>& ranks, int num_workers, const Arr& counts) {
  Call c;
  c.tables = embedlab_py::route_tables(fn, modes, rows, ranks);
  if (table_offsets.shape(0) != c.tables.size() + 1) fail(fn, "table_offsets needs num_tables + 1 entries");
  c.offsets.assign(table_offsets.data(), table_offsets.data() + table_offsets.shape(0));
  c.args.keys = dev_i64(fn, "keys", keys, -1, &c.device);
  c.args.table_offsets = c.offsets.data();
  c.args.tables = c.tables.data();
  c.args.num_tables = static_cast<int32_t>(c.tables.size());
  c.args.num_workers = num_workers;
  c.args.nnz = static_cast<int64_t>(keys.size());
  if (num_workers < 1) fail(fn, "num_workers must be >= 1, got " + std::to_string(num_workers));
  c.args.counts = dev_i64(fn, "counts", counts, static_cast<int64_t>(num_workers) * static_cast<int64_t>(c.tables.size()),
                          &c.device);
  const std::string err = check_route_args(c.args);
  if (!err.empty()) fail(fn, err);
  return c;
}

int64_t* status_ptr(const char* fn, const std::optional<Arr>& status, int* device) {
  if (!status) return nullptr;
  int64_t* p = dev_i64(fn, "status", *status, -1, device);
  if (status->size() < static_cast<size_t>(kRouteStatusWords))
    fail(fn, "status must have at least " + std::to_string(kRouteStatusWords) + " entries, got " +
                 std::to_string(status->size()));
  return p;
}

void make_current(const char* fn, int device) {
  embedlab_py::cuda_check(fn, cudaSetDevice(device < 0 ? 0 : device), "cudaSetDevice");
}

// Scratch: the caller's uint8 device array (checked first, with the GIL held), or else
// (nullptr) a StreamScratch allocation.
void* given_workspace(const char* fn, const std::optional<Arr>& ws, size_t bytes, int* device) {
  if (!ws) return nullptr;
  if (ws->device_type() != nb::device::cuda::value || ws->dtype() != nb::dtype<uint8_t>() || ws->ndim() != 1)
    fail(fn, "workspace must be a 1-D uint8 CUDA array");
  if (ws->size() < bytes)
    fail(fn, "workspace has " + std::to_string(ws->size()) + " bytes, needs " + std::to_string(bytes) +
                 " (route_cuda_workspace_size)");
  if (ws->device_id() != *device)
    fail(fn, "workspace is on device " + std::to_string(ws->device_id()) + ", keys on device " + std::to_string(*device));
  return ws->data();
}

// Bytes of scratch both calls need (the scatter keeps its status words in the last 256).
size_t scratch_bytes(const RouteArgs& a) { return route_cuda_workspace_size(a) + 256; }

}  // namespace

EMBEDLAB_PY_BINDINGS(routing_cuda) {
  m.def(
      "route_cuda_workspace_size",
      [](H1 table_offsets, int num_workers) {
        const char* fn = "route_cuda_workspace_size";
        if (table_offsets.shape(0) < 2) fail(fn, "table_offsets needs num_tables + 1 >= 2 entries");
        if (num_workers < 1) fail(fn, "num_workers must be >= 1, got " + std::to_string(num_workers));
        std::vector<int64_t> off(table_offsets.data(), table_offsets.data() + table_offsets.shape(0));
        std::vector<RouteTable> tables(off.size() - 1);
        RouteArgs a;
        a.table_offsets = off.data();
        a.tables = tables.data();
        a.num_tables = static_cast<int32_t>(tables.size());
        a.num_workers = num_workers;
        a.nnz = off.back();
        const std::string err = check_route_args(a);
        if (!err.empty()) fail(fn, err);
        return scratch_bytes(a);
      },
      nb::arg("table_offsets"), nb::arg("num_workers"),
      "Bytes of scratch route_count_cuda / route_scatter_cuda need for these table offsets and workers\n"
      "(pass a uint8 device array of at least this size as workspace= to skip the stream-ordered allocation).");
  m.def(
      "route_count_cuda",
      [](Arr keys, H1 table_offsets, std::vector<int> modes, std::vector<int64_t> rows, std::vector<int> ranks,
         int num_workers, Arr counts, uintptr_t stream, std::optional<Arr> status,
         std::optional<Arr> workspace) -> nb::object {
        const char* fn = "route_count_cuda";
        Call c = prepare(fn, keys, table_offsets, modes, rows, ranks, num_workers, counts);
        int64_t* st_dev = status_ptr(fn, status, &c.device);
        const size_t bytes = scratch_bytes(c.args);
        void* given = given_workspace(fn, workspace, bytes, &c.device);
        make_current(fn, c.device);
        cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        RouteStatus st;
        {
          nb::gil_scoped_release release;
          embedlab_py::StreamScratch ws(fn, given, bytes, s);
          if (st_dev) route_count_cuda_async(c.args, st_dev, ws.get(), bytes, s);
          else st = route_count_cuda(c.args, ws.get(), bytes, s);
        }
        if (st_dev) return nb::none();
        if (st.bad_index >= 0)
          fail(fn, embedlab_py::bad_key_message(st, c.offsets, c.tables[st.bad_table]));
        return nb::make_tuple(st.total, st.max_per_owner);
      },
      nb::arg("keys"), nb::arg("table_offsets"), nb::arg("modes"), nb::arg("rows"), nb::arg("ranks"),
      nb::arg("num_workers"), nb::arg("counts"), nb::arg("stream") = 0, nb::arg("status").none() = nb::none(),
      nb::arg("workspace").none() = nb::none(),
      "Counts (into the device array counts [n, T]) the keys each owner gets.\n"
      "keys: device int64; table_offsets: host int64 [T + 1].\n"
      "status=None: synchronizes the stream once, raises ValueError naming the first bad key, and returns\n"
      "(total, max_per_owner). status (a device int64 array of >= 6 entries): nothing synchronizes; the\n"
      "status words (total, max_per_owner, bad_index (-1: none), bad_table, bad_key, error) are written\n"
      "there on the stream and None is returned. workspace: a uint8 device array of at least\n"
      "route_cuda_workspace_size(table_offsets, num_workers) bytes (default: a stream-ordered allocation).");
  m.def(
      "route_scatter_cuda",
      [](Arr keys, H1 table_offsets, std::vector<int> modes, std::vector<int64_t> rows, std::vector<int> ranks,
         int num_workers, Arr counts, int64_t stride, Arr send, Arr inverse, uintptr_t stream, bool check,
         std::optional<Arr> status, std::optional<Arr> workspace) {
        const char* fn = "route_scatter_cuda";
        Call c = prepare(fn, keys, table_offsets, modes, rows, ranks, num_workers, counts);
        if (stride < 0) fail(fn, "stride must be >= 0");
        if (stride > 0 && send.size() != static_cast<size_t>(num_workers) * static_cast<size_t>(stride))
          fail(fn, "send must have num_workers * stride = " + std::to_string(static_cast<int64_t>(num_workers) * stride) +
                       " elements, got " + std::to_string(send.size()));
        int64_t* s_ptr = dev_i64(fn, "send", send, -1, &c.device);
        int64_t* i_ptr = dev_i64(fn, "inverse", inverse, c.args.nnz, &c.device);
        int64_t* st_dev = status_ptr(fn, status, &c.device);
        const size_t bytes = scratch_bytes(c.args);
        void* given = given_workspace(fn, workspace, bytes, &c.device);
        make_current(fn, c.device);
        cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        RouteStatus st;
        {
          nb::gil_scoped_release release;
          embedlab_py::StreamScratch ws(fn, given, bytes, s);
          // without a caller's status array, the words go to the workspace's last 256 bytes
          int64_t* words = st_dev ? st_dev : reinterpret_cast<int64_t*>(static_cast<char*>(ws.get()) + bytes - 256);
          route_scatter_cuda(c.args, stride, s_ptr, static_cast<int64_t>(send.size()), i_ptr, words, ws.get(), bytes - 256,
                             s);
          if (check) st = read_route_status(words, s);
        }
        if (!check) return;
        if (st.error == kRouteBadKey) fail(fn, embedlab_py::bad_key_message(st, c.offsets, c.tables[st.bad_table]));
        if (st.error == kRouteStrideTooSmall)
          fail(fn, "stride " + std::to_string(stride) + " is below the " + std::to_string(st.max_per_owner) +
                       " keys of the busiest owner; nothing was written");
        if (st.error == kRouteSendTooShort)
          fail(fn, "send has " + std::to_string(send.size()) + " entries, the " + std::to_string(st.total) +
                       " routed keys need " + std::to_string(st.total) + "; nothing was written");
      },
      nb::arg("keys"), nb::arg("table_offsets"), nb::arg("modes"), nb::arg("rows"), nb::arg("ranks"),
      nb::arg("num_workers"), nb::arg("counts"), nb::arg("stride"), nb::arg("send"), nb::arg("inverse"),
      nb::arg("stream") = 0, nb::arg("check") = true, nb::arg("status").none() = nb::none(),
      nb::arg("workspace").none() = nb::none(),
      "Writes the routed keys into send (num_workers * stride entries, -1 where unused; or, with stride 0,\n"
      "compact: at least the routed keys, entries past them untouched) and each key's position into inverse\n"
      "(-1 for padding). Counts the keys again itself (and writes those counts to counts). Before writing,\n"
      "the device checks that stride covers the busiest owner / send covers the routed keys and that no key\n"
      "is bad; if not, send and inverse are left untouched. check=True (default) reads that verdict back\n"
      "(one synchronization) and raises ValueError as route_keys does; check=False never synchronizes (the\n"
      "verdict is in status[5], 0 = written, when a status array is given). workspace: as in route_count_cuda.");
}
