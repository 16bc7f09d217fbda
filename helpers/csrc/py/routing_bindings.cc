// route_keys: csrc/core/routing.h over NumPy arrays (the CPU oracle of the CUDA version and of
// embedlab.sok's exchange).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common.h"
#include "registry.h"
#include "routing.h"
#include "routing_bindings.h"

namespace nb = nanobind;
using namespace embedlab;

namespace {

using I1 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

using embedlab_py::fail;
using embedlab_py::new_array;

}  // namespace

EMBEDLAB_PY_BINDINGS(routing) {
  m.def(
      "route_keys",
      [](I1 keys, I1 table_offsets, std::vector<int> modes, std::vector<int64_t> rows, std::vector<int> ranks,
         int num_workers, int64_t stride, int num_threads) {
        const char* fn = "route_keys";
        const auto tables = embedlab_py::route_tables(fn, modes, rows, ranks);
        if (table_offsets.shape(0) != tables.size() + 1)
          fail(fn, "table_offsets needs num_tables + 1 entries");
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
        if (!err.empty()) fail(fn, err);
        ThreadPool& pool = embedlab_py::pool(num_threads);
        RouteStatus st;
        {
          nb::gil_scoped_release release;
          st = route_count_cpu(a, &pool);
        }
        if (st.bad_index >= 0)
          fail(fn, embedlab_py::bad_key_message(st, offsets, tables[st.bad_table]));
        if (stride < 0) stride = std::max<int64_t>(1, st.max_per_owner);
        if (stride > 0 && stride < st.max_per_owner)
          fail(fn, "stride " + std::to_string(stride) + " is below the " + std::to_string(st.max_per_owner) +
                       " keys of the busiest owner");
        const size_t send_size = stride > 0 ? static_cast<size_t>(num_workers) * stride : static_cast<size_t>(st.total);
        auto send = new_array<int64_t>({send_size});
        auto inverse = new_array<int64_t>({static_cast<size_t>(a.nnz)});
        {
          nb::gil_scoped_release release;
          route_scatter_cpu(a, stride, send.data(), inverse.data(), &pool);
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
