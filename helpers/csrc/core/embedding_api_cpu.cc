// The functions of embedding.h that are the same for every instruction set (validation,
// parsing, COO conversion), and the entry points of the kernels: each calls the copy of
// embedding_cpu.cc compiled for the instruction set this process uses (cpu_isa.h).
#include <algorithm>
#include <numeric>
#include <string>

#include "cpu_isa.h"
#include "embedding.h"

namespace embedlab {

bool parse_combiner(const std::string& name, Combiner* out) {
  if (name == "sum") { *out = Combiner::kSum; return true; }
  if (name == "mean") { *out = Combiner::kMean; return true; }
  return false;
}

namespace {

// Messages are built with std::to_string rather than iostreams: an ostringstream here
// segfaulted on the GPU test machine (cause not established), and these error paths must not
// fail themselves.
std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

std::string check_offsets(const CsrIds& ids) {
  if (ids.batch < 0 || ids.nnz < 0) return "negative size (batch " + str(ids.batch) + ", nnz " + str(ids.nnz) + ")";
  const int64_t* off = ids.row_offsets;
  if (off[0] != 0) return "row_offsets[0] is " + str(off[0]) + ", expected 0";
  for (int64_t r = 0; r < ids.batch; ++r) {
    if (off[r + 1] < off[r])
      return "row_offsets decrease at row " + str(r) + " (" + str(off[r]) + " then " + str(off[r + 1]) + ")";
  }
  if (off[ids.batch] != ids.nnz)
    return "row_offsets end at " + str(off[ids.batch]) + " but there are " + str(ids.nnz) + " keys";
  return "";
}

std::string check_ids(const CsrIds& ids, int64_t num_rows) {
  std::string err = check_offsets(ids);
  if (!err.empty()) return err;
  const int64_t* off = ids.row_offsets;
  for (int64_t j = 0; j < ids.nnz; ++j) {
    const int64_t k = ids.keys[j];
    if (k < -1 || k >= num_rows) {
      const int64_t row = std::upper_bound(off, off + ids.batch + 1, j) - off - 1;
      const std::string where = "key " + str(k) + " at position " + str(j) + " (row " + str(row) + ")";
      if (k < -1) return where + " is negative; only -1 may mark a missing key";
      return where + " is outside the table of " + str(num_rows) + " rows";
    }
  }
  return "";
}

bool strictly_increasing(const int64_t* indices, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (indices[i] <= indices[i - 1]) return false;
  return true;
}

std::string make_optimizer(const std::string& name, float lr, float epsilon, double beta1, double beta2,
                           int64_t step, SparseOptimizer* out) {
  SparseOptimizer o;
  if (name == "sgd") {
    o.kind = OptimizerKind::kSgd;
    o.sgd = {lr};
  } else if (name == "adagrad") {
    o.kind = OptimizerKind::kAdagrad;
    o.adagrad = {lr, epsilon};
  } else if (name == "adam") {
    if (step < 1) return "step must be >= 1, got " + str(step);
    o.kind = OptimizerKind::kAdam;
    o.adam = {lr, beta1, beta2, epsilon, step};
  } else {
    return "optimizer must be 'sgd', 'adagrad' or 'adam', got '" + name + "'";
  }
  *out = o;
  return "";
}

std::string coo_row_offsets_cpu(const int64_t* row_index, int64_t nnz, int64_t batch, int64_t* row_offsets,
                                bool* in_order, int64_t stride) {
  std::fill(row_offsets, row_offsets + batch + 1, 0);
  bool ordered = true;
  int64_t prev = 0;
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t r = row_index[i * stride];
    if (static_cast<uint64_t>(r) >= static_cast<uint64_t>(batch)) {
      return "row index " + str(r) + " at indices[" + str(i) + ", 0] is outside [0, " + str(batch) + ")";
    }
    ordered &= (r >= prev);
    prev = r;
    ++row_offsets[r + 1];
  }
  for (int64_t r = 0; r < batch; ++r) row_offsets[r + 1] += row_offsets[r];
  *in_order = ordered;
  return "";
}

std::string coo_to_csr_cpu(const int64_t* row_index, int64_t nnz, int64_t batch, int64_t* row_offsets,
                           int64_t* perm, int64_t stride) {
  bool in_order = false;
  const std::string err = coo_row_offsets_cpu(row_index, nnz, batch, row_offsets, &in_order, stride);
  if (!err.empty()) return err;
  if (in_order) {
    std::iota(perm, perm + nnz, int64_t{0});
    return "";
  }
  std::vector<int64_t> cursor(row_offsets, row_offsets + batch);
  for (int64_t i = 0; i < nnz; ++i) perm[cursor[row_index[i * stride]]++] = i;
  return "";
}

// ---- the kernels, through the table of the instruction set in use ------------------------

int lookup_forward_cpu(const LookupArgs* tables, int num_tables, ThreadPool& pool) {
  return embedding_kernels().lookup_forward(tables, num_tables, pool);
}

void lookup_forward_coo_cpu(const LookupArgs* tables, const CooRows* coo, int num_tables, ThreadPool& pool,
                            std::vector<int>* status) {
  embedding_kernels().lookup_forward_coo(tables, coo, num_tables, pool, status);
}

void sort_runs_cpu(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
                   std::vector<int64_t>* run_starts, ThreadPool& pool) {
  embedding_kernels().sort_runs(keys, n, key_bound, order, run_starts, pool);
}

int64_t LookupGradCpu::prepare(const LookupGradArgs& args, ThreadPool& pool) {
  return embedding_kernels().grad_prepare(&s_, args, pool);
}

void LookupGradCpu::fill(int64_t* unique_keys, float* rows, ThreadPool& pool) const {
  embedding_kernels().grad_fill(s_, unique_keys, rows, pool);
}

void LookupGradCpu::apply(const SparseUpdateArgs& target, const SparseOptimizer& opt, ThreadPool& pool) const {
  embedding_kernels().grad_apply(s_, target, opt, pool);
}

void coalesce_cpu(const int64_t* indices, const float* rows, int64_t n, int64_t dim, int64_t key_bound,
                  std::vector<int64_t>* out_indices, std::vector<float>* out_rows, ThreadPool& pool) {
  embedding_kernels().coalesce(indices, rows, n, dim, key_bound, out_indices, out_rows, pool);
}

void sparse_sgd_cpu(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool) {
  embedding_kernels().sparse_sgd(tables, num_tables, p, pool);
}

void sparse_adagrad_cpu(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, ThreadPool& pool) {
  embedding_kernels().sparse_adagrad(tables, num_tables, p, pool);
}

void sparse_adam_cpu(const SparseUpdateArgs* tables, int num_tables, AdamParams p, ThreadPool& pool) {
  embedding_kernels().sparse_adam(tables, num_tables, p, pool);
}

void global_adam_cpu(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                     ThreadPool& pool) {
  embedding_kernels().global_adam(tables, rows_used, num_tables, p, pool);
}

int64_t global_adam_catch_up_cpu(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                                 const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                                 const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool) {
  return embedding_kernels().global_adam_catch_up(table, m, v, last, num_rows, dim, rows, n, all_rows, target,
                                                  lr_ring, ring, p, pool);
}

}  // namespace embedlab
