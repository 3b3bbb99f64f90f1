// TensorFlow ops that carry no data: barrier, join and the runtime queries;
// and what Python checks when it loads the op library.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf/kernel.h"

namespace kerasdist_tf {
namespace {

namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

// Barrier and join carry no data: agreement among the ranks is the result.
class BarrierOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<kerasdist_request> r(1, NewRequest(KERASDIST_BARRIER));
    Enqueue(ctx, std::move(done), r, nullptr, true);
  }
};

class JoinOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    std::vector<kerasdist_request> r(1, NewRequest(KERASDIST_JOIN));
    r[0].name = "__kerasdist_join__";
    r[0].join_result = out->scalar<int32_t>().data();
    Enqueue(ctx, std::move(done), r, nullptr, false);
  }
};

// Reads the live context at run time: rank, local rank, size, local size,
// or whether this rank belongs to the process set. Synchronous: the answer
// is local, no other rank takes part.
class QueryOp : public tensorflow::OpKernel {
 public:
  explicit QueryOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("query", &query_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
    OP_REQUIRES(c, query_ >= 0 && query_ <= 4,
                errors::InvalidArgument("Invalid query ", query_));
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES(ctx, kerasdist_is_initialized(),
                errors::FailedPrecondition(
                    "kerasdist is not initialized. Call `kerasdist.init()` first."));
    int32_t topo[6] = {0};
    int32_t set_rank = -1, set_size = -1;
    const int32_t info = kerasdist_process_set_info(process_set_id_, &set_rank, &set_size);
    kerasdist_topology(topo);
    int32_t value = 0;
    switch (query_) {
      case 0: value = kerasdist_rank(); break;
      case 1: value = topo[0]; break;
      case 2: value = set_size; break;
      case 3: value = topo[1]; break;
      case 4: value = info == KERASDIST_OK ? 1 : 0; break;
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

REGISTER_OP("KerasdistBarrier")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Blocks until every rank has reached the barrier.");

REGISTER_OP("KerasdistJoin")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Marks this rank as out of data; returns when all ranks have joined.");

// Stateful, so that it is never constant-folded: a traced function reads the
// context each time it runs (e.g. after shutdown() and init() on a new comm).
REGISTER_OP("KerasdistQuery")
    .Attr("query: int")
    .Attr("process_set_id: int = 0")
    .Output("value: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Reads rank (0), local rank (1), size (2), local size (3) or process-set membership (4).");

REGISTER_KERNEL_BUILDER(Name("KerasdistBarrier").Device(tensorflow::DEVICE_CPU), BarrierOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistJoin").Device(tensorflow::DEVICE_CPU), JoinOp);
REGISTER_KERNEL_BUILDER(Name("KerasdistQuery").Device(tensorflow::DEVICE_CPU), QueryOp);

}  // namespace kerasdist_tf

#ifndef KERASDIST_TF_VERSION
#define KERASDIST_TF_VERSION "unknown"
#endif

extern "C" {
// The engine library's C API version this op library was compiled against:
// Python refuses to load it when the engine library's differs.
int32_t kerasdist_tf_api_version(void) { return KERASDIST_API_VERSION; }
// The TensorFlow version the op library was compiled against (setup.py).
const char* kerasdist_built_tf_version(void) { return KERASDIST_TF_VERSION; }
}
