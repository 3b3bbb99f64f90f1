// Registration helpers shared by the op files.
#pragma once

#include "tensorflow/core/framework/shape_inference.h"

// The dtypes every kerasdist collective accepts.
#define KERASDIST_TF_TYPES \
  "{half, bfloat16, float, double, int32, int64, uint8, int8, uint16, int16, bool}"

namespace kerasdist_tf {

// Output i: input i with an unknown first dimension (scalars are refused).
inline tensorflow::Status FirstDimUnknown(tensorflow::shape_inference::InferenceContext* c,
                                          int i, const char* op) {
  tensorflow::shape_inference::ShapeHandle in = c->input(i), out;
  if (c->RankKnown(in) && c->Rank(in) == 0)
    return tensorflow::errors::InvalidArgument(op,
                                               " does not support scalar inputs; reshape to [1].");
  if (!c->RankKnown(in)) {
    c->set_output(i, in);
    return tensorflow::Status();
  }
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(i, out);
  return tensorflow::Status();
}

}  // namespace kerasdist_tf
