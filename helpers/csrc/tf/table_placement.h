// Where the CPU ops' large tables live: a TensorFlow Allocator over csrc/core's map_table (each
// table its own mapping, 2 MiB-aligned, advised onto huge pages before first touch), used by
// EmbedLabAlignedTable (a table's initial value), EmbedLabZerosTable (a table or state that starts
// at zero: the fresh mapping itself) and EmbedLabAssignTable (a table's new value: restore,
// set_table) in table_placement_kernels.cc.
//
// Why: TensorFlow's CPU allocator starts every large buffer 64 bytes into a page, so a 256-byte
// row (dim 64) straddles three 128-byte cache-line pairs instead of two and the forward reads
// such a table slower than a 2 MiB-aligned one (docs/benchmarks/index.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "huge_pages.h"
#include "tf_pool.h"

namespace tensorflow {
namespace embedlab_tf {

// One mapping per allocation (tables only: a few large buffers per process). The mapping's size
// is kept here, since TensorFlow may free with DeallocateRaw(ptr) alone.
class TableAllocator final : public Allocator {
 public:
  static TableAllocator* Get() {
    static TableAllocator* a = new TableAllocator;  // never destroyed: tensors may outlive statics
    return a;
  }
  std::string Name() override { return "embedlab_table"; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    if (alignment > embedlab::kTableAlignment) return nullptr;
    void* p = embedlab::map_table(num_bytes);
    if (p != nullptr) {
      std::lock_guard<std::mutex> l(mu_);
      sizes_[p] = num_bytes;
    }
    return p;
  }
  void DeallocateRaw(void* ptr) override {
    if (ptr == nullptr) return;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = sizes_.find(ptr);
      if (it == sizes_.end()) return;  // not ours: cannot happen for tensors this allocator made
      bytes = it->second;
      sizes_.erase(it);
    }
    embedlab::unmap_table(ptr, bytes);
  }
  bool TracksAllocationSizes() const override { return true; }
  size_t RequestedSize(const void* ptr) const override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = sizes_.find(const_cast<void*>(ptr));
    return it == sizes_.end() ? 0 : it->second;
  }
  AllocatorMemoryType GetMemoryType() const override { return AllocatorMemoryType::kHostPageable; }

 private:
  TableAllocator() = default;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
};

// Whether a table of this many bytes belongs in a TableAllocator mapping.
inline bool IsLargeTableBytes(uint64_t bytes) {
  return embedlab::aligned_tables_enabled() && bytes >= embedlab::kLargeTableBytes;
}
inline bool IsLargeTable(const Tensor& t) { return t.IsInitialized() && IsLargeTableBytes(t.TotalBytes()); }

inline bool IsTableAligned(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.tensor_data().data()) % embedlab::kTableAlignment == 0;
}

// dst := src (same size), in 2 MiB pieces over the pool's threads.
inline void ParallelCopy(const Tensor& src, Tensor* dst, TfPool& pool) {
  const char* from = src.tensor_data().data();
  char* to = const_cast<char*>(dst->tensor_data().data());
  if (from == to) return;
  constexpr int64_t kChunk = int64_t{1} << 21;
  const int64_t bytes = static_cast<int64_t>(src.TotalBytes());
  pool.parallel_for((bytes + kChunk - 1) / kChunk, kChunk, [&](int64_t b, int64_t e) {
    const int64_t lo = b * kChunk, hi = std::min(bytes, e * kChunk);
    std::memcpy(to + lo, from + lo, hi - lo);
  });
}

// A fresh TableAllocator mapping for a table of `dtype` and `shape`, zero as mapped (`op` names
// the caller in the error).
inline absl::Status MapTable(const char* op, DataType dtype, const TensorShape& shape, Tensor* out) {
  Tensor t(TableAllocator::Get(), dtype, shape);
  if (!t.IsInitialized())
    return errors::ResourceExhausted(op, ": could not map ", shape.num_elements() * DataTypeSize(dtype),
                                     " bytes for a table of shape ", shape.DebugString(),
                                     " (mmap failed: out of memory or address space)");
  *out = std::move(t);
  return absl::OkStatus();
}

// A copy of `src` in a TableAllocator mapping.
inline absl::Status AlignedCopy(const char* op, const Tensor& src, TfPool& pool, Tensor* out) {
  Tensor t;
  TF_RETURN_IF_ERROR(MapTable(op, src.dtype(), src.shape(), &t));
  ParallelCopy(src, &t, pool);
  *out = std::move(t);
  return absl::OkStatus();
}

// variable := value for a large float table, keeping it in a TableAllocator mapping: the value is
// copied into the variable's own buffer when that buffer is such a mapping of the same shape
// that no one else holds (reference count one: no read value, DLPack view or other variable
// shares it), else into a new mapping that the variable then holds (whoever held the old buffer
// keeps the old values, as with TensorFlow's AssignVariableOp). TensorFlow's own assign would
// give the variable the value's buffer, of TensorFlow's allocator. Takes the variable's writer
// lock.
// A value of another dtype, or (once the variable holds a value) of another shape, is refused
// and changes nothing, as TensorFlow's AssignVariableOp does with validate_shape.
inline absl::Status AssignTable(OpKernelContext* ctx, Var* var, const Tensor& value) {
  mutex_lock l(*var->mu());
  Tensor* t = var->tensor();
  if (t->dtype() != value.dtype())
    return errors::InvalidArgument("EmbedLabAssignTable: value of dtype ", DataTypeString(value.dtype()),
                                   " for a variable of dtype ", DataTypeString(t->dtype()));
  if (var->is_initialized && t->IsInitialized() && t->shape() != value.shape())
    return errors::InvalidArgument("EmbedLabAssignTable: value of shape ", value.shape().DebugString(),
                                   " for a variable of shape ", t->shape().DebugString());
  TfPool pool(ctx);
  if (var->is_initialized && t->IsInitialized() && t->shape() == value.shape() && IsTableAligned(*t) &&
      t->RefCountIsOne()) {
    ParallelCopy(value, t, pool);
    return absl::OkStatus();
  }
  Tensor fresh;
  TF_RETURN_IF_ERROR(AlignedCopy("EmbedLabAssignTable", value, pool, &fresh));
  *t = std::move(fresh);
  var->is_initialized = true;
  return absl::OkStatus();
}

}  // namespace embedlab_tf
}  // namespace tensorflow
