// What the two routing bindings (routing_bindings.cc on the CPU, routing_cuda_bindings.cc on the
// GPU) share: the per-table rules from the Python lists and the bad-key message.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "routing.h"

namespace embedlab_py {

// The per-table rules from the Python lists.
inline std::vector<embedlab::RouteTable> route_tables(const char* fn, const std::vector<int>& modes,
                                                      const std::vector<int64_t>& rows, const std::vector<int>& ranks) {
  using embedlab::RouteMode;
  if (rows.size() != modes.size() || ranks.size() != modes.size())
    fail(fn, "modes, rows and ranks need one entry per table");
  std::vector<embedlab::RouteTable> t(modes.size());
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i] < 0 || modes[i] > 2)
      fail(fn, "modes[" + std::to_string(i) + "] must be 0 (distributed), 1 (localized) or 2 (hashed)");
    t[i].mode = static_cast<RouteMode>(modes[i]);
    t[i].rows = rows[i];
    t[i].rank = ranks[i];
  }
  return t;
}

inline std::string bad_key_message(const embedlab::RouteStatus& st, const std::vector<int64_t>& offsets,
                                   const embedlab::RouteTable& t) {
  std::string rule = t.mode == embedlab::RouteMode::kHashed ? "" : " of " + std::to_string(t.rows) + " rows";
  return "key " + std::to_string(st.bad_key) + " at position " +
         std::to_string(st.bad_index - offsets[st.bad_table]) + " of table " + std::to_string(st.bad_table) +
         " is outside the table" + rule;
}

}  // namespace embedlab_py
