// TensorFlow ops that reduce: allreduce, grouped allreduce, reducescatter
// and grouped reducescatter.
//
// The data collectives are not marked stateful: tf.function's automatic
// control dependencies would otherwise serialize them in program order, and
// two ranks that build them in different orders would wait on each other.
// The engine matches them by name, so any execution order is safe.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf/huge_pages.h"
#include "tf/kernel.h"
#include "tf/op_types.h"

namespace kerasdist_tf {
namespace {

namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

// The attributes shared by the reducing kernels.
class ReduceKernel : public CollectiveKernel {
 public:
  ReduceKernel(OpKernelConstruction* c, int max_op) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    OP_REQUIRES(c, reduce_op_ >= 0 && reduce_op_ <= max_op,
                max_op == KERASDIST_SUM
                    ? errors::InvalidArgument("reducescatter supports op Average (0) or Sum (1). "
                                              "Received: op=", reduce_op_)
                    : errors::InvalidArgument("Invalid reduce_op ", reduce_op_));
  }

 protected:
  kerasdist_request Reduce(int32_t op) const {
    kerasdist_request r = NewRequest(op);
    r.reduce_op = reduce_op_;
    r.prescale = prescale_;
    r.postscale = postscale_;
    return r;
  }
  // Binds output i to input i's buffer when TensorFlow allows, else to a
  // new one (huge_pages.h). False, with ctx's status set, on failure.
  static bool BindOutput(OpKernelContext* ctx, int i, void** output) {
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
  explicit AllreduceOp(OpKernelConstruction* c) : ReduceKernel(c, KERASDIST_ADASUM) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<kerasdist_request> r(1, Reduce(KERASDIST_ALLREDUCE));
    std::vector<int64_t> dims;
    if (!Describe(ctx, ctx->input(0), &r[0], &dims) || !BindOutput(ctx, 0, &r[0].output))
      return done();
    Enqueue(ctx, std::move(done), r, nullptr, true);
  }
};

// N tensors in one kernel: all N requests reach the engine together, so the
// engine fuses them even when the op runs eagerly. Tensor i is named
// "<name>.<i>"; the kernel completes when every one of them has. A group
// whose tensors share a dtype can also run on the direct board as a whole.
class GroupedAllreduceOp : public ReduceKernel {
 public:
  explicit GroupedAllreduceOp(OpKernelConstruction* c) : ReduceKernel(c, KERASDIST_ADASUM) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs();
    std::vector<kerasdist_request> reqs(n, Reduce(KERASDIST_ALLREDUCE));
    std::vector<std::vector<int64_t>> dims(n);
    for (int i = 0; i < n; ++i) {
      if (!Describe(ctx, ctx->input(i), &reqs[i], &dims[i]) ||
          !BindOutput(ctx, i, &reqs[i].output))
        return done();
    }
    Enqueue(ctx, std::move(done), reqs, BaseName().c_str(), true);
  }
};

// Output i holds this rank's rows of tensor i: Horovod's split, the first
// dim0 % size ranks one row more.
class ReducescatterOp : public ReduceKernel {
 public:
  ReducescatterOp(OpKernelConstruction* c, bool grouped)
      : ReduceKernel(c, KERASDIST_SUM), grouped_(grouped) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int32_t rank, size;
    if (!ProcessSetInfo(ctx, &rank, &size)) return done();
    const int n = ctx->num_inputs();
    std::vector<kerasdist_request> reqs(n, Reduce(KERASDIST_REDUCESCATTER));
    std::vector<std::vector<int64_t>> dims(n);
    std::vector<std::string> names(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      kerasdist_request& r = reqs[i];
      if (!Describe(ctx, in, &r, &dims[i])) return done();
      names[i] = grouped_ ? BaseName() + "." + std::to_string(i) : BaseName();
      r.name = names[i].c_str();
      TensorShape shape = in.shape();
      if (in.dims() >= 1) {  // a scalar fails in the coordinator, on every rank
        const int64_t d = in.dim_size(0);
        shape.set_dim(0, d / size + (rank < d % size ? 1 : 0));
      }
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, shape, &out), done);
      r.output = const_cast<char*>(out->tensor_data().data());
    }
    Enqueue(ctx, std::move(done), reqs, nullptr, true);
  }

 private:
  bool grouped_;
};

class SingleReducescatterOp : public ReducescatterOp {
 public:
  explicit SingleReducescatterOp(OpKernelConstruction* c) : ReducescatterOp(c, false) {}
};

class GroupedReducescatterOp : public ReducescatterOp {
 public:
  explicit GroupedReducescatterOp(OpKernelConstruction* c) : ReducescatterOp(c, true) {}
};

}  // namespace

REGISTER_OP("KerasdistAllreduce")
    .Attr("T: " KERASDIST_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(shape_inference::UnchangedShape)
    .Doc("Reduces a tensor across all kerasdist ranks (ring allreduce).");

REGISTER_OP("KerasdistGroupedAllreduce")
    .Attr("T: list(" KERASDIST_TF_TYPES ") >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return tensorflow::Status();
    })
    .Doc("Reduces a list of tensors across all ranks; the engine fuses them.");

REGISTER_OP("KerasdistReducescatter")
    .Attr("T: " KERASDIST_TF_TYPES)
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
    .Attr("T: list(" KERASDIST_TF_TYPES ") >= 1")
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

REGISTER_KERNEL_BUILDER(Name("KerasdistAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistGroupedAllreduce").Device(tensorflow::DEVICE_CPU),
                        GroupedAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistReducescatter").Device(tensorflow::DEVICE_CPU),
                        SingleReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistGroupedReducescatter").Device(tensorflow::DEVICE_CPU),
                        GroupedReducescatterOp);

}  // namespace kerasdist_tf
