// TensorFlow ops whose output size the ranks negotiate: allgather, grouped
// allgather and alltoall. The engine calls AllocateOutput once every rank's
// first dimension (or splits) is known.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf/kernel.h"
#include "tf/op_types.h"

namespace kerasdist_tf {
namespace {

namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

class AllgatherOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, in.dims() >= 1,
                      errors::InvalidArgument(
                          "allgather requires a tensor with at least one "
                          "dimension. Received a scalar; reshape it to [1]."),
                      done);
    std::vector<kerasdist_request> r(1, NewRequest(KERASDIST_ALLGATHER));
    std::vector<int64_t> dims;
    if (!Describe(ctx, in, &r[0], &dims)) return done();
    r[0].allocate = AllocateOutput;
    r[0].allocate_user = ctx;
    Enqueue(ctx, std::move(done), r, nullptr, true);
  }
};

class GroupedAllgatherOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs();
    std::vector<kerasdist_request> reqs(n, NewRequest(KERASDIST_ALLGATHER));
    std::vector<std::vector<int64_t>> dims(n);
    std::vector<std::string> names(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      OP_REQUIRES_ASYNC(ctx, in.dims() >= 1,
                        errors::InvalidArgument(
                            "grouped_allgather requires tensors with at least one dimension. "
                            "Tensor ", i, " is a scalar; reshape it to [1]."),
                        done);
      if (!Describe(ctx, in, &reqs[i], &dims[i])) return done();
      names[i] = BaseName() + "." + std::to_string(i);
      reqs[i].name = names[i].c_str();
      reqs[i].allocate = AllocateOutput;
      reqs[i].allocate_user = ctx;
    }
    Enqueue(ctx, std::move(done), reqs, nullptr, true);
  }
};

// Invalid splits are not refused here: the coordinator refuses them on
// every rank, so that no rank waits for one that failed alone. A rank whose
// own splits are invalid reports that failure as InvalidArgument (Horovod's
// code for them); the other ranks keep FailedPrecondition.
class AlltoallOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, splits.dims() == 1,
                      errors::InvalidArgument("alltoall expects 1-D splits. Received shape ",
                                              splits.shape().DebugString()),
                      done);
    int32_t rank, size;
    if (!ProcessSetInfo(ctx, &rank, &size)) return done();
    std::vector<kerasdist_request> r(1, NewRequest(KERASDIST_ALLTOALL));
    std::vector<int64_t> dims;
    if (!Describe(ctx, in, &r[0], &dims)) return done();
    auto s = splits.flat<int32_t>();
    std::vector<int64_t> split_rows(s.data(), s.data() + s.size());
    r[0].nsplits = static_cast<int32_t>(split_rows.size());
    r[0].splits = split_rows.data();
    Tensor* received = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, TensorShape({size}), &received), done);
    r[0].received_splits = received->flat<int32_t>().data();
    r[0].allocate = AllocateOutput;
    r[0].allocate_user = ctx;
    Enqueue(ctx, std::move(done), r, nullptr, true, {}, !SplitsValid(dims, split_rows, size));
  }

 private:
  // The coordinator's rule (coordinator/coordinator_scatter.cc), for this
  // rank alone.
  static bool SplitsValid(const std::vector<int64_t>& shape, const std::vector<int64_t>& splits,
                          int size) {
    if (shape.empty()) return true;  // not a splits problem
    if (splits.empty()) return shape[0] % size == 0;
    if (splits.size() != static_cast<size_t>(size)) return false;
    int64_t sum = 0;
    for (int64_t s : splits) {
      if (s < 0) return false;
      sum += s;
    }
    return sum == shape[0];
  }
};

}  // namespace

REGISTER_OP("KerasdistAllgather")
    .Attr("T: " KERASDIST_TF_TYPES)
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle in, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
      TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return tensorflow::Status();
    })
    .Doc("Concatenates tensors from all ranks along the first dimension.");

REGISTER_OP("KerasdistGroupedAllgather")
    .Attr("T: list(" KERASDIST_TF_TYPES ") >= 1")
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

REGISTER_OP("KerasdistAlltoall")
    .Attr("T: " KERASDIST_TF_TYPES)
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

REGISTER_KERNEL_BUILDER(Name("KerasdistAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistGroupedAllgather").Device(tensorflow::DEVICE_CPU),
                        GroupedAllgatherOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallOp);

}  // namespace kerasdist_tf
