// Element-wise reduction kernels. The dtype is dispatched once per call; the
// inner loops are plain and vectorisable. float16 and bfloat16 are reduced in
// float32 blocks and rounded back (round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/common.h"

namespace kerasdist {

// dst[i] = op(dst[i], src[i]) for i in [0, count). kAverage reduces as kSum;
// the division happens in Finalize.
void ReduceInto(void* dst, const void* src, size_t count, DataType dtype,
                ReduceOp op);

// dst[i] = op(a[i], b[i]): ReduceInto out of place (`dst` may equal `a`).
// float32 and float64 sums run in one pass; other cases copy `a` first.
void ReduceFrom(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                ReduceOp op);

// buf[i] *= factor. Integers are multiplied in double and truncated toward
// zero, saturating at the type's range. A factor of exactly 1.0 is a no-op.
void ScaleInPlace(void* buf, size_t count, DataType dtype, double factor);

// dst[i] = src[i] * factor (a copy that applies a prescale on the way).
void CopyScaled(void* dst, const void* src, size_t count, DataType dtype,
                double factor);

// Applies the post-reduction step of `op`: the average divides by
// `world_size` (floats multiply by 1/size, integers divide truncating toward
// zero), then `postscale` is applied.
void Finalize(void* buf, size_t count, DataType dtype, ReduceOp op,
              int world_size, double postscale);

// The type a reduction accumulates in: averages of 8-bit integers in int32
// and of int32 in int64 (so that a mean that fits is exact); otherwise the
// element type itself.
DataType AccumulationType(DataType dtype, ReduceOp op);

// Converts `count` integers from `from` to `to` (both integer types); a
// value outside `to`'s range wraps, as numpy's astype does.
void ConvertInteger(void* dst, DataType to, const void* src, DataType from,
                    size_t count);

// Conversions used by the kernels and the tests.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace kerasdist
