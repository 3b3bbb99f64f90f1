// Common vocabulary of the kerasdist engine: data types, reduce ops, status.
//
// This header and everything in csrc/core is framework-free C++17: no
// framework include may appear here. The C API (csrc/capi) carries these
// as plain integers; each binding maps them to its framework's own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kerasdist {

// Wire/data types. The numeric values are part of the control protocol.
enum class DataType : int32_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  kUInt16 = 8,
  kInt16 = 9,
  kBool = 10,  // one byte, 0 or 1: moved, and reduced only with min / max
};

enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  kAdasum = 5,  // adaptive summation (adasum.cc); allreduce only
};

// What a request asks the engine to do.
enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kJoin = 4,
  kReducescatter = 5,
  kAlltoall = 6,
};

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);
bool IsIntegerType(DataType dtype);
// The dtypes Adasum accepts: float16, bfloat16, float32, float64.
bool IsAdasumType(DataType dtype);

// Error categories. The binding maps them to TensorFlow status codes.
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,     // bad input on this rank
  kMismatch = 2,            // ranks disagree (dtype, shape, op, root)
  kTimeout = 3,             // a bounded wait ran out
  kAborted = 4,             // engine stopped: stall shutdown, peer error
  kShutdown = 5,            // engine shut down normally
  kInternal = 6,
  kPrecondition = 7,        // not initialized; not a member of the process set
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The peer a failed transfer waited on, or -1.
  int peer() const { return peer_; }
  Status& set_peer(int peer) {
    peer_ = peer;
    return *this;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int peer_ = -1;
};

// Number of elements of a shape (product of dims; 1 for a scalar).
int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace kerasdist
