// TensorFlow ops that broadcast: a tensor, or resource variables in place.
#include <cstring>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf/kernel.h"
#include "tf/op_types.h"

namespace kerasdist_tf {
namespace {

namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

class BroadcastOp : public CollectiveKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    std::vector<kerasdist_request> r(1, NewRequest(KERASDIST_BROADCAST));
    std::vector<int64_t> dims;
    if (!Describe(ctx, in, &r[0], &dims)) return done();
    r[0].root = root_;
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->forward_input_or_allocate_output({0}, 0, in.shape(), &out), done);
    r[0].output = const_cast<char*>(out->tensor_data().data());
    Enqueue(ctx, std::move(done), r, nullptr, true);
  }

 private:
  int root_;
};

// Broadcasts into the variables' own buffers. A buffer that some tensor
// still aliases (a value read earlier) is copied first, as TensorFlow's
// own updates do, so that such a tensor keeps its value. The op holds the
// buffers until the engine has finished with them.
class BroadcastInplaceOp : public CollectiveKernel {
 public:
  explicit BroadcastInplaceOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs();
    std::vector<Tensor> held;
    std::vector<kerasdist_request> reqs(n, NewRequest(KERASDIST_BROADCAST));
    std::vector<std::vector<int64_t>> dims(n);
    std::vector<std::string> names(n);
    for (int i = 0; i < n; ++i) {
      tensorflow::core::RefCountPtr<tensorflow::Var> var;
      OP_REQUIRES_OK_ASYNC(ctx, LookupResource(ctx, HandleFromInput(ctx, i), &var), done);
      tensorflow::mutex_lock lock(*var->mu());
      OP_REQUIRES_ASYNC(ctx, var->is_initialized,
                        errors::FailedPrecondition("broadcast_: variable ", i,
                                                   " is not initialized"),
                        done);
      Tensor* t = var->tensor();
      if (!t->RefCountIsOne()) {
        Tensor copy;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(t->dtype(), t->shape(), &copy), done);
        if (t->TotalBytes())
          std::memcpy(const_cast<char*>(copy.tensor_data().data()), t->tensor_data().data(),
                      t->TotalBytes());
        *t = copy;
      }
      held.push_back(*t);
      kerasdist_request& r = reqs[i];
      if (!Describe(ctx, *t, &r, &dims[i])) return done();
      names[i] = BaseName() + "." + std::to_string(i);
      r.name = names[i].c_str();
      r.root = root_;
      r.output = const_cast<char*>(t->tensor_data().data());
    }
    Enqueue(ctx, std::move(done), reqs, nullptr, false, std::move(held));
  }

 private:
  int root_;
};

}  // namespace

REGISTER_OP("KerasdistBroadcast")
    .Attr("T: " KERASDIST_TF_TYPES)
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(shape_inference::UnchangedShape)
    .Doc("Broadcasts a tensor from root_rank to all ranks.");

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

REGISTER_KERNEL_BUILDER(Name("KerasdistBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistBroadcastInplace").Device(tensorflow::DEVICE_CPU),
                        BroadcastInplaceOp);

}  // namespace kerasdist_tf
