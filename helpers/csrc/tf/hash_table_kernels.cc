// CPU OpKernels of the hash table resource: a ResourceBase holding the core embedlab::HashTable
// (csrc/core/hash_table.h), found through its resource handle like MutableHashTableV2. The core
// table does its own locking (a reader/writer lock), so the kernels take no lock; every op is
// atomic with respect to the others on the same table. Checks run before any change.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/blocking_counter.h"

#include "hash_table.h"

namespace tensorflow {
namespace embedlab_tf {

class HashTableResource : public ResourceBase {
 public:
  HashTableResource(int64_t initial_capacity, std::string name) : table_(initial_capacity), name_(std::move(name)) {}
  std::string DebugString() const override {
    return "EmbedLabHashTable '" + name_ + "' of " + std::to_string(table_.size()) + " keys";
  }
  int64_t MemoryUsed() const override { return table_.capacity() * 2 * static_cast<int64_t>(sizeof(int64_t)); }
  embedlab::HashTable& table() { return table_; }
  const std::string& name() const { return name_; }

 private:
  embedlab::HashTable table_;
  const std::string name_;
};

}  // namespace embedlab_tf

namespace {

using embedlab_tf::HashTableResource;

// TensorFlow's intra-op pool behind the core ThreadPool interface: the calling thread plus
// threads - 1 helpers take equal contiguous blocks (8 per thread, so a late thread's share is
// taken over by the others); run inline when called from one of the pool's own threads.
class TfHashPool final : public embedlab::ThreadPool {
 public:
  explicit TfHashPool(OpKernelContext* ctx) : pool_(ctx->device()->tensorflow_cpu_worker_threads()->workers) {}
  int num_threads() const override { return pool_->NumThreads(); }
  void parallel_for(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n <= 0) return;
    const int threads = pool_->NumThreads();
    if (threads <= 1 || n * std::max<int64_t>(cost, 1) < 20000 || pool_->CurrentThreadId() >= 0) {
      fn(0, n);
      return;
    }
    const int64_t blocks = std::min<int64_t>(int64_t{threads} * 8, n);
    const int64_t per = (n + blocks - 1) / blocks;
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
        const int64_t lo = i * per, hi = std::min(n, lo + per);
        if (lo < hi) fn(lo, hi);
      }
    };
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

// Runs a core call; the core throws only when memory runs out (std::bad_alloc) or a table would
// pass HashTable::kMaxKeys (std::length_error): reported as op errors, never as a crash.
template <typename F>
void CoreCall(OpKernelContext* ctx, const std::string& table, F&& f) {
  try {
    f();
  } catch (const std::bad_alloc&) {
    ctx->CtxFailure(errors::ResourceExhausted(ctx->op_kernel().type_string(), ": out of memory growing hash table '",
                                              table, "'"));
  } catch (const std::exception& e) {
    ctx->CtxFailure(errors::InvalidArgument(ctx->op_kernel().type_string(), ": hash table '", table, "': ", e.what()));
  }
}

class HashTableHandleOp : public OpKernel {
 public:
  explicit HashTableHandleOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("initial_capacity", &initial_capacity_));
    OP_REQUIRES(c, initial_capacity_ >= 1,
                errors::InvalidArgument(type_string(), ": initial_capacity must be >= 1, got ", initial_capacity_));
  }

  void Compute(OpKernelContext* ctx) override {
    // Looked up (or created) on every run, so a handle never outlives a destroyed table.
    ContainerInfo cinfo;
    OP_REQUIRES_OK(ctx, cinfo.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/true));
    HashTableResource* res = nullptr;
    OP_REQUIRES_OK(ctx, cinfo.resource_manager()->LookupOrCreate<HashTableResource>(
                            cinfo.container(), cinfo.name(), &res, [&](HashTableResource** out) {
                              try {
                                *out = new HashTableResource(initial_capacity_, cinfo.name());
                              } catch (const std::exception& e) {
                                return errors::ResourceExhausted(type_string(), ": cannot allocate hash table '",
                                                                 cinfo.name(), "' of initial_capacity ",
                                                                 initial_capacity_, ": ", e.what());
                              }
                              return absl::OkStatus();
                            }));
    res->Unref();
    Tensor* handle;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<ResourceHandle>()() = MakeResourceHandle<HashTableResource>(ctx, cinfo.container(), cinfo.name());
  }

 private:
  int64_t initial_capacity_ = 1024;
};

