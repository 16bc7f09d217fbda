// decode_norm: the records of one HugeCTR Norm file (csrc/core/norm_format.h) decoded into
// NumPy arrays for the Session's reader. The GIL is released while the records are scanned
// and copied, so the reader's background thread does not hold up the training loop.
//
// decode_norm(raw, pos, n, label_dim, dense_dim, slot_num, check, key_bytes, inputs)
//   raw: the whole file as a 1-D uint8 array; pos: where the records start (after the header);
//   inputs: [(first_slot, slot_num), ...] in slot order, not overlapping.
// Returns (error, label, dense, nnz, [(splits, keys), ...]). error is None, or a tuple
// (status, record, slot, offset, value, value2) with NormStatus's meaning (the Python side
// words the message); the arrays are then None.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "norm_format.h"
#include "registry.h"

namespace nb = nanobind;
using embedlab_py::new_array;

namespace {

using Raw = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::tuple decode_norm(Raw raw, int64_t pos, int64_t n, int label_dim, int dense_dim, int slot_num, bool check,
                      int key_bytes, const std::vector<std::pair<int, int>>& inputs) {
  const int64_t size = static_cast<int64_t>(raw.shape(0));
  auto bad = [](const std::string& what) { embedlab_py::fail("decode_norm", what); };
  if (pos < 0 || pos > size) bad("pos " + std::to_string(pos) + " is outside the " + std::to_string(size) + " bytes");
  if (n < 0) bad("n must be >= 0, got " + std::to_string(n));
  if (label_dim < 0 || dense_dim < 0 || slot_num < 0) bad("label_dim, dense_dim and slot_num must be >= 0");
  if (key_bytes != 4 && key_bytes != 8) bad("key_bytes must be 4 (uint32) or 8 (int64), got " + std::to_string(key_bytes));
  int next = 0;
  for (const auto& [first, count] : inputs) {
    if (first < next || count < 0 || first + count > slot_num)
      bad("inputs must be (first_slot, slot_num) pairs in slot order, inside the " + std::to_string(slot_num) +
          " slots, not overlapping; got (" + std::to_string(first) + ", " + std::to_string(count) + ")");
    next = first + count;
  }
  embedlab::NormLayout L;
  L.label_dim = label_dim;
  L.dense_dim = dense_dim;
  L.slot_num = slot_num;
  L.check = check;
  L.key_bytes = key_bytes;
  auto starts = new_array<int64_t>({static_cast<size_t>(n)});
  auto nnz = new_array<int32_t>({static_cast<size_t>(n), static_cast<size_t>(slot_num)});
  embedlab::NormError err;
  {
    nb::gil_scoped_release release;
    err = embedlab::norm_scan(raw.data(), size, pos, n, L, starts.data(), nnz.data());
  }
  if (err.status != embedlab::NormStatus::kOk)
    return nb::make_tuple(nb::make_tuple(static_cast<int>(err.status), err.record, err.slot, err.offset, err.value,
                                         err.value2),
                          nb::none(), nb::none(), nb::none(), nb::none());
  auto label = new_array<float>({static_cast<size_t>(n), static_cast<size_t>(label_dim)});
  auto dense = new_array<float>({static_cast<size_t>(n), static_cast<size_t>(dense_dim)});
  std::vector<embedlab::NormInput> ins(inputs.size());
  nb::list out_inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto [first, count] = inputs[i];
    auto splits = new_array<int64_t>({static_cast<size_t>(n * count + 1)});
    const int64_t total = embedlab::norm_input_splits(nnz.data(), n, slot_num, first, count, splits.data());
    auto keys = new_array<int64_t>({static_cast<size_t>(total)});
    ins[i].first_slot = first;
    ins[i].slot_num = count;
    ins[i].splits = splits.data();
    ins[i].keys = keys.data();
    out_inputs.append(nb::make_tuple(splits, keys));
  }
  {
    nb::gil_scoped_release release;
    embedlab::norm_fill(raw.data(), starts.data(), nnz.data(), n, L, label.data(), dense.data(), ins.data(),
                        static_cast<int>(ins.size()));
  }
  return nb::make_tuple(nb::none(), label, dense, nnz, out_inputs);
}

}  // namespace

EMBEDLAB_PY_BINDINGS(norm_format) {
  m.def("decode_norm", &decode_norm, nb::arg("raw"), nb::arg("pos"), nb::arg("n"), nb::arg("label_dim"),
        nb::arg("dense_dim"), nb::arg("slot_num"), nb::arg("check"), nb::arg("key_bytes"), nb::arg("inputs"),
        "Scan, verify and decode the records of one HugeCTR Norm file (see csrc/core/norm_format.h).");
}
