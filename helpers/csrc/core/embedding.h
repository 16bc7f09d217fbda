// EmbedLab core contract: pooled multi-table embedding lookup, its backward, and sparse
// optimizer updates. Plain data only: raw pointers, sizes, a ThreadPool (CPU) or a
// cudaStream_t (CUDA). No TensorFlow or Python headers may be included here.
//
// Conventions
//   * Keys are int64. Key -1 means "no key" and is skipped; any other key must lie in
//     [0, num_rows). Callers validate with check_lookup() before calling a kernel: kernels
//     themselves assume valid input.
//   * Each table's ids come as CSR: row_offsets[batch + 1] (row_offsets[0] == 0,
//     non-decreasing, row_offsets[batch] == nnz) and keys[nnz]; weights[nnz] is optional.
//   * Combiner sum:  out[r] = sum_j w_j * table[key_j]        (w_j = 1 without weights)
//     Combiner mean: out[r] = sum_j w_j * table[key_j] / sum_j w_j, over valid keys only;
//                    a row whose weight sum is 0 (empty row) gives zeros.
//   * Floating-point order: within an output row, terms are added in increasing j. Every
//     implementation (CPU, CUDA) follows this, so results are bitwise reproducible run to run.
//   * The backward produces, per table, the sorted unique keys touched and the summed
//     gradient rows, i.e. what an IndexedSlices gradient holds. Contributions to one key are
//     added in increasing position j, whatever the thread count: deterministic bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thread_pool.h"

namespace embedlab {

enum class Combiner : int32_t { kSum = 0, kMean = 1 };

// Parses "sum" / "mean"; returns false for anything else.
bool parse_combiner(const std::string& name, Combiner* out);

// CSR ids of one table (shared by forward, backward and validation).
struct CsrIds {
  const int64_t* row_offsets = nullptr;  // [batch + 1]
  const int64_t* keys = nullptr;         // [nnz]
  const float* weights = nullptr;        // [nnz] or nullptr
  int64_t batch = 0;
  int64_t nnz = 0;
};

// One table of a fused forward.
struct LookupArgs {
  const float* table = nullptr;  // [num_rows, dim], row-major
  int64_t num_rows = 0;
  int64_t dim = 0;
  CsrIds ids;
  Combiner combiner = Combiner::kSum;
  float* out = nullptr;  // [ids.batch, dim]; every element is written
};

// Validates one table's ids against num_rows. Returns "" when valid, otherwise a message
// naming the bad value and where it is, e.g.
//   "key 1048577 at position 3 (row 1) is outside the table of 1048576 rows".
// The message does not name the op or argument: adapters prefix those.
std::string check_ids(const CsrIds& ids, int64_t num_rows);

// ---------------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------------

// Forward of num_tables independent lookups, parallel over (table, row block).
void lookup_forward_cpu(const LookupArgs* tables, int num_tables, ThreadPool& pool);

// Backward of one table. Two phases because the number of unique keys is only known after
// sorting: prepare() sorts and returns the count; fill() writes the outputs.
struct LookupGradArgs {
  CsrIds ids;
  Combiner combiner = Combiner::kSum;
  int64_t dim = 0;
  const float* grad_out = nullptr;  // [ids.batch, dim], the gradient of the forward output
};

class LookupGradCpu {
 public:
  // Returns the number of unique valid keys.
  int64_t prepare(const LookupGradArgs& args, ThreadPool& pool);
  // unique_keys[n_unique] (ascending), rows[n_unique, dim].
  void fill(int64_t* unique_keys, float* rows, ThreadPool& pool) const;
  int64_t num_unique() const { return static_cast<int64_t>(run_starts_.size()) - 1; }

 private:
  LookupGradArgs args_;
  std::vector<int64_t> sorted_keys_;  // valid keys, sorted by (key, position)
  std::vector<int64_t> sorted_pos_;   // their positions j
  std::vector<int64_t> row_of_pos_;   // [nnz] row of each position
  std::vector<float> row_scale_;      // [batch] 1 or 1 / sum_w for mean
  std::vector<int64_t> run_starts_;   // start of each unique-key run, plus an end sentinel
};

// Sorts (key, payload-index) pairs by key, stable in index, and reports the runs of equal
// keys. Used by the backward and by the optimizers to coalesce duplicate indices.
// keys[i] must lie in [0, key_bound). Outputs: order (indices of keys in sorted order) and
// run_starts (offsets into order where a new key starts, plus n at the end).
void sort_runs_cpu(const int64_t* keys, int64_t n, int64_t key_bound,
                   std::vector<int64_t>* order, std::vector<int64_t>* run_starts,
                   ThreadPool& pool);

// Sparse optimizer updates, applied in place to the given rows only.
// Indices must be unique and in range (see coalesce_cpu for duplicates).
struct SparseUpdateArgs {
  float* table = nullptr;   // [num_rows, dim]
  float* slot1 = nullptr;   // Adagrad accumulator, or Adam m; [num_rows, dim]
  float* slot2 = nullptr;   // Adam v; [num_rows, dim]
  int64_t num_rows = 0;
  int64_t dim = 0;
  const int64_t* indices = nullptr;  // [n], unique, in [0, num_rows)
  const float* grads = nullptr;      // [n, dim]
  int64_t n = 0;
};

struct SgdParams { float lr; };
// Keras semantics: acc += g*g; w -= lr * g / sqrt(acc + epsilon).
struct AdagradParams { float lr; float epsilon; };
// Lazy Adam, Keras semantics on touched rows: m += (g - m)(1 - b1); v += (g*g - v)(1 - b2);
// w -= alpha * m / (sqrt(v) + epsilon), alpha = lr * sqrt(1 - b2^t) / (1 - b1^t), t = step.
struct AdamParams { float lr; float beta1; float beta2; float epsilon; int64_t step; };

void sparse_sgd_cpu(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool);
void sparse_adagrad_cpu(const SparseUpdateArgs* tables, int num_tables, AdagradParams p,
                        ThreadPool& pool);
void sparse_adam_cpu(const SparseUpdateArgs* tables, int num_tables, AdamParams p,
                     ThreadPool& pool);

// True when indices are strictly increasing (so unique): the optimizers' fast path.
bool strictly_increasing(const int64_t* indices, int64_t n);

// Coalesces duplicate indices: out_indices ascending unique, out_rows summed in input order.
void coalesce_cpu(const int64_t* indices, const float* rows, int64_t n, int64_t dim,
                  int64_t key_bound, std::vector<int64_t>* out_indices,
                  std::vector<float>* out_rows, ThreadPool& pool);

// COO -> CSR for a [batch, max_nnz] SparseTensor: a stable counting sort by row index.
// row_index[nnz] in [0, batch). Writes row_offsets[batch + 1] and perm[nnz] (the position
// in the COO arrays of the j-th CSR entry). Returns "" or an error message.
std::string coo_to_csr_cpu(const int64_t* row_index, int64_t nnz, int64_t batch,
                           int64_t* row_offsets, int64_t* perm);

}  // namespace embedlab
