// TensorFlow custom ops for the kerasdist collectives. Each kernel is an
// AsyncOpKernel that hands a Request to the engine; done() runs once the
// collective has run on every rank, on the engine thread or, after a short
// wait (inline_wait.h), on the kernel's own thread.
#include <atomic>

#include "binding.h"
#include "convert.h"
#include "huge_pages.h"
#include "inline_wait.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kerasdist {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

bool ToDataType(tensorflow::DataType dt, DataType* out) {
  switch (dt) {
    case tensorflow::DT_HALF: *out = DataType::kFloat16; return true;
    case tensorflow::DT_BFLOAT16: *out = DataType::kBFloat16; return true;
    case tensorflow::DT_FLOAT: *out = DataType::kFloat32; return true;
    case tensorflow::DT_DOUBLE: *out = DataType::kFloat64; return true;
    case tensorflow::DT_INT32: *out = DataType::kInt32; return true;
    case tensorflow::DT_INT64: *out = DataType::kInt64; return true;
    case tensorflow::DT_UINT8: *out = DataType::kUInt8; return true;
    case tensorflow::DT_INT8: *out = DataType::kInt8; return true;
    case tensorflow::DT_UINT16: *out = DataType::kUInt16; return true;
    case tensorflow::DT_INT16: *out = DataType::kInt16; return true;
    case tensorflow::DT_BOOL: *out = DataType::kBool; return true;
    default: return false;
  }
}

tensorflow::Status ToTfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return tensorflow::Status();
    case StatusCode::kInvalidArgument: return errors::InvalidArgument(s.message());
    // Ranks disagree on a tensor's dtype, shape, op or root: the call is
    // valid on each rank alone, so this is Horovod's FailedPrecondition.
    case StatusCode::kMismatch: return errors::FailedPrecondition(s.message());
    case StatusCode::kTimeout: return errors::Unavailable(s.message());
    case StatusCode::kAborted: return errors::Aborted(s.message());
    case StatusCode::kShutdown: return errors::FailedPrecondition(s.message());
    case StatusCode::kInternal: return errors::Internal(s.message());
  }
  return errors::Unknown(s.message());
}

std::vector<int64_t> Dims(const TensorShape& shape) {
  std::vector<int64_t> dims;
  for (int i = 0; i < shape.dims(); ++i) dims.push_back(shape.dim_size(i));
  return dims;
}

// Shared plumbing: context lookup, naming, completion.
class CollectiveKernel : public AsyncOpKernel {
 public:
  explicit CollectiveKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }

 protected:
  // Returns the engine of the op's process set, or sets an error on ctx and
  // returns null.
  std::shared_ptr<Engine> Live(OpKernelContext* ctx) {
    return LiveEngine(ctx, process_set_id_);
  }
  Request NewRequest(OpKernelContext* ctx, DoneCallback done, OpType type) {
    Request r;
    r.name = tensor_name_.empty() ? name() : tensor_name_;
    r.meta.type = type;
    r.done = Completion(ctx, done);
    return r;
  }
  static DoneFn Completion(OpKernelContext* ctx, DoneCallback done) {
    return [ctx, done](const Status& s) {
      if (!s.ok()) ctx->SetStatus(ToTfStatus(s));
      done();
    };
  }
  bool InputMeta(OpKernelContext* ctx, TensorMeta* meta, int i = 0) {
    if (!InputDtype(ctx, i, &meta->dtype)) return false;
    meta->shape = Dims(ctx->input(i).shape());
    return true;
  }
  bool InputDtype(OpKernelContext* ctx, int i, DataType* dtype) {
    const Tensor& in = ctx->input(i);
    if (ToDataType(in.dtype(), dtype)) return true;
    ctx->SetStatus(errors::InvalidArgument("Unsupported dtype for a kerasdist collective: ",
                                           tensorflow::DataTypeString(in.dtype())));
    return false;
  }

  std::string tensor_name_;
  int process_set_id_;
};

