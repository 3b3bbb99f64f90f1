// TensorFlow ops for the collectives that complete Horovod's API:
// reducescatter (single and grouped), alltoall, grouped allgather and the
// in-place broadcast of resource variables. Same shape as ops.cc: each
// kernel hands its requests to the engine; done() runs once the collective
// has run on every rank, on the engine's thread or, after a short wait
// (inline_wait.h), on the kernel's own. A kernel with
// several tensors enqueues them in one batch, so that the engine sees (and
// fuses) them together, and names tensor i "<name>.<i>".
#include <atomic>
#include <cstring>

#include "binding.h"
#include "convert.h"
#include "inline_wait.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kerasdist {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

class BatchKernel : public AsyncOpKernel {
 public:
  explicit BatchKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }

 protected:
  // The engine of the op's process set, or null with ctx's status set.
  std::shared_ptr<Engine> Live(OpKernelContext* ctx) {
    return LiveEngine(ctx, process_set_id_);
  }
  std::string TensorName(int i, bool grouped) const {
    const std::string base = tensor_name_.empty() ? name() : tensor_name_;
    return grouped ? base + "." + std::to_string(i) : base;
  }
  // Dtype and shape of `t`; on failure sets ctx's status.
  static bool Describe(OpKernelContext* ctx, const Tensor& t, TensorMeta* meta) {
    if (!ToCoreDataType(t.dtype(), &meta->dtype)) {
      ctx->SetStatus(errors::InvalidArgument("Unsupported dtype for a kerasdist collective: ",
                                             tensorflow::DataTypeString(t.dtype())));
      return false;
    }
    for (int d = 0; d < t.dims(); ++d) meta->shape.push_back(t.dim_size(d));
    return true;
  }
  // One completion for n requests: the first error is kept, done() runs once.
  static DoneFn Countdown(OpKernelContext* ctx, DoneCallback done, int n) {
    auto remaining = std::make_shared<std::atomic<int>>(n);
    return [ctx, done, remaining](const Status& s) {
      if (!s.ok()) ctx->SetStatus(ToTensorFlowStatus(s));
      if (remaining->fetch_sub(1) == 1) done();
    };
  }
  static AllocateFn OutputAllocator(OpKernelContext* ctx, int index) {
    return [ctx, index](const std::vector<int64_t>& shape, void** data) {
      TensorShape ts;
      for (int64_t d : shape) ts.AddDim(d);
      Tensor* out = nullptr;
      tensorflow::Status s = ctx->allocate_output(index, ts, &out);
      if (!s.ok()) return Status(StatusCode::kInternal, std::string(s.message()));
      *data = const_cast<char*>(out->tensor_data().data());
      return Status::OK();
    };
  }

  std::string tensor_name_;
  int process_set_id_;
};

// Output i holds this rank's rows of tensor i: Horovod's split, the first
// dim0 % size ranks one row more.
class ReducescatterOp : public BatchKernel {
 public:
  ReducescatterOp(OpKernelConstruction* c, bool grouped) : BatchKernel(c), grouped_(grouped) {
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    OP_REQUIRES(c, reduce_op_ == 0 || reduce_op_ == 1,
                errors::InvalidArgument("reducescatter supports op Average (0) or Sum (1). "
                                        "Received: op=", reduce_op_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const int n = ctx->num_inputs(), size = live->size(), rank = live->rank();
    const InlineWait wait = Handoff(*live);
    DoneFn finish = Countdown(ctx, Finisher(wait, done), n);
    std::vector<Request> reqs(n);
    for (int i = 0; i < n; ++i) {
      Request& r = reqs[i];
      const Tensor& in = ctx->input(i);
      r.name = TensorName(i, grouped_);
      r.meta.type = OpType::kReducescatter;
      r.meta.reduce_op = static_cast<ReduceOp>(reduce_op_);
      r.meta.prescale = prescale_;
      r.meta.postscale = postscale_;
      if (!Describe(ctx, in, &r.meta)) return done();
      TensorShape shape = in.shape();
      if (in.dims() >= 1) {  // a scalar fails in the coordinator, on every rank
        const int64_t d = in.dim_size(0);
        shape.set_dim(0, d / size + (rank < d % size ? 1 : 0));
      }
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, shape, &out), done);
      r.input = in.tensor_data().data();
      r.output = const_cast<char*>(out->tensor_data().data());
      r.done = finish;
    }
    live->EnqueueBatch(std::move(reqs));
    WaitInline(*live, wait, n, done);
  }

