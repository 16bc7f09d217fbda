// EmbedLab core contract: pooled multi-table embedding lookup and its backward. The optimizers
// (and the fused backward + optimizer) are in sparse_optimizer.h, the key sort and the COO -> CSR
// conversion in csr.h. Plain data only: raw pointers, sizes, a ThreadPool (CPU) or a
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

// The row_offsets part of check_ids alone (O(batch)): what must hold before any kernel other
// than lookup_forward_cpu (which checks them itself) may read the ids.
std::string check_offsets(const CsrIds& ids);

// ---------------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------------

// Forward of num_tables independent lookups, parallel over (table, row block). Validates its
// input on the fly instead of in separate passes: row_offsets (their ends up front, each row's
// pair as it is reached) and keys, so that no key or weight outside [0, nnz) and no row outside
// the table is ever read. Returns the index of the first table whose offsets or keys were bad
// (then outputs are unspecified; call check_ids for the message), or -1.
int lookup_forward_cpu(const LookupArgs* tables, int num_tables, ThreadPool& pool);

// The same forward straight from COO ids, without a conversion pass: entry j of table t belongs
// to output row coo[t].row_index[j * coo[t].stride] (a [nnz, rank] SparseTensor indices matrix
// read in place), and ids.keys / ids.weights are the COO values. The kernel reads each entry's
// row in the same pass as its key and writes the CSR offsets it finds to coo[t].row_offsets
// ([batch + 1]; tables[t].ids.row_offsets is ignored), which is what the backward needs. It
// relies on the entries being in row order (every canonical SparseTensor is); a table whose
// rows are out of order or outside [0, batch) is only detected, not looked up: status[t] says
// kCooUnordered and the caller converts that table (coo_to_csr_cpu, csr.h) and runs
// lookup_forward_cpu on it. status[t] is kCooBadKey for a key outside [-1, num_rows) (call
// check_ids with the offsets written for the message), else kCooOk.
struct CooRows {
  const int64_t* row_index = nullptr;
  int64_t stride = 1;
  int64_t* row_offsets = nullptr;  // output, [batch + 1]
};
enum CooStatus : int { kCooOk = 0, kCooBadKey = 1, kCooUnordered = 2 };
void lookup_forward_coo_cpu(const LookupArgs* tables, const CooRows* coo, int num_tables, ThreadPool& pool,
                            std::vector<int>* status);

// Backward of one table. Two phases because the number of unique keys is only known after
// sorting: prepare() sorts and returns the count; fill() writes the outputs.
struct LookupGradArgs {
  CsrIds ids;
  Combiner combiner = Combiner::kSum;
  int64_t dim = 0;
  const float* grad_out = nullptr;  // [ids.batch, dim], the gradient of the forward output
};

struct SparseUpdateArgs;  // sparse_optimizer.h
struct SparseOptimizer;

class LookupGradCpu {
 public:
  // Returns the number of unique valid keys. Keys below -1 are skipped here; min_key() tells.
  int64_t prepare(const LookupGradArgs& args, ThreadPool& pool);
  // unique_keys[n_unique] (ascending), rows[n_unique, dim].
  void fill(int64_t* unique_keys, float* rows, ThreadPool& pool) const;
  // Fused backward + optimizer (FBGEMM's "optimizer in backward"): sums each unique key's
  // gradient row exactly as fill() does, into a buffer this object keeps, and applies `opt` to
  // those table rows (and their slots) in place. `target` gives table / slot1 / slot2 /
  // num_rows / dim (its indices, grads and n are ignored). Equal to fill() followed by
  // sparse_<opt>_cpu on the unique keys, bit for bit. Needs min_key() >= -1 and
  // max_key() < target.num_rows (the caller checks; nothing is checked here). Implemented with
  // the optimizers, in sparse_optimizer_cpu.cc.
  void apply(const SparseUpdateArgs& target, const SparseOptimizer& opt, ThreadPool& pool) const;
  int64_t num_unique() const { return static_cast<int64_t>(s_.unique_keys.size()); }
  // The smallest key prepare() saw (any key, -1 and invalid ones included) and the largest
  // valid one; -1 when there were none. Lets adapters validate without another pass.
  int64_t min_key() const { return s_.min_key; }
  int64_t max_key() const { return s_.max_key; }

  // What prepare() leaves for fill() and apply(). A public type only because the kernels are
  // compiled once per instruction set (cpu_isa.h) and take it as an argument; callers use the
  // methods above.
  struct State {
    LookupGradArgs args;
    int64_t min_key = -1, max_key = -1;
    std::vector<int64_t> unique_keys;  // the valid keys, sorted, each once
    std::vector<int64_t> slot_of_pos;  // [nnz] index into unique_keys of each position's key; -1 if none
  };

 private:
  // All buffers keep their capacity: an object reused across calls (the TF op keeps one per
  // table) allocates nothing after the first call, so worker threads take no page faults.
  // Scratch that only one call reads (the sort's buffers, apply()'s summed rows, fill()'s
  // first-touch flags) belongs to the calling thread instead (thread_local in
  // embedding_cpu.cc and sparse_optimizer_cpu.cc), where it stays in cache from one table to
  // the next.
  State s_;
};

}  // namespace embedlab

