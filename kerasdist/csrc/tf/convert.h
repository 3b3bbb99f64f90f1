// Conversions between the core's types and TensorFlow's, shared by the op
// files (defined in ops.cc).
#pragma once

#include "../core/common.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

namespace kerasdist {

// False for a dtype the engine does not carry.
bool ToCoreDataType(tensorflow::DataType dt, DataType* out);
// Mismatch -> FailedPrecondition, timeout -> Unavailable, and so on.
tensorflow::Status ToTensorFlowStatus(const Status& s);

}  // namespace kerasdist