 private:
  bool grouped_;
  int reduce_op_;
  float prescale_, postscale_;
};

class SingleReducescatterOp : public ReducescatterOp {
 public:
  explicit SingleReducescatterOp(OpKernelConstruction* c) : ReducescatterOp(c, false) {}
};

class GroupedReducescatterOp : public ReducescatterOp {
 public:
  explicit GroupedReducescatterOp(OpKernelConstruction* c) : ReducescatterOp(c, true) {}
};

// Invalid splits are not refused here: the coordinator refuses them on
// every rank, so that no rank waits for one that failed alone. A rank whose
// own splits are invalid reports that failure as InvalidArgument (Horovod's
// code for them); the other ranks keep FailedPrecondition.
class AlltoallOp : public BatchKernel {
 public:
  using BatchKernel::BatchKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const Tensor& in = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, splits.dims() == 1,
                      errors::InvalidArgument("alltoall expects 1-D splits. Received shape ",
                                              splits.shape().DebugString()),
                      done);
    Request r;
    r.name = TensorName(0, false);
    r.meta.type = OpType::kAlltoall;
    if (!Describe(ctx, in, &r.meta)) return done();
    auto s = splits.flat<int32_t>();
    for (int64_t i = 0; i < s.size(); ++i) r.meta.splits.push_back(s(i));
    Tensor* received = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, TensorShape({live->size()}), &received),
                         done);
    r.received_splits = received->flat<int32_t>().data();
    r.input = in.tensor_data().data();
    r.allocate = OutputAllocator(ctx, 0);
    const InlineWait wait = Handoff(*live);
    r.done = Countdown(ctx, Finisher(wait, done), 1);
    if (!SplitsValid(r.meta, live->size())) {
      r.done = [finish = r.done](const Status& st) {
        finish(st.code() == StatusCode::kMismatch
                   ? Status(StatusCode::kInvalidArgument, st.message()) : st);
      };
    }
    live->Enqueue(std::move(r));
    WaitInline(*live, wait, 1, done);
  }

 private:
  // The coordinator's rule (coordinator_scatter.cc), for this rank alone.
  static bool SplitsValid(const TensorMeta& m, int size) {
    if (m.shape.empty()) return true;  // not a splits problem
    if (m.splits.empty()) return m.shape[0] % size == 0;
    if (m.splits.size() != static_cast<size_t>(size)) return false;
    int64_t sum = 0;
    for (int64_t s : m.splits) {
      if (s < 0) return false;
      sum += s;
    }
    return sum == m.shape[0];
  }
};

class GroupedAllgatherOp : public BatchKernel {
 public:
  using BatchKernel::BatchKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const int n = ctx->num_inputs();
    const InlineWait wait = Handoff(*live);
    DoneFn finish = Countdown(ctx, Finisher(wait, done), n);
    std::vector<Request> reqs(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      OP_REQUIRES_ASYNC(ctx, in.dims() >= 1,
                        errors::InvalidArgument(
                            "grouped_allgather requires tensors with at least one dimension. "
                            "Tensor ", i, " is a scalar; reshape it to [1]."),
                        done);
      Request& r = reqs[i];
      r.name = TensorName(i, true);
      r.meta.type = OpType::kAllgather;
      if (!Describe(ctx, in, &r.meta)) return done();
      r.input = in.tensor_data().data();
      r.allocate = OutputAllocator(ctx, i);
      r.done = finish;
    }
    live->EnqueueBatch(std::move(reqs));
    WaitInline(*live, wait, n, done);
  }
};

