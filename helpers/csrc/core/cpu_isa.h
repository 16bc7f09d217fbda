// The instruction sets of the CPU kernels, and the one this process runs.
//
// embedding_cpu.cc (the lookup, backward and optimizer kernels: the code whose speed depends on
// the vector width) is compiled once per instruction set, into namespace embedlab::baseline
// (x86-64's SSE2) and, where CMake builds it (EMBEDLAB_CPU_ISA=AUTO on x86-64),
// embedlab::avx2. Each copy exports one table of entry points (EmbeddingKernels). The public
// functions of embedding.h (embedding_api_cpu.cc) call through the table chosen on first use:
// one predictable branch and one indirect call per kernel call, nothing per row or per key.
// The rest of the core is compiled for the baseline only: with AVX2 nothing in it vectorizes
// beyond a few copies.
//
// The choice: the best instruction set this CPU supports among those built, unless the
// environment variable EMBEDLAB_CPU_ISA_RUNTIME=baseline forces the baseline (tests compare
// both paths bit for bit; `auto`, unset or empty choose). Python's embedlab._native reads the
// same variable, rejects any other value and refuses `avx2` where it cannot run, before it
// loads a library; this code never raises and never picks what the CPU lacks.
#pragma once

#include <cstdint>
#include <vector>

#include "embedding.h"
#include "thread_pool.h"

namespace embedlab {

enum class CpuIsa : int32_t { kBaseline = 0, kAvx2 = 1 };

// The instruction set this process's kernels use (chosen once, at the first call).
CpuIsa cpu_isa();
// "baseline" | "avx2".
const char* cpu_isa_name(CpuIsa isa);
// The instruction sets compiled into this library, comma-separated: "baseline" or "baseline,avx2".
const char* cpu_isas_built();

// The entry points of one compiled copy of embedding_cpu.cc; same contracts as embedding.h.
struct EmbeddingKernels {
  CpuIsa isa;
  int (*lookup_forward)(const LookupArgs* tables, int num_tables, ThreadPool& pool);
  void (*lookup_forward_coo)(const LookupArgs* tables, const CooRows* coo, int num_tables, ThreadPool& pool,
                             std::vector<int>* status);
  void (*sort_runs)(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
                    std::vector<int64_t>* run_starts, ThreadPool& pool);
  int64_t (*grad_prepare)(LookupGradCpu::State* s, const LookupGradArgs& args, ThreadPool& pool);
  void (*grad_fill)(const LookupGradCpu::State& s, int64_t* unique_keys, float* rows, ThreadPool& pool);
  void (*grad_apply)(const LookupGradCpu::State& s, const SparseUpdateArgs& target, const SparseOptimizer& opt,
                     ThreadPool& pool);
  void (*sparse_sgd)(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool);
  void (*sparse_adagrad)(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, ThreadPool& pool);
  void (*sparse_adam)(const SparseUpdateArgs* tables, int num_tables, AdamParams p, ThreadPool& pool);
  void (*global_adam)(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                      ThreadPool& pool);
  int64_t (*global_adam_catch_up)(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                                  const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                                  const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool);
  void (*coalesce)(const int64_t* indices, const float* rows, int64_t n, int64_t dim, int64_t key_bound,
                   std::vector<int64_t>* out_indices, std::vector<float>* out_rows, ThreadPool& pool);
};

// The table of cpu_isa()'s copy.
const EmbeddingKernels& embedding_kernels();

// One table per compiled copy (defined at the end of embedding_cpu.cc).
namespace baseline {
extern const EmbeddingKernels kEmbeddingKernels;
}
#if defined(EMBEDLAB_CPU_HAVE_AVX2)
namespace avx2 {
extern const EmbeddingKernels kEmbeddingKernels;
}
#endif

}  // namespace embedlab

// For callers that see only the shared library (ctypes, tests): the instruction set its
// kernels run, "baseline" or "avx2" (cpu_isa_name(cpu_isa())).
extern "C" __attribute__((visibility("default"))) const char* embedlab_cpu_isa();
