// A minimal parallel-for interface so that core kernels can run on TensorFlow's intra-op
// pool (csrc/tf) or on a plain std::thread pool (csrc/py, benchmarks) without knowing which.
//
// Contract: parallel_for(n, cost, fn) calls fn(begin, end) on disjoint blocks that cover
// [0, n) exactly once and returns when every call has finished. Kernels never rely on how
// the range is split, so results are the same for any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace embedlab {

class ThreadPool {
 public:
  virtual ~ThreadPool() = default;
  virtual int num_threads() const = 0;
  // cost_per_unit: rough nanoseconds per element; pools may use it to pick the block size.
  virtual void parallel_for(int64_t n, int64_t cost_per_unit,
                            const std::function<void(int64_t, int64_t)>& fn) = 0;
};

// A pool of num_threads - 1 worker threads plus the calling thread. num_threads <= 0 means
// std::thread::hardware_concurrency().
std::unique_ptr<ThreadPool> make_thread_pool(int num_threads);

// Runs everything on the calling thread (tests, tiny inputs).
ThreadPool& inline_pool();

}  // namespace embedlab
