// What every kerasdist TensorFlow kernel shares. The op library reaches the
// engine only through the engine library's C API (capi/kerasdist.h): it
// compiles no core source, so a process that loads TensorFlow, PyTorch and
// JAX bindings still runs one engine.
//
// A kernel describes its tensors as kerasdist_request structs and enqueues
// them as one batch with a completion callback; done() runs once the
// collective has run on every rank, on an engine thread or, with
// KERASDIST_INLINE, on the kernel's own thread.
#pragma once

#include <string>
#include <vector>

#include "capi/kerasdist.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace kerasdist_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// A mismatch across ranks is FailedPrecondition, a local argument error
// InvalidArgument, a timeout Unavailable, as in Horovod.
tensorflow::Status ToTensorFlowStatus(int32_t code, const char* message);

// False, with ctx's status set, for a dtype the engine does not carry.
bool ToDataType(OpKernelContext* ctx, tensorflow::DataType dt, int32_t* out);

// Allocates output `index` of the kernel's context (the C API's allocate
// callback; `user` is the OpKernelContext).
int32_t AllocateOutput(void* user, int32_t index, int32_t ndim, const int64_t* shape,
                       void** data);

// Enqueues `requests` as one batch; on completion sets ctx's status from
// the result and calls `done`. `held` tensors stay referenced until then.
// `own_fault`: this rank's own input caused a cross-rank failure, which it
// then reports as InvalidArgument (Horovod's code) rather than a mismatch.
void Enqueue(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
             const std::vector<kerasdist_request>& requests, const char* group_name,
             bool inline_wait, std::vector<Tensor> held = {}, bool own_fault = false);

class CollectiveKernel : public AsyncOpKernel {
 public:
  explicit CollectiveKernel(OpKernelConstruction* c);

 protected:
  // The collective's name: the tensor_name attribute, else the node's.
  const std::string& BaseName() const { return tensor_name_.empty() ? name() : tensor_name_; }
  // A request for `op` on the kernel's process set.
  kerasdist_request NewRequest(int32_t op) const;
  // Fills r's dtype, shape (stored in *dims, which must outlive the
  // enqueue) and input from `t`. False, with ctx's status set, on failure.
  bool Describe(OpKernelContext* ctx, const Tensor& t, kerasdist_request* r,
                std::vector<int64_t>* dims) const;
  // Whether this rank can run a collective on the kernel's process set; if
  // so fills its rank and size there. False, with ctx's status set, if not.
  bool ProcessSetInfo(OpKernelContext* ctx, int32_t* rank, int32_t* size) const;

  std::string tensor_name_;
  int process_set_id_;
};

}  // namespace kerasdist_tf