// =======================================================================================
// CUDA. Declared only when the CUDA kernels are built (EMBEDLAB_WITH_CUDA); the
// implementation is csrc/core/embedding_cuda.cu, over the backward engine of backward_cuda.cuh.
// Same semantics as the CPU functions above. These conventions hold for the CUDA functions of
// sparse_optimizer.h too.
//
//   * Every pointer inside the argument structs is a DEVICE pointer (the structs themselves
//     live on the host). Work is enqueued on `stream`; nothing synchronizes unless its comment
//     says so. Each function returns the first CUDA error it met (API call or launch).
//   * Rounding: the forward and every optimizer use the CPU's exact float32 expression order
//     and no fused multiply-adds (explicit __fadd_rn/__fmul_rn), so they give the CPU's bits
//     whenever the CPU build does not contract to FMA either (the default on x86-64).
//   * The backward sums the contributions to one key in increasing position j, in segments of
//     kCudaSegment consecutive contributions; a key touched more than kCudaSegment times gets
//     its segment sums added in a fixed tree (fixed by the input alone). So results are the
//     same bits on every run, and equal to the CPU bits for keys touched <= kCudaSegment times;
//     hotter keys differ from the CPU only by float32 rounding. No float atomics anywhere.
//   * Workspace: functions that need scratch memory take a caller-provided device buffer of at
//     least the size returned by the matching *_workspace() query (256-byte aligned).
//   * Sizes: nnz and batch must be < 2^31 per table (int32 positions inside the sort).
// =======================================================================================
#ifdef EMBEDLAB_WITH_CUDA
#include <cuda_runtime_api.h>

namespace embedlab {

constexpr int kCudaSegment = 32;

// Fused multi-table forward: one kernel launch per 32 tables.
cudaError_t lookup_forward_cuda(const LookupArgs* tables, int num_tables, cudaStream_t stream);
// Benchmark knob (process-wide, not thread-safe; results are identical, only speed changes):
// output rows per thread group, key steps unrolled, and the resident blocks per SM the forward
// kernel must allow (1 = compiler's choice). Only the compiled combinations are accepted
// (see kForwardVariants in embedding_cuda.cu); returns false and changes nothing otherwise.
bool set_cuda_forward_variant(int rows_per_group, int unroll, int min_blocks);
void get_cuda_forward_variant(int* rows_per_group, int* unroll, int* min_blocks);
// Backward benchmark knob (same bits): load the optimizer state before summing the gradient
// (prefetch) and the reduction kernel's min resident blocks per SM (1 or 4).
bool set_cuda_backward_variant(bool prefetch, int min_blocks);
void get_cuda_backward_variant(bool* prefetch, int* min_blocks);

// Validates ids on the device. allow_missing: whether -1 is allowed (lookups: yes; optimizer
// indices: no). Returns "" or the same message check_ids() gives. SYNCHRONIZES the stream (it
// reads a 24-byte status back; on error it copies the ids to the host to word the message).
// `workspace` needs check_ids_cuda_workspace() bytes. *err gets any CUDA error.
size_t check_ids_cuda_workspace();
// max_key (optional): receives the largest valid key, or -1 if none (the backward's sort needs
// only the bits of this bound when the table size is unknown, as in EmbedLabFusedLookupGrad).
std::string check_ids_cuda(const CsrIds& ids, int64_t num_rows, bool allow_missing, void* workspace,
                           cudaStream_t stream, cudaError_t* err, int64_t* max_key = nullptr);

// Backward of one table to (unique_keys ascending, summed rows). The count is only known on
// the device, so the outputs are sized for the worst case: unique_keys[nnz], rows[nnz, dim];
// *num_unique (device int64) receives the count and entries past it are left untouched.
// CUDA extension: ids.row_offsets == nullptr means one key per row (batch == nnz), which is
// how the optimizers (sparse_optimizer.h) coalesce duplicate indices.
size_t lookup_backward_cuda_workspace(int64_t batch, int64_t nnz, int64_t dim, int64_t num_rows,
                                      cudaError_t* err = nullptr);
cudaError_t lookup_backward_cuda(const LookupGradArgs& args, int64_t num_rows, int64_t* unique_keys, float* rows,
                                 int64_t* num_unique, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The floor every lookup is measured against (benchmarks): out[i, :] = table[rows[i], :], one
// thread per 16-byte chunk (dim % 4 == 0, 16-byte aligned) or per float; no offsets, no
// combiner, no key check (a row outside [0, num_rows) gives a zero row).
cudaError_t gather_rows_cuda(const float* table, int64_t num_rows, int64_t dim, const int64_t* rows, int64_t n,
                             float* out, cudaStream_t stream);

}  // namespace embedlab
#endif  // EMBEDLAB_WITH_CUDA
