// TensorFlow's intra-op thread pool behind the core embedlab::ThreadPool interface, for every
// CPU adapter in csrc/tf (embedding, hash table, routing, HPS kernels).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/platform/threadpool.h"

#include "thread_pool.h"

namespace tensorflow {
namespace embedlab_tf {

// Adapts TensorFlow's intra-op pool to the core ThreadPool interface.
class TfPool final : public embedlab::ThreadPool {
 public:
  explicit TfPool(OpKernelContext* ctx) : TfPool(ctx->device()->tensorflow_cpu_worker_threads()->workers) {}
  explicit TfPool(thread::ThreadPool* pool) : pool_(pool) {}
  int num_threads() const override { return pool_->NumThreads(); }
  void parallel_for(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n <= 0) return;
    const int threads = pool_->NumThreads();
    // Below ~20 us of work, waking threads costs more than it saves.
    if (threads <= 1 || n * std::max<int64_t>(cost, 1) < 20000) {
      fn(0, n);
      return;
    }
    // A fixed number of equal contiguous blocks, kBlocksPerThread per thread, taken by whichever
    // thread is free. Eigen's cost model splits by the estimated cycles per unit, but our units
    // are DRAM-latency bound (a random row each), so its estimate is off by an order of magnitude
    // and it under-splits. One block per thread was better than that, but a thread that is late
    // (busy with another op, or its vCPU descheduled) then holds up the whole op; with 8 blocks
    // per thread the others take over its share.
    constexpr int64_t kBlocksPerThread = 8;
    const int64_t blocks = std::min<int64_t>(threads * kBlocksPerThread, n);
    const int64_t per = (n + blocks - 1) / blocks;
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
        const int64_t lo = i * per, hi = std::min(n, lo + per);
        if (lo < hi) fn(lo, hi);
      }
    };
    // Called from one of the pool's own threads, waiting for helpers could deadlock: run inline.
    if (pool_->CurrentThreadId() >= 0) {
      work();
      return;
    }
    // The calling thread takes blocks too, with threads - 1 helpers from the pool: as many
    // threads as the pool has, not one more (Eigen's ParallelFor also runs a share on the
    // caller, which makes one busy thread more than there are cores).
    const int helpers = static_cast<int>(std::min<int64_t>(threads - 1, blocks - 1));
    BlockingCounter done(helpers);
    for (int h = 0; h < helpers; ++h) {
      pool_->Schedule([&] {
        work();
        done.DecrementCount();
      });
    }
    work();
    done.Wait();
  }

 private:
  thread::ThreadPool* pool_;
};

}  // namespace embedlab_tf
}  // namespace tensorflow
