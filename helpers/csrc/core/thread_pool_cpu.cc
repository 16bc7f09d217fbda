// std::thread implementation of the ThreadPool interface (used outside TensorFlow).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "thread_pool.h"

namespace embedlab {
namespace {

class InlinePool final : public ThreadPool {
 public:
  int num_threads() const override { return 1; }
  void parallel_for(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n > 0) fn(0, n);
  }
};

// Workers sleep on a condition variable; each parallel_for publishes one job, a range cut into
// up to kBlocksPerThread x num_threads contiguous blocks that the caller and the workers take in
// turn from an atomic counter until none are left. A thread that the OS (or a busy neighbour on
// a shared machine) holds back leaves its blocks to the others instead of stalling the call, as
// with one fixed block per thread; TensorFlow's pool splits the same way (8 blocks per thread).
// One job at a time: a mutex serialises concurrent callers, which keeps the pool simple; kernels
// never depend on the split, so results stay deterministic.
class StdThreadPool final : public ThreadPool {
 public:
  explicit StdThreadPool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ~StdThreadPool() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int num_threads() const override { return n_; }

  void parallel_for(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n <= 0) return;
    // Below ~20 us of work, waking threads costs more than it saves.
    if (n_ == 1 || n * std::max<int64_t>(cost, 1) < 20000) {
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> job_lock(job_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      fn_ = &fn;
      total_ = n;
      blocks_ = std::min<int64_t>(n, int64_t{kBlocksPerThread} * n_);
      next_.store(0, std::memory_order_relaxed);
      pending_ = n_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    run_blocks();
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  static constexpr int kBlocksPerThread = 8;
  // Takes blocks until none are left. Block i covers [total * i / blocks, total * (i + 1) / blocks).
  void run_blocks() {
    for (;;) {
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= blocks_) return;
      const int64_t b = total_ * i / blocks_, e = total_ * (i + 1) / blocks_;
      if (b < e) (*fn_)(b, e);
    }
  }
  void worker(int i) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_blocks();
      {
        std::lock_guard<std::mutex> l(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  const int n_;
  std::vector<std::thread> workers_;
  std::mutex job_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0, blocks_ = 0;
  std::atomic<int64_t> next_{0};
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<ThreadPool> make_thread_pool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<StdThreadPool>(num_threads);
}

ThreadPool& inline_pool() {
  static InlinePool pool;
  return pool;
}

}  // namespace embedlab