// The attributes shared by the reducing kernels.
class ReduceKernel : public CollectiveKernel {
 public:
  explicit ReduceKernel(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    OP_REQUIRES(c, reduce_op_ >= 0 && reduce_op_ <= 5,
                errors::InvalidArgument("Invalid reduce_op ", reduce_op_));
  }

 protected:
  // Describes input i in `r` and binds output i to it (reusing the input's
  // buffer when TensorFlow allows). On failure sets ctx's status and
  // returns false.
  bool BindInput(OpKernelContext* ctx, int i, Request* r) {
    if (!InputMeta(ctx, &r->meta, i)) return false;
    r->meta.reduce_op = static_cast<ReduceOp>(reduce_op_);
    r->meta.prescale = prescale_;
    r->meta.postscale = postscale_;
    r->input = ctx->input(i).tensor_data().data();
    return BindOutput(ctx, i, &r->output);
  }
  // Binds output i to input i's buffer when TensorFlow allows, else to a
  // new one (huge_pages.h); sets *output to it. On failure sets ctx's status.
  bool BindOutput(OpKernelContext* ctx, int i, void** output) {
    Tensor* out = nullptr;
    const Tensor& in = ctx->input(i);
    tensorflow::Status s = ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return false;
    }
    *output = const_cast<char*>(out->tensor_data().data());
    if (*output != in.tensor_data().data()) AdviseHugePages(*output, out->tensor_data().size());
    return true;
  }

  int reduce_op_;
  float prescale_, postscale_;
};

class AllreduceOp : public ReduceKernel {
 public:
  using ReduceKernel::ReduceKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    Request r = NewRequest(ctx, done, OpType::kAllreduce);
    if (!BindInput(ctx, 0, &r)) return done();
    r.direct_ok = true;
    if (live->TryDirect(&r)) return;  // small and cached: no coordinator
    const InlineWait wait = Handoff(*live);
    r.done = Completion(ctx, Finisher(wait, done));
    live->Enqueue(std::move(r));
    WaitInline(*live, wait, 1, done);
  }
};

// N tensors in one kernel: all N requests reach the engine together, so the
// engine fuses them even when the op runs eagerly. Tensor i is named
// "<name>.<i>"; the kernel completes when every one of them has. A group
// whose tensors share a dtype can also run on the direct board as a whole
// (direct_board.h), as one request that lists the tensors' buffers.
class GroupedAllreduceOp : public ReduceKernel {
 public:
  using ReduceKernel::ReduceKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const int n = ctx->num_inputs();
    const std::string base = tensor_name_.empty() ? name() : tensor_name_;
    // Tensor 0's description stands for the group's (dtype, op, scales).
    Request group;
    if (!BindInput(ctx, 0, &group)) return done();
    group.parts.reserve(n);
    group.shapes_hash = kShapeHashSeed;
    bool one_dtype = true;
    int64_t elements = 0;
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      void* out = group.output;
      if (i > 0) {
        DataType dtype;
        if (!InputDtype(ctx, i, &dtype) || !BindOutput(ctx, i, &out)) return done();
        one_dtype = one_dtype && dtype == group.meta.dtype;
      }
      const auto dims = in.shape().dim_sizes();
      group.shapes_hash = MixShape(group.shapes_hash, dims.data(), dims.size());
      group.parts.push_back({in.tensor_data().data(), out, static_cast<size_t>(in.NumElements())});
      elements += in.NumElements();
    }
    group.input = group.output = nullptr;
    group.meta.shape = {elements};
    // A group of several dtypes only posts a mark where its name has a place
    // on the board (Request::mixed_dtypes), so that the ranks agree.
    group.name = base;
    group.done = Completion(ctx, done);
    group.expand = [this, ctx, base, done, one_dtype] {
      return Members(ctx, base, done, one_dtype);
    };
    group.mixed_dtypes = !one_dtype;
    if (live->TryDirect(&group)) return;
    // Not on the board (yet): every tensor goes to the engine.
    const InlineWait wait = Handoff(*live);
    live->EnqueueBatch(Members(ctx, base, Finisher(wait, done), one_dtype));
    WaitInline(*live, wait, n, done);
  }

 private:
  // The requests of the op's tensors, bound to the outputs ComputeAsync
  // made; the last to complete calls `finish`. `one_dtype`: member 0 tells
  // rank 0 the group's size and bytes, so that it can move to the board.
  std::vector<Request> Members(OpKernelContext* ctx, const std::string& base,
                               const DoneCallback& finish, bool one_dtype) {
    const int n = ctx->num_inputs();
    // Every request's callback runs on one thread (the engine's, or this one
    // if the engine has stopped), so the counter only needs to be atomic for
    // the hand-off back to TensorFlow.
    auto remaining = std::make_shared<std::atomic<int>>(n);
    std::vector<Request> reqs(n);
    int64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      Request& r = reqs[i];
      r.name = base + "." + std::to_string(i);
      r.meta.type = OpType::kAllreduce;
      InputMeta(ctx, &r.meta, i);  // checked in ComputeAsync
      r.meta.reduce_op = static_cast<ReduceOp>(reduce_op_);
      r.meta.prescale = prescale_;
      r.meta.postscale = postscale_;
      r.input = ctx->input(i).tensor_data().data();
      r.output = const_cast<char*>(ctx->mutable_output(i)->tensor_data().data());
      bytes += static_cast<int64_t>(ctx->input(i).tensor_data().size());
      r.done = [ctx, finish, remaining](const Status& s) {
        if (!s.ok()) ctx->SetStatus(ToTfStatus(s));
        if (remaining->fetch_sub(1) == 1) finish();
      };
    }
    if (one_dtype) {
      reqs[0].group_size = n;
      reqs[0].group_bytes = bytes;
    }
    return reqs;
  }
};

class AllgatherOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const Tensor& in = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, in.dims() >= 1,
                      errors::InvalidArgument(
                          "allgather requires a tensor with at least one "
                          "dimension. Received a scalar; reshape it to [1]."),
                      done);
    const InlineWait wait = Handoff(*live);
    Request r = NewRequest(ctx, Finisher(wait, done), OpType::kAllgather);
    if (!InputMeta(ctx, &r.meta)) return done();
    r.input = in.tensor_data().data();
    r.allocate = [ctx](const std::vector<int64_t>& shape, void** data) {
      TensorShape ts;
      for (int64_t d : shape) ts.AddDim(d);
      Tensor* out = nullptr;
      tensorflow::Status s = ctx->allocate_output(0, ts, &out);
      if (!s.ok()) return Status(StatusCode::kInternal, std::string(s.message()));
      *data = const_cast<char*>(out->tensor_data().data());
      AdviseHugePages(*data, out->tensor_data().size());
      return Status::OK();
    };
    live->Enqueue(std::move(r));
    WaitInline(*live, wait, 1, done);
  }
};

class BroadcastOp : public CollectiveKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const InlineWait wait = Handoff(*live);
    Request r = NewRequest(ctx, Finisher(wait, done), OpType::kBroadcast);
    if (!InputMeta(ctx, &r.meta)) return done();
    r.meta.root = root_;
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->forward_input_or_allocate_output({0}, 0, in.shape(), &out), done);
    r.input = in.tensor_data().data();
    r.output = const_cast<char*>(out->tensor_data().data());
    live->Enqueue(std::move(r));
    WaitInline(*live, wait, 1, done);
  }

 private:
  int root_;
};

// Barrier and join carry no data: agreement among the ranks is the result.
class BarrierOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    const InlineWait wait = Handoff(*live);
    Request r = NewRequest(ctx, Finisher(wait, done), OpType::kBarrier);
    live->Enqueue(std::move(r));
    WaitInline(*live, wait, 1, done);
  }
};

class JoinOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto live = Live(ctx);
    if (!live) return done();
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    Request r = NewRequest(ctx, done, OpType::kJoin);
    r.name = "__kerasdist_join__";
    r.join_result = out->scalar<int32_t>().data();
    live->Enqueue(std::move(r));
  }
};

