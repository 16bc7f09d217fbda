// EmbedLab core contract: index preparation, the step between a batch's ids and the kernels that
// read them. COO -> CSR conversion of SparseTensor ids, and the stable key sort that groups
// duplicate keys (the backward's and the optimizers'). Plain data only: raw pointers, sizes, a
// ThreadPool. No TensorFlow or Python headers may be included here.
//
// On the GPU the sort is not a separate call: it is the first stage of the backward engine
// (csrc/core/backward_cuda.cuh), which the lookup backward and the optimizers share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thread_pool.h"

namespace embedlab {

// Sorts (key, payload-index) pairs by key, stable in index, and reports the runs of equal
// keys. Used by the backward and by the optimizers to coalesce duplicate indices.
// keys[i] must lie in [0, key_bound). Outputs: order (indices of keys in sorted order) and
// run_starts (offsets into order where a new key starts, plus n at the end).
void sort_runs_cpu(const int64_t* keys, int64_t n, int64_t key_bound,
                   std::vector<int64_t>* order, std::vector<int64_t>* run_starts,
                   ThreadPool& pool);

// COO -> CSR for a [batch, max_nnz] SparseTensor: a stable counting sort by row index.
// Entry i's row is row_index[i * stride] (stride 2 reads a [nnz, 2] indices matrix in place),
// in [0, batch). Writes row_offsets[batch + 1] and perm[nnz] (the position in the COO arrays
// of the j-th CSR entry). Returns "" or an error message.
std::string coo_to_csr_cpu(const int64_t* row_index, int64_t nnz, int64_t batch,
                           int64_t* row_offsets, int64_t* perm, int64_t stride = 1);

// The first half of coo_to_csr_cpu: row_offsets[batch + 1] only, and whether the entries are
// already in row order (*in_order; then the COO values are the CSR keys as they are, which is
// the case for every canonical SparseTensor). One sequential pass. Returns "" or an error.
std::string coo_row_offsets_cpu(const int64_t* row_index, int64_t nnz, int64_t batch,
                                int64_t* row_offsets, bool* in_order, int64_t stride = 1);

}  // namespace embedlab
