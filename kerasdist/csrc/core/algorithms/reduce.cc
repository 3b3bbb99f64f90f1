#include "algorithms/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kerasdist {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (absx < 0x38800000u) {  // subnormal half or zero
    if (absx < 0x33000000u) return sign;
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Integer sums and products wrap modulo 2^bits, as numpy's do; signed
// overflow is undefined in C++, so they are computed in the unsigned type.
template <typename T, bool = std::is_integral<T>::value>
struct WrapOf { using type = T; };
template <typename T>
struct WrapOf<T, true> { using type = std::make_unsigned_t<T>; };
template <typename T>
using Wrap = typename WrapOf<T>::type;
struct Sum {
  template <typename T> T operator()(T a, T b) const {
    return static_cast<T>(static_cast<Wrap<T>>(a) + static_cast<Wrap<T>>(b));
  }
};
struct Prod {
  template <typename T> T operator()(T a, T b) const {
    return static_cast<T>(static_cast<Wrap<T>>(a) * static_cast<Wrap<T>>(b));
  }
};
struct Min { template <typename T> T operator()(T a, T b) const { return b < a ? b : a; } };
struct Max { template <typename T> T operator()(T a, T b) const { return a < b ? b : a; } };

template <typename T, typename F>
void Loop(T* __restrict dst, const T* __restrict src, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

// 16-bit floats: widen a block to float32, reduce, narrow.
template <typename F, float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Loop16(uint16_t* dst, const uint16_t* src, size_t n, F f) {
  constexpr size_t kBlock = 1024;
  float a[kBlock], b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) a[i] = ToF(dst[base + i]);
    for (size_t i = 0; i < m; ++i) b[i] = ToF(src[base + i]);
    for (size_t i = 0; i < m; ++i) a[i] = f(a[i], b[i]);
    for (size_t i = 0; i < m; ++i) dst[base + i] = FromF(a[i]);
  }
}

template <typename F>
void Dispatch(void* dst, const void* src, size_t n, DataType dtype, F f) {
  switch (dtype) {
    case DataType::kFloat16:
      Loop16<F, HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst),
                                          static_cast<const uint16_t*>(src), n, f);
      break;
    case DataType::kBFloat16:
      Loop16<F, BFloat16ToFloat, FloatToBFloat16>(
          static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, f);
      break;
    case DataType::kFloat32:
      Loop(static_cast<float*>(dst), static_cast<const float*>(src), n, f);
      break;
    case DataType::kFloat64:
      Loop(static_cast<double*>(dst), static_cast<const double*>(src), n, f);
      break;
    case DataType::kInt32:
      Loop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, f);
      break;
    case DataType::kInt64:
      Loop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, f);
      break;
    case DataType::kUInt8:
      // uint8 arithmetic wraps modulo 256, as numpy's does.
      Loop(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n,
           [f](uint8_t a, uint8_t b) {
             return static_cast<uint8_t>(f(static_cast<uint32_t>(a), static_cast<uint32_t>(b)));
           });
      break;
    case DataType::kInt8:
      Loop(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n,
           [f](int8_t a, int8_t b) {
             return static_cast<int8_t>(f(static_cast<int32_t>(a), static_cast<int32_t>(b)));
           });
      break;
    case DataType::kUInt16:  // wraps modulo 65536, as numpy's uint16
      Loop(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
           [f](uint16_t a, uint16_t b) {
             return static_cast<uint16_t>(
                 f(static_cast<uint32_t>(a), static_cast<uint32_t>(b)));
           });
      break;
    case DataType::kInt16:
      Loop(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n,
           [f](int16_t a, int16_t b) {
             return static_cast<int16_t>(f(static_cast<int32_t>(a), static_cast<int32_t>(b)));
           });
      break;
    case DataType::kBool:  // min / max only (the coordinator refuses the rest)
      Loop(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n,
           [f](uint8_t a, uint8_t b) {
             return static_cast<uint8_t>(f(static_cast<uint32_t>(a), static_cast<uint32_t>(b)));
           });
      break;
  }
}

template <typename T>
void ScaleT(T* dst, const T* src, size_t n, double factor) {
  if (std::is_floating_point<T>::value) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
    // Scaled integers saturate at the type's range (a float-to-integer
    // conversion out of range is undefined); NaN becomes 0.
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
    for (size_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(src[i]) * factor;
      dst[i] = v != v ? T(0)
               : v <= lo ? std::numeric_limits<T>::min()
               : v >= hi ? std::numeric_limits<T>::max()
                         : static_cast<T>(v);
    }
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Scale16(uint16_t* dst, const uint16_t* src, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) dst[i] = FromF(ToF(src[i]) * f);
}

void ScaleDispatch(void* dst, const void* src, size_t n, DataType dtype,
                   double factor) {
  switch (dtype) {
    case DataType::kFloat16:
      Scale16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst),
                                        static_cast<const uint16_t*>(src), n, factor);
      break;
    case DataType::kBFloat16:
      Scale16<BFloat16ToFloat, FloatToBFloat16>(
          static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, factor);
      break;
    case DataType::kFloat32:
      ScaleT(static_cast<float*>(dst), static_cast<const float*>(src), n, factor);
      break;
    case DataType::kFloat64:
      ScaleT(static_cast<double*>(dst), static_cast<const double*>(src), n, factor);
      break;
    case DataType::kInt32:
      ScaleT(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, factor);
      break;
    case DataType::kInt64:
      ScaleT(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, factor);
      break;
    case DataType::kUInt8:
      ScaleT(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, factor);
      break;
    case DataType::kInt8:
      ScaleT(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, factor);
      break;
    case DataType::kUInt16:
      ScaleT(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, factor);
      break;
    case DataType::kInt16:
      ScaleT(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n, factor);
      break;
    case DataType::kBool: break;  // never scaled (refused by the coordinator)
  }
}

