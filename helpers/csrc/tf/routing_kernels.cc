// CPU OpKernels of EmbedLabRouteCount / EmbedLabRouteScatter (ops: routing_ops.cc):
// csrc/core/routing.h for embedlab.sok's exchange. Count reports the first bad key as data
// (table, position, key) instead of failing, so that every worker can learn of it through the
// counts' all-gather and fail with the same message.
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"

#include "routing.h"
#include "tf_pool.h"

namespace tensorflow {

namespace {

using embedlab_tf::TfPool;

class RouteBase : public OpKernel {
 public:
  explicit RouteBase(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &T_));
    OP_REQUIRES_OK(c, c->GetAttr("num_workers", &n_));
    std::vector<int> modes, ranks;
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(c, c->GetAttr("modes", &modes));
    OP_REQUIRES_OK(c, c->GetAttr("rows", &rows));
    OP_REQUIRES_OK(c, c->GetAttr("ranks", &ranks));
    OP_REQUIRES(c, static_cast<int>(modes.size()) == T_ && static_cast<int>(rows.size()) == T_ &&
                       static_cast<int>(ranks.size()) == T_,
                errors::InvalidArgument(name(), ": modes, rows and ranks need ", T_, " entries each"));
    tables_.resize(T_);
    for (int t = 0; t < T_; ++t) {
      OP_REQUIRES(c, modes[t] >= 0 && modes[t] <= 2,
                  errors::InvalidArgument(name(), ": modes[", t, "] must be 0, 1 or 2, got ", modes[t]));
      tables_[t].mode = static_cast<embedlab::RouteMode>(modes[t]);
      tables_[t].rows = rows[t];
      tables_[t].rank = ranks[t];
    }
  }

 protected:
  // Fills args_ / offsets_ from the key inputs; false (with the status set) on error.
  bool Prepare(OpKernelContext* c, std::vector<int64_t>* concat) {
    offsets_.assign(T_ + 1, 0);
    for (int t = 0; t < T_; ++t) {
      const Tensor& k = c->input(t);
      if (!TensorShapeUtils::IsVector(k.shape())) {
        c->SetStatus(errors::InvalidArgument(name(), ": keys[", t, "] must be 1-D, got ", k.shape().DebugString()));
        return false;
      }
      offsets_[t + 1] = offsets_[t] + k.NumElements();
    }
    const int64_t* keys = nullptr;
    if (T_ == 1) {
      keys = c->input(0).flat<int64_t>().data();
    } else {
      concat->resize(offsets_[T_]);
      for (int t = 0; t < T_; ++t) {
        auto f = c->input(t).flat<int64_t>();
        std::copy(f.data(), f.data() + f.size(), concat->data() + offsets_[t]);
      }
      keys = concat->data();
    }
    args_.keys = keys;
    args_.table_offsets = offsets_.data();
    args_.tables = tables_.data();
    args_.num_tables = T_;
    args_.num_workers = n_;
    args_.nnz = offsets_[T_];
    counts_.assign(static_cast<size_t>(n_) * T_, 0);
    args_.counts = counts_.data();
    const std::string err = embedlab::check_route_args(args_);
    if (!err.empty()) {
      c->SetStatus(errors::InvalidArgument(name(), ": ", err));
      return false;
    }
    return true;
  }

  int T_ = 0, n_ = 1;
  std::vector<embedlab::RouteTable> tables_;
  // Per-call state (a kernel instance may run concurrently only in different steps; these are
  // rebuilt on every call under the mutex below).
  mutex mu_;
  std::vector<int64_t> offsets_, counts_;
  embedlab::RouteArgs args_;
};

class RouteCountOp : public RouteBase {
 public:
  using RouteBase::RouteBase;
  void Compute(OpKernelContext* c) override {
    mutex_lock l(mu_);
    std::vector<int64_t> concat;
    if (!Prepare(c, &concat)) return;
    TfPool pool(c);
    const embedlab::RouteStatus st = embedlab::route_count_cpu(args_, &pool);
    Tensor* counts = nullptr;
    Tensor* bad = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({n_, T_}), &counts));
    OP_REQUIRES_OK(c, c->allocate_output(1, TensorShape({3}), &bad));
    std::copy(counts_.begin(), counts_.end(), counts->flat<int64_t>().data());
    auto b = bad->flat<int64_t>();
    if (st.bad_index >= 0) {
      b(0) = st.bad_table;
      b(1) = st.bad_index - offsets_[st.bad_table];
      b(2) = st.bad_key;
    } else {
      b(0) = b(1) = b(2) = -1;
    }
  }
};

class RouteScatterOp : public RouteBase {
 public:
  using RouteBase::RouteBase;
  void Compute(OpKernelContext* c) override {
    mutex_lock l(mu_);
    std::vector<int64_t> concat;
    if (!Prepare(c, &concat)) return;
    const Tensor& counts_in = c->input(T_);
    const Tensor& stride_in = c->input(T_ + 1);
    OP_REQUIRES(c, counts_in.shape() == TensorShape({n_, T_}),
                errors::InvalidArgument(name(), ": counts must be [", n_, ", ", T_, "], got ",
                                        counts_in.shape().DebugString()));
    OP_REQUIRES(c, TensorShapeUtils::IsScalar(stride_in.shape()),
                errors::InvalidArgument(name(), ": stride must be a scalar"));
    const int64_t stride = stride_in.scalar<int64_t>()();
    auto cin = counts_in.flat<int64_t>();
    int64_t total = 0;
    for (int o = 0; o < n_; ++o) {
      int64_t s = 0;
      for (int t = 0; t < T_; ++t) s += cin(o * T_ + t);
      total += s;
      OP_REQUIRES(c, stride == 0 || s <= stride,
                  errors::InvalidArgument(name(), ": stride ", stride, " is below the ", s, " keys of owner ", o));
    }
    OP_REQUIRES(c, stride >= 0, errors::InvalidArgument(name(), ": stride must be >= 0, got ", stride));
    std::copy(cin.data(), cin.data() + cin.size(), counts_.begin());
    Tensor* send = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({stride > 0 ? n_ * stride : total}), &send));
    std::vector<Tensor*> inv(T_);
    for (int t = 0; t < T_; ++t) OP_REQUIRES_OK(c, c->allocate_output(1 + t, c->input(t).shape(), &inv[t]));
    TfPool pool(c);
    if (T_ == 1) {
      embedlab::route_scatter_cpu(args_, stride, send->flat<int64_t>().data(), inv[0]->flat<int64_t>().data(), &pool);
    } else {
      std::vector<int64_t> inverse(args_.nnz);
      embedlab::route_scatter_cpu(args_, stride, send->flat<int64_t>().data(), inverse.data(), &pool);
      for (int t = 0; t < T_; ++t)
        std::copy(inverse.data() + offsets_[t], inverse.data() + offsets_[t + 1], inv[t]->flat<int64_t>().data());
    }
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("EmbedLabRouteCount").Device(DEVICE_CPU), RouteCountOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabRouteScatter").Device(DEVICE_CPU), RouteScatterOp);

}  // namespace tensorflow
