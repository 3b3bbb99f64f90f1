// Helpers shared by the sanitizer driver's parts: deterministic inputs,
// exact references, request slots with bounded waits, and failure reporting.
//
// Inputs are chosen so that every reduction is exact in its dtype whatever
// the order of the ring's partial reductions (small integers and halves for
// sums, multiples of the world size for averages, a few small factors for
// products), so results are compared bit for bit with a reference computed
// here from every rank's inputs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/engine.h"
#include "algorithms/reduce.h"

namespace kdt {

using kerasdist::DataType;
using kerasdist::OpType;
using kerasdist::ReduceOp;
using kerasdist::Request;
using kerasdist::Status;
using kerasdist::StatusCode;

extern int g_rank;  // for messages; -1 before MPI

// Prints and aborts: a signal makes hydra stop the whole job at once.
[[noreturn]] inline void Fail(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "DRIVER FAIL (rank %d): %s\n", g_rank, buf);
  std::fflush(nullptr);
  std::abort();
}

#define KDT_CHECK(cond, ...) \
  do {                       \
    if (!(cond)) ::kdt::Fail(__VA_ARGS__); \
  } while (0)

constexpr DataType kAllTypes[] = {
    DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
    DataType::kInt32,   DataType::kInt64,    DataType::kUInt8,   DataType::kInt8};
constexpr ReduceOp kAllOps[] = {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin,
                                ReduceOp::kMax, ReduceOp::kProduct};

inline uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t Hash(uint64_t seed, int rank, size_t i) {
  return Mix(seed * 0x100000001b3ULL ^ Mix(static_cast<uint64_t>(rank) << 48 ^ i));
}

// Small seeded generator for the soak's choices.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(Mix(seed)) {}
  uint64_t Next() { return s = Mix(s); }
  int Int(int lo, int hi) { return lo + static_cast<int>(Next() % (hi - lo + 1)); }
};

inline bool IsFloat(DataType t) { return !kerasdist::IsIntegerType(t); }

// Value of element i of `rank`'s input for an allreduce `op` (floats).
inline double GenFloat(DataType t, ReduceOp op, int rank, size_t i, uint64_t seed,
                       int world) {
  const uint64_t h = Hash(seed, rank, i);
  switch (op) {
    case ReduceOp::kSum: return (static_cast<int>(h % 33) - 16) * 0.5;
    case ReduceOp::kAverage: return world * (static_cast<int>(h % 17) - 8.0);
    case ReduceOp::kProduct: {
      static const double f[] = {-2, -1, -0.5, 0.5, 1, 1.5, 2};
      return f[h % 7];
    }
    default:
      if (t == DataType::kFloat32 || t == DataType::kFloat64)
        return (static_cast<int>(h % 2001) - 1000) / 8.0;
      return (static_cast<int>(h % 201) - 100) / 4.0;
  }
}

inline int64_t GenInt(DataType t, ReduceOp op, int rank, size_t i, uint64_t seed) {
  const uint64_t h = Hash(seed, rank, i);
  if (op == ReduceOp::kProduct)
    return t == DataType::kInt64 ? static_cast<int64_t>(h % 2001) - 1000
                                 : static_cast<int64_t>(h % 15) - 7;
  const bool bounded = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  switch (t) {
    case DataType::kUInt8: return static_cast<int64_t>(h % 256);
    case DataType::kInt8: return static_cast<int64_t>(h % 256) - 128;
    case DataType::kInt32:
      if (op == ReduceOp::kSum) return static_cast<int64_t>(h % (1 << 21)) - (1 << 20);
      return static_cast<int32_t>(static_cast<uint32_t>(h));
    default:  // int64: sums stay far from overflow
      if (bounded) return static_cast<int64_t>(h % (1ULL << 51)) - (1LL << 50);
      return static_cast<int64_t>(h);
  }
}

// Stores a value that is exactly representable in `t` (integers wrap).
inline void PutFloat(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = kerasdist::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = kerasdist::FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    default: static_cast<double*>(buf)[i] = v; break;
  }
}

