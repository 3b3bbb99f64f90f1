// Conversions between the core's types and TensorFlow's, shared by the op
// files (defined in ops.cc).
#pragma once

#include <memory>

#include "../core/common.h"
#include "../core/engine.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow {
class OpKernelContext;
}

namespace kerasdist {

// False for a dtype the engine does not carry.
bool ToCoreDataType(tensorflow::DataType dt, DataType* out);
// Mismatch -> FailedPrecondition, timeout -> Unavailable, and so on.
tensorflow::Status ToTensorFlowStatus(const Status& s);
// The engine of process set `process_set_id` (0: the global set), or null
// with ctx's status set: kerasdist not initialized, or this rank not in it.
std::shared_ptr<Engine> LiveEngine(tensorflow::OpKernelContext* ctx, int process_set_id);

}  // namespace kerasdist