// Reads the live context at run time: rank, local rank, size, local size,
// or whether this rank belongs to the (global) process set. Synchronous: the
// answer is local, no other rank takes part.
class QueryOp : public tensorflow::OpKernel {
 public:
  explicit QueryOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("query", &query_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
    OP_REQUIRES(c, query_ >= 0 && query_ <= 4,
                errors::InvalidArgument("Invalid query ", query_));
  }
  void Compute(OpKernelContext* ctx) override {
    auto live = CurrentContext();
    OP_REQUIRES(ctx, live != nullptr,
                errors::FailedPrecondition(
                    "kerasdist is not initialized. Call `kerasdist.init()` first."));
    const auto& t = live->topology();
    int32_t value = 0;
    switch (query_) {
      case 0: value = live->rank(); break;
      case 1: value = t.local_rank; break;
      case 2: value = live->ProcessSetSize(process_set_id_); break;
      case 3: value = t.local_size; break;
      case 4: value = live->EngineFor(process_set_id_) ? 1 : 0; break;
    }
    OP_REQUIRES(ctx, value >= 0,
                errors::InvalidArgument("Process set ", process_set_id_, " does not exist."));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  int query_;
  int process_set_id_;
};

}  // namespace

std::shared_ptr<Engine> LiveEngine(OpKernelContext* ctx, int process_set_id) {
  auto c = CurrentContext();
  if (!c) {
    ctx->SetStatus(errors::FailedPrecondition(
        "kerasdist is not initialized. Call `kerasdist.init()` first."));
    return nullptr;
  }
  auto engine = c->EngineFor(process_set_id);
  if (!engine) {
    ctx->SetStatus(errors::FailedPrecondition(
        "This rank (rank ", c->rank(), ") is not in process set ", process_set_id,
        c->ProcessSetSize(process_set_id) < 0 ? ", which does not exist (or was removed)"
                                              : "",
        ". Run a collective on a process set only on its member ranks."));
  }
  return engine;
}

bool ToCoreDataType(tensorflow::DataType dt, DataType* out) { return ToDataType(dt, out); }
tensorflow::Status ToTensorFlowStatus(const Status& s) { return ToTfStatus(s); }

// The data collectives are not marked stateful: tf.function's automatic
// control dependencies would otherwise serialize them in program order, and
// two ranks that build them in different orders would wait on each other.
// The engine matches them by name, so any execution order is safe.
#define KD_TYPES "T: {half, bfloat16, float, double, int32, int64, uint8, int8, uint16, int16, bool}"

REGISTER_OP("KerasdistAllreduce")
    .Attr(KD_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
        .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Reduces a tensor across all kerasdist ranks (ring allreduce).");

REGISTER_OP("KerasdistGroupedAllreduce")
    .Attr("T: list({half, bfloat16, float, double, int32, int64, uint8, int8, uint16, int16, bool}) >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return tensorflow::Status();
    })
    .Doc("Reduces a list of tensors across all ranks; the engine fuses them.");

REGISTER_OP("KerasdistAllgather")
    .Attr(KD_TYPES)
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
        .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle in, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
      TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return tensorflow::Status();
    })
    .Doc("Concatenates tensors from all ranks along the first dimension.");

REGISTER_OP("KerasdistBroadcast")
    .Attr(KD_TYPES)
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
        .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Broadcasts a tensor from root_rank to all ranks.");

REGISTER_OP("KerasdistBarrier")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Blocks until every rank has reached the barrier.");

REGISTER_OP("KerasdistJoin")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Marks this rank as out of data; returns when all ranks have joined.");

// Stateful, so that it is never constant-folded: a traced function reads the
// context each time it runs (e.g. after shutdown() and init() on a new comm).
REGISTER_OP("KerasdistQuery")
    .Attr("query: int")
    .Attr("process_set_id: int = 0")
    .Output("value: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Reads rank (0), local rank (1), size (2), local size (3) or process-set membership (4).");

REGISTER_KERNEL_BUILDER(Name("KerasdistQuery").Device(tensorflow::DEVICE_CPU), QueryOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistGroupedAllreduce").Device(tensorflow::DEVICE_CPU),
                        GroupedAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistBarrier").Device(tensorflow::DEVICE_CPU), BarrierOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistJoin").Device(tensorflow::DEVICE_CPU), JoinOp);

}  // namespace kerasdist
