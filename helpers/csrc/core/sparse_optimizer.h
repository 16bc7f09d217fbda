// EmbedLab core contract: sparse optimizer updates, applied in place to the table rows a batch
// touched (SGD, Adagrad, lazy Adam, FTRL: Keras semantics), HugeCTR's Global Adam (every row moves at
// every step) with its exact deferred form, and the fused backward + optimizer that applies an
// optimizer straight from the lookup's backward (FBGEMM's "optimizer in backward"). Plain data
// only: raw pointers, sizes, a ThreadPool (CPU) or a cudaStream_t (CUDA). No TensorFlow or
// Python headers may be included here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "embedding.h"
#include "thread_pool.h"

namespace embedlab {

// Sparse optimizer updates, applied in place to the given rows only.
// Indices must be unique and in range (see coalesce_cpu for duplicates).
struct SparseUpdateArgs {
  float* table = nullptr;   // [num_rows, dim]
  float* slot1 = nullptr;   // Adagrad or FTRL accumulator, or Adam m; [num_rows, dim]
  float* slot2 = nullptr;   // Adam v, or FTRL linear z; [num_rows, dim]
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
// The betas are double: Keras computes 1 - beta in Python doubles and rounds once to float.
struct AdamParams { float lr; double beta1; double beta2; float epsilon; int64_t step; };

// FTRL-Proximal, Keras 3 semantics (keras.optimizers.Ftrl.update_step) on touched rows, with
// slot1 = n (the accumulator, initialised by the caller to initial_accumulator_value) and
// slot2 = z (the linear term, initialised to 0). Per element, in Keras' float32 order:
//   l2'  = l2 + beta / (2 lr)
//   g'   = g + (2 l2_shrinkage) w                 (the shrinkage acts on touched rows only)
//   n'   = n + g g                                (the raw gradient, not g')
//   z   += g' - ((n'^-p - n^-p) / lr) w           (p = learning_rate_power <= 0, w before the step)
//   w    = (clip(z, -l1, l1) - z) / (n'^-p / lr + 2 l2')   (0 where |z| <= l1)
//   n    = n'
// Powers: p = -0.5 is a square root and p = 0 is 1 (both exact); any other p is pow in double
// rounded to float (within a few float ulps of Keras' float32 pow; CPU and GPU agree bit for bit
// on -0.5 and 0, and to one rounding otherwise). As in Keras, a row whose n' is 0 with
// l2' = 0 (initial_accumulator_value 0, a zero gradient, no l2 or beta) divides 0 by 0.
// Rows the batch did not touch keep w, n and z (Keras' dense step would recompute w from z
// there, and apply the shrinkage; TensorFlow's sparse FTRL kernels do what this does).
// Valid: lr > 0, lr_power <= 0, l1, l2, l2_shrinkage, beta >= 0, all finite (make_optimizer checks).
struct FtrlParams {
  float lr = 0.001f;
  float lr_power = -0.5f;
  float l1 = 0.f;
  float l2 = 0.f;
  float l2_shrinkage = 0.f;
  float beta = 0.f;
};

// "" when p is a valid FtrlParams, else what is wrong (naming the hyperparameter and value).
std::string check_ftrl(const FtrlParams& p);

// The optimizer a fused backward applies (CPU: LookupGradCpu::apply; CUDA:
// lookup_backward_apply_cuda).
enum class OptimizerKind : int32_t { kSgd = 0, kAdagrad = 1, kAdam = 2, kFtrl = 3 };
struct SparseOptimizer {
  OptimizerKind kind = OptimizerKind::kSgd;
  SgdParams sgd{0.f};
  AdagradParams adagrad{0.f, 0.f};
  AdamParams adam{0.f, 0.9f, 0.999f, 1e-7f, 1};
  FtrlParams ftrl{};
};

// A SparseOptimizer from its name ("sgd" | "adagrad" | "adam" | "ftrl") and hyperparameters
// (those the optimizer does not use are ignored). "ftrl" takes lr from `lr` and the rest from
// `ftrl` (required for it, checked with check_ftrl). Returns "" or what was wrong.
std::string make_optimizer(const std::string& name, float lr, float epsilon, double beta1, double beta2,
                           int64_t step, SparseOptimizer* out, const FtrlParams* ftrl = nullptr);

void sparse_sgd_cpu(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool);
void sparse_adagrad_cpu(const SparseUpdateArgs* tables, int num_tables, AdagradParams p,
                        ThreadPool& pool);
void sparse_adam_cpu(const SparseUpdateArgs* tables, int num_tables, AdamParams p,
                     ThreadPool& pool);
// FTRL (see FtrlParams): slot1 = accumulator n, slot2 = linear z. Indices unique, as above.
void sparse_ftrl_cpu(const SparseUpdateArgs* tables, int num_tables, FtrlParams p, ThreadPool& pool);

// Global Adam (HugeCTR's update_type "Global"): in one pass over rows [0, rows_used[t]) of each
// table, the given rows (unique, ascending) take AdamRow's update with their gradient and every
// other row the same update with a zero gradient (m and v decay, w still moves by
// alpha m / (sqrt(v) + eps)). Rows past rows_used[t] are not read: a row whose m and v are zero
// does not move under a zero gradient, so callers pass the number of rows ever used. Rows
// past it that appear in indices are updated too (the pass is extended to the last index).
void global_adam_cpu(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                     ThreadPool& pool);

// Deferred Global Adam, exact: a row that no batch touches gets, at each step, the update with
// a zero gradient, which needs nothing but the row's own state and the step's alpha. So instead
// of a pass over every row at every step, a row carries the last step it is current through
// (`last`), and before anything reads it the missed steps are replayed on it in order, with the
// same float operations as global_adam_cpu's untouched rows, so the same bits. Replaying a few
// steps on a row costs arithmetic on data in cache, not memory traffic.
//
// global_adam_catch_up_cpu brings rows up to step `target`: each row r with last[r] < target
// takes steps last[r] + 1 .. target with a zero gradient, then last[r] = target. The rows are
// rows[0 .. n) (any order; repeats are done once) or, when all_rows >= 0, rows [0, all_rows).
// lr_ring[j % ring] is the learning rate of step j; a row more than `ring` - 1 steps behind
// cannot be replayed and is an error: returns the first such row, or -1 (then nothing was
// written). Other AdamParams fields: beta1, beta2, epsilon (lr and step are per replayed step).
int64_t global_adam_catch_up_cpu(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                                 const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                                 const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool);

// True when indices are strictly increasing (so unique): the optimizers' fast path.
bool strictly_increasing(const int64_t* indices, int64_t n);

// Coalesces duplicate indices: out_indices ascending unique, out_rows summed in input order.
void coalesce_cpu(const int64_t* indices, const float* rows, int64_t n, int64_t dim,
                  int64_t key_bound, std::vector<int64_t>* out_indices,
                  std::vector<float>* out_rows, ThreadPool& pool);

}  // namespace embedlab

// =======================================================================================
// CUDA. Declared only when the CUDA kernels are built (EMBEDLAB_WITH_CUDA); the
// implementation is csrc/core/sparse_optimizer_cuda.cu, with the conventions of the CUDA
// section of embedding.h (device pointers in host structs, work enqueued on `stream`,
// caller-provided workspace, the CPU's bits). The CPU's fused backward + optimizer is
// LookupGradCpu::apply (embedding.h), implemented in sparse_optimizer_cpu.cc.
// =======================================================================================
#ifdef EMBEDLAB_WITH_CUDA
#include <cuda_runtime_api.h>

namespace embedlab {

// Fused backward + optimizer: sorts the keys, sums each key's gradient row and applies the
// optimizer to that table row (and its slots) directly; the gradient is never written out.
// `target` gives table/slot1/slot2/num_rows/dim (its indices, grads and n are ignored).
// Equal to lookup_backward + sparse_<opt> on the unique keys, bit for bit.
cudaError_t lookup_backward_apply_cuda(const LookupGradArgs& grad, const SparseUpdateArgs& target,
                                       const SparseOptimizer& opt, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream);
// The same for several tables at once: up to 32 tables share one sort and one set of launches
// (table t's keys are offset by the row counts of the tables before it), with the same bits as
// table-by-table calls. Tables may differ in size, dim, combiner and weights.
size_t lookup_backward_apply_cuda_workspace(const LookupGradArgs* grads, const SparseUpdateArgs* targets,
                                            int num_tables, cudaError_t* err = nullptr);
cudaError_t lookup_backward_apply_cuda(const LookupGradArgs* grads, const SparseUpdateArgs* targets, int num_tables,
                                       const SparseOptimizer& opt, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream);

// Sparse optimizer updates. Unlike the CPU versions, indices may repeat and come in any order:
// duplicates are summed first (in input order), as the TensorFlow ops promise. Indices must lie
// in [0, num_rows) (check with check_ids_cuda, allow_missing = false). Up to 32 tables share
// one sort (see the multi-table lookup_backward_apply_cuda); the workspace is
// sparse_update_cuda_workspace(tables, num_tables) bytes.
size_t sparse_update_cuda_workspace(const SparseUpdateArgs* tables, int num_tables, cudaError_t* err = nullptr);
cudaError_t sparse_sgd_cuda(const SparseUpdateArgs* tables, int num_tables, SgdParams p, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream);
cudaError_t sparse_adagrad_cuda(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);
cudaError_t sparse_adam_cuda(const SparseUpdateArgs* tables, int num_tables, AdamParams p, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream);
cudaError_t sparse_ftrl_cuda(const SparseUpdateArgs* tables, int num_tables, FtrlParams p, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream);

}  // namespace embedlab
#endif  // EMBEDLAB_WITH_CUDA
