// route_keys: csrc/core/routing.h over NumPy arrays (the CPU oracle of the CUDA version and of
// embedlab.sok's exchange).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "arrays.h"
#include "registry.h"
#include "routing.h"

namespace nb = nanobind;
using namespace embedlab;

namespace {

using I1 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

using embedlab_py::new_array;

}  // namespace

namespace embedlab_py {

// Shared with routing_cuda_bindings.cc: the per-table rules from the Python lists.
std::vector<RouteTable> route_tables(const char* fn, const std::vector<int>& modes, const std::vector<int64_t>& rows,
                                     const std::vector<int>& ranks) {
  if (rows.size() != modes.size() || ranks.size() != modes.size())
    throw nb::value_error((std::string(fn) + ": modes, rows and ranks need one entry per table").c_str());
  std::vector<RouteTable> t(modes.size());
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i] < 0 || modes[i] > 2)
      throw nb::value_error((std::string(fn) + ": modes[" + std::to_string(i) +
                             "] must be 0 (distributed), 1 (localized) or 2 (hashed)").c_str());
    t[i].mode = static_cast<RouteMode>(modes[i]);
    t[i].rows = rows[i];
    t[i].rank = ranks[i];
  }
  return t;
}

std::string bad_key_message(const RouteStatus& st, const std::vector<int64_t>& offsets, const RouteTable& t) {
  std::string rule = t.mode == RouteMode::kHashed ? "" : " of " + std::to_string(t.rows) + " rows";
  return "key " + std::to_string(st.bad_key) + " at position " +
         std::to_string(st.bad_index - offsets[st.bad_table]) + " of table " + std::to_string(st.bad_table) +
         " is outside the table" + rule;
}

}  // namespace embedlab_py

EMBEDLAB_PY_BINDINGS(routing) {
  m.def(
      "route_keys",
      [](I1 keys, I1 table_offsets, std::vector<int> modes, std::vector<int64_t> rows, std::vector<int> ranks,
         int num_workers, int64_t stride, int num_threads) {
        const char* fn = "route_keys";
        const auto tables = embedlab_py::route_tables(fn, modes, rows, ranks);
        if (table_offsets.shape(0) != tables.size() + 1)
          throw nb::value_error("route_keys: table_offsets needs num_tables + 1 entries");
        std::vector<int64_t> offsets(table_offsets.data(), table_offsets.data() + table_offsets.shape(0));
        const int32_t T = static_cast<int32_t>(tables.size());
        auto counts = new_array<int64_t>({static_cast<size_t>(num_workers), static_cast<size_t>(T)});
        RouteArgs a;
        a.keys = keys.data();
        a.table_offsets = offsets.data();
        a.tables = tables.data();
        a.num_tables = T;
        a.num_workers = num_workers;
        a.nnz = static_cast<int64_t>(keys.shape(0));
        a.counts = counts.data();
        const std::string err = check_route_args(a);
        if (!err.empty()) throw nb::value_error(("route_keys: " + err).c_str());
        static std::unique_ptr<ThreadPool> pool;
        static int pool_threads = -1;
        if (!pool || pool_threads != num_threads) {
          pool = make_thread_pool(num_threads);
          pool_threads = num_threads;
        }
        RouteStatus st;
        {
          nb::gil_scoped_release release;
          st = route_count_cpu(a, pool.get());
        }
        if (st.bad_index >= 0)
          throw nb::value_error(("route_keys: " + embedlab_py::bad_key_message(st, offsets, tables[st.bad_table])).c_str());
        if (stride < 0) stride = std::max<int64_t>(1, st.max_per_owner);
        if (stride > 0 && stride < st.max_per_owner)
          throw nb::value_error(("route_keys: stride " + std::to_string(stride) + " is below the " +
                                 std::to_string(st.max_per_owner) + " keys of the busiest owner").c_str());
        const size_t send_size = stride > 0 ? static_cast<size_t>(num_workers) * stride : static_cast<size_t>(st.total);
        auto send = new_array<int64_t>({send_size});
        auto inverse = new_array<int64_t>({static_cast<size_t>(a.nnz)});
        {
          nb::gil_scoped_release release;
          route_scatter_cpu(a, stride, send.data(), inverse.data(), pool.get());
        }
        return nb::make_tuple(counts, send, inverse, stride);
      },
      nb::arg("keys"), nb::arg("table_offsets"), nb::arg("modes"), nb::arg("rows"), nb::arg("ranks"),
      nb::arg("num_workers"), nb::arg("stride") = -1, nb::arg("num_threads") = 0,
      "Routes the concatenated keys of several tables to num_workers owners (csrc/core/routing.h).\n"
      "modes[t]: 0 distributed (owner k % n, local row k // n), 1 localized on ranks[t], 2 hashed\n"
      "(owner k mod n, the key itself). stride -1: padded to the busiest owner (at least 1), 0: compact.\n"
      "Returns (counts [n, T], send [n * stride] (-1 where unused), inverse [nnz] (-1 for padding), stride).\n"
      "Raises ValueError naming the table, position and key of the first bad key.");
}