inline void PutInt(DataType t, void* buf, size_t i, int64_t v) {
  switch (t) {
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = v; break;
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    default: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
  }
}

inline double GetNumber(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::kFloat16: return kerasdist::HalfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16:
      return kerasdist::BFloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    default: return static_cast<const int8_t*>(buf)[i];
  }
}

// Exactly sized heap buffer, so ASAN sees any access past either end.
struct Buf {
  std::unique_ptr<char[]> p;
  size_t bytes = 0;
  Buf() = default;
  explicit Buf(size_t n) : p(new char[n]), bytes(n) {}
  char* data() const { return p.get(); }
};

// Rank `rank`'s input for an allreduce (also used for broadcast/allgather).
inline Buf MakeInput(DataType t, ReduceOp op, size_t count, int rank, uint64_t seed,
                     int world) {
  Buf b(count * kerasdist::DataTypeSize(t));
  for (size_t i = 0; i < count; ++i) {
    if (IsFloat(t)) PutFloat(t, b.data(), i, GenFloat(t, op, rank, i, seed, world));
    else PutInt(t, b.data(), i, GenInt(t, op, rank, i, seed));
  }
  return b;
}

// The exact allreduce result over the ranks flagged in `contributes`.
inline Buf MakeExpected(DataType t, ReduceOp op, size_t count, uint64_t seed, int world,
                        const std::vector<bool>& contributes) {
  Buf b(count * kerasdist::DataTypeSize(t));
  int n = 0;
  for (bool c : contributes) n += c;
  for (size_t i = 0; i < count; ++i) {
    bool first = true;
    if (IsFloat(t)) {
      double acc = 0;
      for (int r = 0; r < world; ++r) {
        if (!contributes[r]) continue;
        const double v = GenFloat(t, op, r, i, seed, world);
        if (first) acc = v;
        else if (op == ReduceOp::kSum || op == ReduceOp::kAverage) acc += v;
        else if (op == ReduceOp::kProduct) acc *= v;
        else if (op == ReduceOp::kMin) acc = v < acc ? v : acc;
        else acc = v > acc ? v : acc;
        first = false;
      }
      if (op == ReduceOp::kAverage) acc /= n;
      PutFloat(t, b.data(), i, acc);
    } else {
      int64_t acc = 0;
      for (int r = 0; r < world; ++r) {
        if (!contributes[r]) continue;
        const int64_t v = GenInt(t, op, r, i, seed);
        if (first) acc = v;
        else if (op == ReduceOp::kSum || op == ReduceOp::kAverage) acc += v;
        else if (op == ReduceOp::kProduct) acc *= v;
        else if (op == ReduceOp::kMin) acc = v < acc ? v : acc;
        else acc = v > acc ? v : acc;
        first = false;
      }
      if (op == ReduceOp::kAverage) acc /= n;  // truncates toward zero
      PutInt(t, b.data(), i, acc);
    }
  }
  return b;
}

// Bitwise comparison, naming the first differing element.
inline void ExpectEqual(const char* what, DataType t, const void* got, const void* want,
                        size_t count) {
  const size_t e = kerasdist::DataTypeSize(t);
  if (count == 0 || std::memcmp(got, want, count * e) == 0) return;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * e,
                    static_cast<const char*>(want) + i * e, e) != 0)
      Fail("%s (%s, %zu elements): element %zu is %.17g, expected %.17g", what,
           kerasdist::DataTypeName(t), count, i, GetNumber(t, got, i),
           GetNumber(t, want, i));
  }
}

// A request's completion, waited on with a bound.
struct Slot {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int calls = 0;
  Status status;
};
using SlotPtr = std::shared_ptr<Slot>;

inline kerasdist::DoneFn DoneInto(const SlotPtr& slot) {
  return [slot](const Status& s) {
    std::lock_guard<std::mutex> lock(slot->mu);
    ++slot->calls;
    slot->status = s;
    slot->done = true;
    slot->cv.notify_all();
  };
}