template <typename T>
void DivideT(T* buf, size_t n, int64_t d) {
  const T div = static_cast<T>(d);
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] / div);
}

template <typename To, typename From>
void ConvertT(To* dst, const From* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

template <typename From>
void ConvertFrom(void* dst, DataType to, const From* src, size_t n) {
  switch (to) {
    case DataType::kInt32: ConvertT(static_cast<int32_t*>(dst), src, n); break;
    case DataType::kInt64: ConvertT(static_cast<int64_t*>(dst), src, n); break;
    case DataType::kUInt8: ConvertT(static_cast<uint8_t*>(dst), src, n); break;
    case DataType::kInt8: ConvertT(static_cast<int8_t*>(dst), src, n); break;
    case DataType::kUInt16: ConvertT(static_cast<uint16_t*>(dst), src, n); break;
    case DataType::kInt16: ConvertT(static_cast<int16_t*>(dst), src, n); break;
    default: break;
  }
}

}  // namespace

DataType AccumulationType(DataType dtype, ReduceOp op) {
  if (op != ReduceOp::kAverage) return dtype;
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kUInt16:
    case DataType::kInt16: return DataType::kInt32;
    case DataType::kInt32: return DataType::kInt64;
    default: return dtype;
  }
}

void ConvertInteger(void* dst, DataType to, const void* src, DataType from,
                    size_t count) {
  switch (from) {
    case DataType::kInt32: ConvertFrom(dst, to, static_cast<const int32_t*>(src), count); break;
    case DataType::kInt64: ConvertFrom(dst, to, static_cast<const int64_t*>(src), count); break;
    case DataType::kUInt8: ConvertFrom(dst, to, static_cast<const uint8_t*>(src), count); break;
    case DataType::kInt8: ConvertFrom(dst, to, static_cast<const int8_t*>(src), count); break;
    case DataType::kUInt16:
      ConvertFrom(dst, to, static_cast<const uint16_t*>(src), count);
      break;
    case DataType::kInt16: ConvertFrom(dst, to, static_cast<const int16_t*>(src), count); break;
    default: break;
  }
}

void ReduceInto(void* dst, const void* src, size_t count, DataType dtype,
                ReduceOp op) {
  if (count == 0) return;
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: Dispatch(dst, src, count, dtype, Sum()); break;
    case ReduceOp::kProduct: Dispatch(dst, src, count, dtype, Prod()); break;
    case ReduceOp::kMin: Dispatch(dst, src, count, dtype, Min()); break;
    case ReduceOp::kMax: Dispatch(dst, src, count, dtype, Max()); break;
    case ReduceOp::kAdasum: break;  // not element-wise: AdasumAllreduce (adasum.cc)
  }
}

template <typename T>
void SumFrom(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

void ReduceFrom(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                ReduceOp op) {
  if (count == 0) return;
  const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (dst != a && sum && dtype == DataType::kFloat32) {
    SumFrom(static_cast<float*>(dst), static_cast<const float*>(a),
            static_cast<const float*>(b), count);
  } else if (dst != a && sum && dtype == DataType::kFloat64) {
    SumFrom(static_cast<double*>(dst), static_cast<const double*>(a),
            static_cast<const double*>(b), count);
  } else {
    if (dst != a) std::memcpy(dst, a, count * DataTypeSize(dtype));
    ReduceInto(dst, b, count, dtype, op);
  }
}

void ScaleInPlace(void* buf, size_t count, DataType dtype, double factor) {
  if (factor == 1.0 || count == 0) return;
  ScaleDispatch(buf, buf, count, dtype, factor);
}

void CopyScaled(void* dst, const void* src, size_t count, DataType dtype,
                double factor) {
  if (count == 0) return;
  if (factor == 1.0) {
    if (dst != src) std::memcpy(dst, src, count * DataTypeSize(dtype));
    return;
  }
  ScaleDispatch(dst, src, count, dtype, factor);
}

void Finalize(void* buf, size_t count, DataType dtype, ReduceOp op,
              int world_size, double postscale) {
  if (count == 0) return;
  if (op == ReduceOp::kAverage && world_size > 1) {
    if (IsIntegerType(dtype)) {
      switch (dtype) {
        case DataType::kInt32: DivideT(static_cast<int32_t*>(buf), count, world_size); break;
        case DataType::kInt64: DivideT(static_cast<int64_t*>(buf), count, world_size); break;
        case DataType::kUInt8: DivideT(static_cast<uint8_t*>(buf), count, world_size); break;
        case DataType::kInt8: DivideT(static_cast<int8_t*>(buf), count, world_size); break;
        case DataType::kUInt16: DivideT(static_cast<uint16_t*>(buf), count, world_size); break;
        case DataType::kInt16: DivideT(static_cast<int16_t*>(buf), count, world_size); break;
        default: break;
      }
    } else {
      postscale /= world_size;
    }
  }
  ScaleInPlace(buf, count, dtype, postscale);
}

}  // namespace kerasdist
