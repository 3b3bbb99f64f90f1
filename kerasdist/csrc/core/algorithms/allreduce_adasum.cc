// Adasum: adaptive summation of gradients (Maleki et al., "Adasum: Scaling
// Distributed Training with Adaptive Summation", MLSys 2021 / arXiv 2020).
//
// For two gradients a and b, Adasum(a, b) = (1 - a.b / (2|a|^2)) a
//                                         + (1 - a.b / (2|b|^2)) b:
// the sum when they are orthogonal, their average when they are parallel.
// N = 2^k ranks combine in a binary tree: at level d (d = 1, 2, 4, ...)
// rank r exchanges its current vector with rank r ^ d and both compute
// Adasum(lower rank's vector, higher rank's vector), so after log2(N) levels
// every rank holds ((g0 + g1) + (g2 + g3)) + ... with + meaning Adasum.
//
// The dot products and norms are taken per tensor (a fused buffer holds
// several, `counts` gives their lengths), accumulated in double. Both ranks
// of a pair compute the same expression with the operands in the same
// order, so replicas are bit-identical. Each level exchanges the whole
// buffer: log2(N) x bytes per rank, not bandwidth-optimal (Horovod's CPU
// version halves the vectors level by level); the result is the same tree.
#include <cstring>
#include <memory>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

struct F32 {
  using T = float;
  static double Get(T v) { return v; }
  static T Put(double v) { return static_cast<T>(v); }
};
struct F64 {
  using T = double;
  static double Get(T v) { return v; }
  static T Put(double v) { return v; }
};
struct F16 {
  using T = uint16_t;
  static double Get(T v) { return HalfToFloat(v); }
  static T Put(double v) { return FloatToHalf(static_cast<float>(v)); }
};
struct BF16 {
  using T = uint16_t;
  static double Get(T v) { return BFloat16ToFloat(v); }
  static T Put(double v) { return FloatToBFloat16(static_cast<float>(v)); }
};

// out = Adasum(a, b), element-wise; out may alias a or b.
template <typename K>
void Combine(const typename K::T* a, const typename K::T* b, typename K::T* out, size_t n) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = K::Get(a[i]), y = K::Get(b[i]);
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  // A zero vector leaves the other unchanged (its coefficient would be 0/0).
  const double ca = aa > 0 ? 1.0 - dot / (2.0 * aa) : 1.0;
  const double cb = bb > 0 ? 1.0 - dot / (2.0 * bb) : 1.0;
  for (size_t i = 0; i < n; ++i) out[i] = K::Put(ca * K::Get(a[i]) + cb * K::Get(b[i]));
}

template <typename K>
void CombineAll(char* mine, const char* theirs, bool mine_first,
                const std::vector<int64_t>& counts) {
  using T = typename K::T;
  T* m = reinterpret_cast<T*>(mine);
  const T* o = reinterpret_cast<const T*>(theirs);
  for (int64_t c : counts) {
    const size_t n = static_cast<size_t>(c);
    if (mine_first)
      Combine<K>(m, o, m, n);
    else
      Combine<K>(o, m, m, n);
    m += n;
    o += n;
  }
}

}  // namespace

Status AdasumAllreduce(Transport* t, void* buf, const std::vector<int64_t>& counts,
                       DataType dtype, const CollectiveOptions& options,
                       std::vector<char>* scratch, RingTimes* times) {
  if (times) times->start = NowMicros();
  const int n = t->size(), r = t->rank();
  if (n & (n - 1))
    return Status(StatusCode::kInvalidArgument,
                  "Adasum needs a power-of-two number of ranks. Received: size=" +
                      std::to_string(n));
  if (!IsAdasumType(dtype))
    return Status(StatusCode::kInvalidArgument,
                  std::string("Adasum needs a floating-point dtype. Received: ") +
                      DataTypeName(dtype));
  size_t count = 0;
  for (int64_t c : counts) count += static_cast<size_t>(c);
  const size_t bytes = count * DataTypeSize(dtype);
  if (scratch->size() < bytes) scratch->resize(bytes);
  char* mine = static_cast<char*>(buf);
  char* incoming = scratch->data();
  for (int mask = 1; mask < n && bytes > 0; mask <<= 1) {
    const int peer = r ^ mask;
    std::vector<std::unique_ptr<Transfer>> transfers;
    transfers.push_back(t->Irecv(peer, kTagData, incoming, bytes));
    transfers.push_back(t->Isend(peer, kTagData, mine, bytes));
    Status s = WaitTransfers(&transfers, options.timeout_ms);
    if (!s.ok()) return s;
    const bool first = r < peer;
    switch (dtype) {
      case DataType::kFloat32: CombineAll<F32>(mine, incoming, first, counts); break;
      case DataType::kFloat64: CombineAll<F64>(mine, incoming, first, counts); break;
      case DataType::kFloat16: CombineAll<F16>(mine, incoming, first, counts); break;
      default: CombineAll<BF16>(mine, incoming, first, counts); break;
    }
  }
  if (times) times->reduce_scatter_end = times->end = NowMicros();
  return Status::OK();
}

}  // namespace kerasdist