class HashTableAnonymousHandleOp : public OpKernel {
 public:
  explicit HashTableAnonymousHandleOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("initial_capacity", &initial_capacity_));
    OP_REQUIRES_OK(c, c->GetAttr("debug_name", &debug_name_));
    OP_REQUIRES(c, initial_capacity_ >= 1,
                errors::InvalidArgument(type_string(), ": initial_capacity must be >= 1, got ", initial_capacity_));
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* handle;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    // The handle takes over the creation reference: the table lives as long as a copy of it.
    const std::string name = debug_name_.empty() ? "anonymous" : debug_name_;
    HashTableResource* res = nullptr;
    try {
      res = new HashTableResource(initial_capacity_, name);
    } catch (const std::exception& e) {
      ctx->CtxFailure(errors::ResourceExhausted(type_string(), ": cannot allocate hash table '", name,
                                                "' of initial_capacity ", initial_capacity_, ": ", e.what()));
      return;
    }
    handle->scalar<ResourceHandle>()() =
        ResourceHandle::MakeRefCountingHandle<HashTableResource>(res, ctx->device()->name());
  }

 private:
  int64_t initial_capacity_ = 1024;
  std::string debug_name_;
};

absl::Status GetTable(OpKernelContext* ctx, core::RefCountPtr<HashTableResource>* out) {
  absl::Status s = LookupResource(ctx, HandleFromInput(ctx, 0), out);
  if (!s.ok())
    return errors::FailedPrecondition(ctx->op_kernel().type_string(), ": table: ", s.message());
  return absl::OkStatus();
}

class HashTableFindOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    const Tensor& keys = ctx->input(1);
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &values));
    TfHashPool pool(ctx);
    CoreCall(ctx, t->name(), [&] {
      t->table().find(keys.flat<int64_t>().data(), keys.NumElements(), values->flat<int64_t>().data(), &pool);
    });
  }
};

class HashTableFindOrInsertOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    const Tensor& keys = ctx->input(1);
    const Tensor& max_size_t = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(max_size_t.shape()),
                errors::InvalidArgument(type_string(), ": max_size must be a scalar, got shape ",
                                        max_size_t.shape().DebugString()));
    const int64_t max_size = max_size_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, max_size >= 0,
                errors::InvalidArgument(type_string(), ": max_size must be >= 0 (0 = unlimited), got ", max_size));
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &values));
    TfHashPool pool(ctx);
    const int64_t* k = keys.flat<int64_t>().data();
    const int64_t n = keys.NumElements();
    int64_t bad_key = 0, inserted = 0;
    CoreCall(ctx, t->name(), [&] {
      inserted = t->table().find_or_insert(k, n, values->flat<int64_t>().data(), max_size, &pool, &bad_key);
    });
    if (!ctx->status().ok()) return;
    if (inserted < 0) {
      const int64_t at = std::find(k, k + n, bad_key) - k;
      ctx->CtxFailure(errors::InvalidArgument(
          type_string(), ": key ", bad_key, " in keys (flat index ", at, ") does not fit in hash table '", t->name(),
          "': it holds ", t->table().size(), " keys and max_size is ", max_size, "; nothing was inserted"));
    }
  }
};

class HashTableInsertOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES(ctx, keys.shape() == values.shape(),
                errors::InvalidArgument(type_string(), ": keys has shape ", keys.shape().DebugString(),
                                        " but values has shape ", values.shape().DebugString(),
                                        "; they must be the same"));
    CoreCall(ctx, t->name(), [&] {
      t->table().insert_or_assign(keys.flat<int64_t>().data(), values.flat<int64_t>().data(), keys.NumElements());
    });
  }
};

class HashTableEraseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    const Tensor& keys = ctx->input(1);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = t->table().erase(keys.flat<int64_t>().data(), keys.NumElements());
  }
};

class HashTableSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = t->table().size();
  }
};

class HashTableExportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    // The outputs are sized from size(); a writer may run in between, then size again.
    std::vector<int64_t> keys, values;
    CoreCall(ctx, t->name(), [&] {
      for (;;) {
        const int64_t n = t->table().size();
        keys.resize(n);
        values.resize(n);
        if (t->table().export_entries_if_size(keys.data(), values.data(), n)) break;
      }
    });
    if (!ctx->status().ok()) return;
    const int64_t n = static_cast<int64_t>(keys.size());
    Tensor *k, *v;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &k));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &v));
    if (n > 0) {
      std::memcpy(k->flat<int64_t>().data(), keys.data(), n * sizeof(int64_t));
      std::memcpy(v->flat<int64_t>().data(), values.data(), n * sizeof(int64_t));
    }
  }
};

class HashTableClearOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<HashTableResource> t;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &t));
    CoreCall(ctx, t->name(), [&] { t->table().clear(); });
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableHandle").Device(DEVICE_CPU), HashTableHandleOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableAnonymousHandle").Device(DEVICE_CPU), HashTableAnonymousHandleOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableFind").Device(DEVICE_CPU), HashTableFindOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableFindOrInsert").Device(DEVICE_CPU), HashTableFindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableInsert").Device(DEVICE_CPU), HashTableInsertOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableErase").Device(DEVICE_CPU), HashTableEraseOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableSize").Device(DEVICE_CPU), HashTableSizeOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableExport").Device(DEVICE_CPU), HashTableExportOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabHashTableClear").Device(DEVICE_CPU), HashTableClearOp);

}  // namespace
}  // namespace tensorflow