inline Status Wait(const SlotPtr& slot, const std::string& what, double seconds = 120) {
  std::unique_lock<std::mutex> lock(slot->mu);
  if (!slot->cv.wait_for(lock, std::chrono::duration<double>(seconds),
                         [&] { return slot->done; }))
    Fail("'%s' did not complete within %.0f s", what.c_str(), seconds);
  KDT_CHECK(slot->calls == 1, "'%s': done called %d times", what.c_str(), slot->calls);
  return slot->status;
}

inline void ExpectOk(const Status& s, const std::string& what) {
  KDT_CHECK(s.ok(), "'%s' failed: code %d: %s", what.c_str(), static_cast<int>(s.code()),
            s.message().c_str());
}

inline Request MakeRequest(const std::string& name, OpType type, DataType t,
                           std::vector<int64_t> shape, const SlotPtr& slot) {
  Request r;
  r.name = name;
  r.meta.type = type;
  r.meta.dtype = t;
  r.meta.shape = std::move(shape);
  r.done = DoneInto(slot);
  return r;
}

// Output of an allgather, allocated by the engine thread through the
// request's allocate callback.
struct Gathered {
  std::mutex mu;
  Buf buf;
  std::vector<int64_t> shape;
  int allocations = 0;
};

inline kerasdist::AllocateFn AllocateInto(const std::shared_ptr<Gathered>& g, DataType t) {
  return [g, t](const std::vector<int64_t>& shape, void** data) {
    std::lock_guard<std::mutex> lock(g->mu);
    ++g->allocations;
    g->shape = shape;
    g->buf = Buf(static_cast<size_t>(kerasdist::NumElements(shape)) *
                 kerasdist::DataTypeSize(t));
    *data = g->buf.data();
    return Status::OK();
  };
}

// Rows of the allgather input of `rank` (`dim0` rows of `row` elements).
inline Buf GatherInput(DataType t, int64_t dim0, int64_t row, int rank, uint64_t seed) {
  return MakeInput(t, ReduceOp::kMin, static_cast<size_t>(dim0 * row), rank, seed, 1);
}

inline Buf GatherExpected(DataType t, const std::vector<int64_t>& dim0, int64_t row,
                          uint64_t seed) {
  int64_t rows = 0;
  for (int64_t d : dim0) rows += d;
  const size_t e = kerasdist::DataTypeSize(t);
  Buf out(static_cast<size_t>(rows * row) * e);
  size_t off = 0;
  for (size_t r = 0; r < dim0.size(); ++r) {
    Buf in = GatherInput(t, dim0[r], row, static_cast<int>(r), seed);
    if (in.bytes) std::memcpy(out.data() + off, in.data(), in.bytes);
    off += in.bytes;
  }
  return out;
}

inline kerasdist::EngineConfig DriverConfig(bool shm, int64_t timeout_ms = 30000) {
  kerasdist::EngineConfig c;
  c.shared_memory = shm;
  c.version = "sanitizer-driver";
  c.collective.timeout_ms = timeout_ms;
  c.coordinator.fusion_threshold_bytes = 1 << 20;  // fused batches also split
  c.coordinator.stall_warning_us = 30 * 1000000LL;
  return c;
}

inline std::unique_ptr<kerasdist::Context> CreateContext(const kerasdist::EngineConfig& c) {
  std::unique_ptr<kerasdist::Context> ctx;
  Status s = kerasdist::Context::Create(MPI_COMM_WORLD, c, 30000, &ctx);
  ExpectOk(s, "Context::Create");
  return ctx;
}

// Parts of the driver (each returns the number of collectives checked).
int RunSweep(kerasdist::Engine* e, int rank, int size);
int RunScatterSweep(kerasdist::Engine* e, int rank, int size);
int RunSoak(kerasdist::Engine* e, int rank, int size, uint64_t seed, int rounds);
int RunFuzz(uint64_t seed, int iterations);
void RunFaults(bool shm, int rank, int size);
void RunCApi(int rank, int size);  // capi.cc
void RunSigstop(bool shm, int rank, int size);
void RunOverflow(kerasdist::Engine* e, int rank, int size, bool prescale);

}  // namespace kdt