// Broadcasts into the variables' own buffers. A buffer that some tensor
// still aliases (a value read earlier) is copied first, as TensorFlow's
// own updates do, so that such a tensor keeps its value. The op holds the
// buffers until the engine has finished with them.
class BroadcastInplaceOp : public BatchKernel {
 public:
  explicit BroadcastInplaceOp(OpKernelConstruction* c) : BatchKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const int n = ctx->num_inputs();
    auto held = std::make_shared<std::vector<Tensor>>();
    DoneFn finish = Countdown(ctx, [done, held] { done(); }, n);
    std::vector<Request> reqs(n);
    for (int i = 0; i < n; ++i) {
      tensorflow::core::RefCountPtr<tensorflow::Var> var;
      OP_REQUIRES_OK_ASYNC(ctx, LookupResource(ctx, HandleFromInput(ctx, i), &var), done);
      tensorflow::mutex_lock lock(*var->mu());
      OP_REQUIRES_ASYNC(ctx, var->is_initialized,
                        errors::FailedPrecondition("broadcast_: variable ", i,
                                                   " is not initialized"),
                        done);
      Tensor* t = var->tensor();
      Request& r = reqs[i];
      if (!Describe(ctx, *t, &r.meta)) return done();
      if (!t->RefCountIsOne()) {
        Tensor copy;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(t->dtype(), t->shape(), &copy), done);
        if (t->TotalBytes())
          std::memcpy(const_cast<char*>(copy.tensor_data().data()), t->tensor_data().data(),
                      t->TotalBytes());
        *t = copy;
      }
      held->push_back(*t);
      r.name = TensorName(i, true);
      r.meta.type = OpType::kBroadcast;
      r.meta.root = root_;
      r.input = r.output = const_cast<char*>(t->tensor_data().data());
      r.done = finish;
    }
    live->EnqueueBatch(std::move(reqs));
  }

 private:
  int root_;
};

// Output i: input i with an unknown first dimension (scalars are refused).
tensorflow::Status FirstDimUnknown(shape_inference::InferenceContext* c, int i, const char* op) {
  shape_inference::ShapeHandle in = c->input(i), out;
  if (c->RankKnown(in) && c->Rank(in) == 0)
    return errors::InvalidArgument(op, " does not support scalar inputs; reshape to [1].");
  if (!c->RankKnown(in)) {
    c->set_output(i, in);
    return tensorflow::Status();
  }
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(i, out);
  return tensorflow::Status();
}

}  // namespace

#define KD_TYPE_LIST "{half, bfloat16, float, double, int32, int64, uint8, int8, uint16, int16, bool}"

REGISTER_OP("KerasdistReducescatter")
    .Attr("T: " KD_TYPE_LIST)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      return FirstDimUnknown(c, 0, "reducescatter");
    })
    .Doc("Reduces a tensor across all ranks; each rank keeps its rows of the result.");

REGISTER_OP("KerasdistGroupedReducescatter")
    .Attr("T: list(" KD_TYPE_LIST ") >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i)
        TF_RETURN_IF_ERROR(FirstDimUnknown(c, i, "grouped_reducescatter"));
      return tensorflow::Status();
    })
    .Doc("Reducescatters a list of tensors; the engine fuses them.");

REGISTER_OP("KerasdistAlltoall")
    .Attr("T: " KD_TYPE_LIST)
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(FirstDimUnknown(c, 0, "alltoall"));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return tensorflow::Status();
    })
    .Doc("Sends splits[j] rows of the tensor to rank j; concatenates what arrives.");

REGISTER_OP("KerasdistGroupedAllgather")
    .Attr("T: list(" KD_TYPE_LIST ") >= 1")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i)
        TF_RETURN_IF_ERROR(FirstDimUnknown(c, i, "grouped_allgather"));
      return tensorflow::Status();
    })
    .Doc("Allgathers a list of tensors in one op.");

// Stateful: it writes the variables, so it must never be pruned, and
// automatic control dependencies order it with other uses of them.
REGISTER_OP("KerasdistBroadcastInplace")
    .Attr("N: int >= 1")
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("resources: N * resource")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Overwrites the variables in place with root_rank's values.");

REGISTER_KERNEL_BUILDER(Name("KerasdistReducescatter").Device(tensorflow::DEVICE_CPU),
                        SingleReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistGroupedReducescatter").Device(tensorflow::DEVICE_CPU),
                        GroupedReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistGroupedAllgather").Device(tensorflow::DEVICE_CPU),
                        GroupedAllgatherOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistBroadcastInplace").Device(tensorflow::DEVICE_CPU),
                        BroadcastInplaceOp);

}  // namespace kerasdist
