// HugeCTR Norm records: scan (verify, locate) and fill (copy out). See norm_format.h.
#include "norm_format.h"

#include <cstring>

namespace embedlab {

namespace {

inline int32_t load_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // little-endian files on little-endian hosts (x86-64, aarch64)
  return v;
}

NormError fail(NormStatus s, int64_t record, int32_t slot, int64_t offset, int64_t value = 0,
               int64_t value2 = 0) {
  NormError e;
  e.status = s;
  e.record = record;
  e.slot = slot;
  e.offset = offset;
  e.value = value;
  e.value2 = value2;
  return e;
}

}  // namespace

NormError norm_scan(const uint8_t* data, int64_t size, int64_t pos, int64_t n, const NormLayout& L,
                    int64_t* starts, int32_t* nnz) {
  const int64_t fixed = 4 * static_cast<int64_t>(L.label_dim + L.dense_dim);
  const int64_t ks = L.key_bytes;
  const int32_t sn = L.slot_num;
  int64_t p = pos;
  for (int64_t r = 0; r < n; ++r) {
    int32_t* rec_nnz = nnz + r * sn;
    if (L.check) {
      if (p + 4 > size) return fail(NormStatus::kTruncated, r, -1, p);
      const int64_t length = load_i32(data + p);
      if (length < fixed + 4 * static_cast<int64_t>(sn) || p + 4 + length + 1 > size)
        return fail(NormStatus::kBadLength, r, -1, p, length, size - p - 4);
      const int64_t begin = p + 4, end = begin + length;
      uint32_t sum = 0;
      for (int64_t i = begin; i < end; ++i) sum += data[i];
      if ((sum & 0xFF) != data[end]) return fail(NormStatus::kChecksum, r, -1, p, data[end], sum & 0xFF);
      int64_t cur = begin + fixed;
      for (int32_t s = 0; s < sn; ++s) {
        if (cur + 4 > end) return fail(NormStatus::kSlotsPastRecord, r, s, cur);
        const int32_t k = load_i32(data + cur);
        if (k < 0) return fail(NormStatus::kBadNnz, r, s, cur, k);
        cur += 4 + k * ks;
        if (cur > end) return fail(NormStatus::kNnzPastRecord, r, s, cur, k);
        rec_nnz[s] = k;
      }
      if (cur != end) return fail(NormStatus::kLengthMismatch, r, -1, p, length, cur - begin);
      starts[r] = begin;
      p = end + 1;
    } else {
      if (p + fixed > size) return fail(NormStatus::kTruncated, r, -1, p);
      starts[r] = p;
      int64_t cur = p + fixed;
      for (int32_t s = 0; s < sn; ++s) {
        if (cur + 4 > size) return fail(NormStatus::kTruncated, r, s, cur);
        const int32_t k = load_i32(data + cur);
        if (k < 0) return fail(NormStatus::kBadNnz, r, s, cur, k);
        cur += 4 + k * ks;
        rec_nnz[s] = k;
      }
      if (cur > size) return fail(NormStatus::kTruncated, r, -1, starts[r]);
      p = cur;
    }
  }
  if (p != size) return fail(NormStatus::kTrailing, -1, -1, p, size - p);
  return NormError{};
}

int64_t norm_input_splits(const int32_t* nnz, int64_t n, int32_t slot_num, int32_t first_slot,
                          int32_t input_slots, int64_t* splits) {
  int64_t total = 0;
  splits[0] = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t* rec = nnz + r * slot_num + first_slot;
    for (int32_t s = 0; s < input_slots; ++s) {
      total += rec[s];
      splits[r * input_slots + s + 1] = total;
    }
  }
  return total;
}

void norm_fill(const uint8_t* data, const int64_t* starts, const int32_t* nnz, int64_t n,
               const NormLayout& L, float* label, float* dense, const NormInput* inputs, int num_inputs) {
  const int32_t sn = L.slot_num;
  const int64_t ks = L.key_bytes;
  const size_t lb = 4 * static_cast<size_t>(L.label_dim), db = 4 * static_cast<size_t>(L.dense_dim);
  // The byte offset of every slot's first key within its record's payload is a running sum of
  // the nnz before it, so it is recomputed here per record rather than stored by the scan.
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* rec = data + starts[r];
    if (lb) std::memcpy(label + r * L.label_dim, rec, lb);
    if (db) std::memcpy(dense + r * L.dense_dim, rec + lb, db);
    const int32_t* rec_nnz = nnz + r * sn;
    const uint8_t* slot = rec + lb + db;
    int in = 0;
    for (int32_t s = 0; s < sn; ++s) {
      const int32_t k = rec_nnz[s];
      while (in < num_inputs && s >= inputs[in].first_slot + inputs[in].slot_num) ++in;
      if (in < num_inputs && s >= inputs[in].first_slot) {
        const NormInput& I = inputs[in];
        int64_t* out = I.keys + I.splits[r * I.slot_num + (s - I.first_slot)];
        const uint8_t* src = slot + 4;
        if (ks == 8) {
          std::memcpy(out, src, 8 * static_cast<size_t>(k));
        } else {
          for (int32_t j = 0; j < k; ++j) {
            uint32_t v;
            std::memcpy(&v, src + 4 * j, 4);
            out[j] = static_cast<int64_t>(v);
          }
        }
      }
      slot += 4 + k * ks;
    }
  }
}

}  // namespace embedlab
