// EmbedLab core: decoding and verifying the records of a HugeCTR "Norm" data file (the
// Session's reader). Plain data only: raw pointers and sizes, no TensorFlow or Python headers.
//
// A Norm file is a 64-byte header (read by the caller) and `n` records. Each record is
//   float label[label_dim], float dense[dense_dim], then per slot: int32 nnz, nnz keys
// (keys uint32 or int64, `key_bytes` 4 or 8). With error checking (`check`) each record is
// framed: int32 length of the payload, the payload, one checksum byte (the payload's byte sum
// mod 256).
//
// Decoding is two calls (and norm_input_splits between them, to size the key arrays):
//   1. norm_scan walks the records once, verifies every length prefix, checksum, nnz and the
//      file's size, and records where each record's payload starts and each slot's nnz;
//   2. norm_fill copies label and dense rows and the keys of each sparse input into the
//      caller's arrays, in sample-major CSR order (row r * slot_num + s holds record r's keys
//      of the input's slot s), widening keys to int64.
// norm_scan reports the first bad record it meets (in file order) and writes nothing else
// meaningful; norm_fill must only run on a scan that returned kOk.
#pragma once

#include <cstdint>

namespace embedlab {

struct NormLayout {
  int32_t label_dim = 1;
  int32_t dense_dim = 0;
  int32_t slot_num = 0;
  bool check = true;     // records are framed by a length prefix and a checksum byte
  int32_t key_bytes = 4; // 4: uint32 keys, 8: int64 keys
};

enum class NormStatus : int32_t {
  kOk = 0,
  kTruncated = 1,       // the file ends inside record `record` (slot `slot` if >= 0) at `offset`
  kBadLength = 2,       // length prefix `value` of record `record` at `offset` is impossible; `value2` bytes left
  kChecksum = 3,        // record `record` at `offset`: stored checksum `value`, computed `value2`
  kBadNnz = 4,          // record `record`, slot `slot` at `offset`: nnz `value` < 0
  kSlotsPastRecord = 5, // framed record `record`: slot `slot` starts past the length prefix's end
  kNnzPastRecord = 6,   // framed record `record`: slot `slot`'s nnz `value` runs past the record's end
  kLengthMismatch = 7,  // framed record `record` at `offset`: length prefix `value`, fields take `value2`
  kTrailing = 8,        // `value` unexpected bytes after the last record, at `offset`
};

struct NormError {
  NormStatus status = NormStatus::kOk;
  int64_t record = -1;
  int32_t slot = -1;
  int64_t offset = -1;
  int64_t value = 0;
  int64_t value2 = 0;
};

// Walks `n` records of `data[pos, size)`. On kOk, `starts[r]` is the byte offset of record r's
// payload (its label) and `nnz[r * slot_num + s]` the key count of its slot s.
NormError norm_scan(const uint8_t* data, int64_t size, int64_t pos, int64_t n, const NormLayout& layout,
                    int64_t* starts, int32_t* nnz);

// One sparse input: slots [first_slot, first_slot + slot_num) of every record. `splits` has
// n * slot_num + 1 entries (computed by the caller from nnz, splits[0] = 0); `keys` has
// splits[n * slot_num] entries.
struct NormInput {
  int32_t first_slot = 0;
  int32_t slot_num = 0;
  const int64_t* splits = nullptr;
  int64_t* keys = nullptr;
};

// The CSR row splits of one input (n * input_slots + 1 entries) from a scan's nnz; returns
// the input's key count (splits[n * input_slots]).
int64_t norm_input_splits(const int32_t* nnz, int64_t n, int32_t slot_num, int32_t first_slot,
                          int32_t input_slots, int64_t* splits);

// Fills label [n, label_dim] and dense [n, dense_dim] (row-major float32; either may be null
// when its dim is 0) and each input's keys, from a scan that returned kOk.
void norm_fill(const uint8_t* data, const int64_t* starts, const int32_t* nnz, int64_t n,
               const NormLayout& layout, float* label, float* dense, const NormInput* inputs,
               int num_inputs);

}  // namespace embedlab
