// The collective sweep: every dtype and op of allreduce over edge sizes,
// ragged allgathers, broadcasts from every root, fused batches, barrier and
// join (then the reducescatter and alltoall sweep of scatter.cc), each
// checked bit for bit against the reference.
#include <algorithm>
#include <string>
#include <vector>

#include "driver_util.h"

namespace kdt {

namespace {

std::string Name(const char* kind, DataType t, const std::string& rest) {
  return std::string(kind) + "." + kerasdist::DataTypeName(t) + "." + rest;
}

// One allreduce, alone in its cycle. In place when `in_place`.
void OneAllreduce(kerasdist::Engine* e, int rank, int size, DataType t, ReduceOp op,
                  size_t count, bool in_place, uint64_t seed) {
  const std::string name =
      Name("ar", t, std::string(kerasdist::ReduceOpName(op)) + "." + std::to_string(count) +
                        (in_place ? ".inplace" : ""));
  Buf in = MakeInput(t, op, count, rank, seed, size);
  Buf keep = MakeInput(t, op, count, rank, seed, size);
  Buf out(in.bytes);
  if (!in_place && out.bytes) std::memset(out.data(), 0xA5, out.bytes);
  auto slot = std::make_shared<Slot>();
  Request r = MakeRequest(name, OpType::kAllreduce, t, {static_cast<int64_t>(count)}, slot);
  r.meta.reduce_op = op;
  r.input = in.data();
  r.output = in_place ? in.data() : out.data();
  e->Enqueue(std::move(r));
  ExpectOk(Wait(slot, name), name);
  Buf want = MakeExpected(t, op, count, seed, size, std::vector<bool>(size, true));
  ExpectEqual(name.c_str(), t, in_place ? in.data() : out.data(), want.data(), count);
  if (!in_place) ExpectEqual((name + " (input untouched)").c_str(), t, in.data(), keep.data(), count);
}

void AllreduceSweep(kerasdist::Engine* e, int rank, int size, int* n) {
  const size_t sizes[] = {0, 1, static_cast<size_t>(size - 1), static_cast<size_t>(size + 1),
                          1000, (1u << 20) + 3};
  uint64_t seed = 100;
  for (DataType t : kAllTypes)
    for (ReduceOp op : kAllOps)
      for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        OneAllreduce(e, rank, size, t, op, sizes[i], i == 3 || i == 4, ++seed);
        ++*n;
      }
}

void OneAllgather(kerasdist::Engine* e, int rank, int size, DataType t,
                  const std::vector<int64_t>& dim0, const std::vector<int64_t>& trailing,
                  const std::string& tag, uint64_t seed) {
  const std::string name = Name("ag", t, tag);
  int64_t row = 1;
  for (int64_t d : trailing) row *= d;
  Buf in = GatherInput(t, dim0[rank], row, rank, seed);
  std::vector<int64_t> shape{dim0[rank]};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  auto slot = std::make_shared<Slot>();
  auto g = std::make_shared<Gathered>();
  Request r = MakeRequest(name, OpType::kAllgather, t, shape, slot);
  r.input = in.data();
  r.allocate = AllocateInto(g, t);
  e->Enqueue(std::move(r));
  ExpectOk(Wait(slot, name), name);
  int64_t rows = 0;
  for (int64_t d : dim0) rows += d;
  std::lock_guard<std::mutex> lock(g->mu);
  KDT_CHECK(g->allocations == 1, "%s: %d allocations", name.c_str(), g->allocations);
  std::vector<int64_t> want_shape{rows};
  want_shape.insert(want_shape.end(), trailing.begin(), trailing.end());
  KDT_CHECK(g->shape == want_shape, "%s: output shape %s, expected %s", name.c_str(),
            kerasdist::ShapeString(g->shape).c_str(), kerasdist::ShapeString(want_shape).c_str());
  Buf want = GatherExpected(t, dim0, row, seed);
  ExpectEqual(name.c_str(), t, g->buf.data(), want.data(), static_cast<size_t>(rows * row));
}

void AllgatherSweep(kerasdist::Engine* e, int rank, int size, int* n) {
  const std::vector<std::vector<int64_t>> trailings = {{}, {3}, {2, 5}, {1, 0}};
  uint64_t seed = 5000;
  for (DataType t : kAllTypes) {
    for (size_t k = 0; k < trailings.size(); ++k) {
      for (int variant = 0; variant < 3; ++variant) {
        std::vector<int64_t> dim0(size);
        for (int r = 0; r < size; ++r) dim0[r] = (r * 2 + variant * 3 + k) % 5;
        OneAllgather(e, rank, size, t, dim0, trailings[k],
                     std::to_string(k) + "." + std::to_string(variant), ++seed);
        ++*n;
      }
    }
    // No rows anywhere.
    OneAllgather(e, rank, size, t, std::vector<int64_t>(size, 0), {4}, "empty", ++seed);
    ++*n;
  }
  // Large and ragged: crosses many segments and fragments.
  std::vector<int64_t> dim0(size);
  for (int r = 0; r < size; ++r) dim0[r] = 1000 + 37 * r;
  OneAllgather(e, rank, size, DataType::kFloat32, dim0, {257}, "large", ++seed);
  ++*n;
}

void OneBroadcast(kerasdist::Engine* e, int rank, int size, DataType t, int root,
                  size_t count, bool in_place, uint64_t seed) {
  const std::string name = Name("bc", t, std::to_string(root) + "." + std::to_string(count) +
                                             (in_place ? ".inplace" : ""));
  Buf in = MakeInput(t, ReduceOp::kMin, count, rank, seed, size);
  Buf out(in.bytes);
  if (out.bytes) std::memset(out.data(), 0x5A, out.bytes);
  if (in_place && rank == root && in.bytes) std::memcpy(out.data(), in.data(), in.bytes);
  auto slot = std::make_shared<Slot>();
  Request r = MakeRequest(name, OpType::kBroadcast, t, {static_cast<int64_t>(count)}, slot);
  r.meta.root = root;
  r.input = in_place ? out.data() : in.data();
  r.output = out.data();
  e->Enqueue(std::move(r));
  ExpectOk(Wait(slot, name), name);
  Buf want = MakeInput(t, ReduceOp::kMin, count, root, seed, size);
  ExpectEqual(name.c_str(), t, out.data(), want.data(), count);
}

void BroadcastSweep(kerasdist::Engine* e, int rank, int size, int* n) {
  uint64_t seed = 9000;
  for (DataType t : kAllTypes)
    for (int root = 0; root < size; ++root)
      for (size_t count : {size_t{0}, size_t{1}, size_t{1000}}) {
        OneBroadcast(e, rank, size, t, root, count, count == 1, ++seed);
        ++*n;
      }
  for (int root = 0; root < size; ++root) {
    OneBroadcast(e, rank, size, DataType::kUInt8, root, (1u << 20) + 3, false, ++seed);
    OneBroadcast(e, rank, size, DataType::kFloat64, root, (1u << 20) + 3, true, ++seed);
    *n += 2;
  }
}

struct BatchItem {
  DataType t;
  ReduceOp op;
  size_t count;
  double prescale = 1.0, postscale = 1.0;
};

// All items enqueued in one EnqueueBatch, so the coordinator fuses those
// that agree in dtype, op and scaling.
void Batch(kerasdist::Engine* e, int rank, int size, const std::string& tag,
           const std::vector<BatchItem>& items, uint64_t seed) {
  std::vector<Request> reqs;
  std::vector<Buf> ins, outs;
  std::vector<SlotPtr> slots;
  std::vector<std::string> names;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    names.push_back("batch." + tag + "." + std::to_string(i));
    ins.push_back(MakeInput(it.t, it.op, it.count, rank, seed + i, size));
    outs.emplace_back(ins.back().bytes);
    slots.push_back(std::make_shared<Slot>());
    Request r = MakeRequest(names.back(), OpType::kAllreduce, it.t,
                            {static_cast<int64_t>(it.count)}, slots.back());
    r.meta.reduce_op = it.op;
    r.meta.prescale = it.prescale;
    r.meta.postscale = it.postscale;
    r.input = ins.back().data();
    r.output = outs.back().data();
    reqs.push_back(std::move(r));
  }
  e->EnqueueBatch(std::move(reqs));
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    ExpectOk(Wait(slots[i], names[i]), names[i]);
    Buf want = MakeExpected(it.t, it.op, it.count, seed + i, size, std::vector<bool>(size, true));
    // Scaling factors are powers of two, exact on the exact results.
    if (it.prescale * it.postscale != 1.0)
      for (size_t k = 0; k < it.count; ++k)
        PutFloat(it.t, want.data(), k, GetNumber(it.t, want.data(), k) * it.prescale * it.postscale);
    ExpectEqual(names[i].c_str(), it.t, outs[i].data(), want.data(), it.count);
  }
}

void GroupedSweep(kerasdist::Engine* e, int rank, int size, int* n) {
  std::vector<BatchItem> same;
  for (size_t c : {0, 1, 2, 3, 17, 1000, 4097, 0, 65536, 5})
    same.push_back({DataType::kFloat32, ReduceOp::kSum, c});
  Batch(e, rank, size, "same", same, 20000);
  std::vector<BatchItem> mixed;
  for (DataType t : kAllTypes)
    for (ReduceOp op : kAllOps) mixed.push_back({t, op, static_cast<size_t>(3 + mixed.size() * 7)});
  Batch(e, rank, size, "mixed", mixed, 21000);
  // Widening averages of small integers through the fusion buffer.
  std::vector<BatchItem> widen;
  for (int i = 0; i < 6; ++i)
    widen.push_back({i % 2 ? DataType::kUInt8 : DataType::kInt8, ReduceOp::kAverage,
                     static_cast<size_t>(100 * i + 1)});
  widen.push_back({DataType::kInt32, ReduceOp::kAverage, 333});
  Batch(e, rank, size, "widen", widen, 22000);
  std::vector<BatchItem> scaled;
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                     DataType::kFloat64})
    for (int i = 0; i < 3; ++i) scaled.push_back({t, ReduceOp::kSum, 50u + i, 0.5, 4.0});
  Batch(e, rank, size, "scaled", scaled, 23000);
  // More than the 1 MiB fusion threshold: split into several responses.
  std::vector<BatchItem> big;
  for (int i = 0; i < 6; ++i) big.push_back({DataType::kFloat32, ReduceOp::kMax, 100000u + i});
  big.push_back({DataType::kFloat32, ReduceOp::kMax, 300000});
  Batch(e, rank, size, "split", big, 24000);
  *n += static_cast<int>(same.size() + mixed.size() + widen.size() + scaled.size() + big.size());
}

void Barrier(kerasdist::Engine* e, const std::string& name) {
  auto slot = std::make_shared<Slot>();
  e->Enqueue(MakeRequest(name, OpType::kBarrier, DataType::kFloat32, {}, slot));
  ExpectOk(Wait(slot, name), name);
}

// Every rank but the last joins; the last then runs an allreduce, an
// allgather and a broadcast alone (the joined ranks take part with zeros and
// no rows), then joins too. Everyone learns that the last rank joined last.
void JoinRound(kerasdist::Engine* e, int rank, int size, int round, int* n) {
  const int last = size - 1;
  const std::string p = "join" + std::to_string(round) + ".";
  auto join = [&] {
    auto slot = std::make_shared<Slot>();
    int32_t who = -7;
    Request r = MakeRequest("__kerasdist_join__", OpType::kJoin, DataType::kInt32, {}, slot);
    r.join_result = &who;
    e->Enqueue(std::move(r));
    ExpectOk(Wait(slot, p + "join"), p + "join");
    KDT_CHECK(who == last, "%sjoin: last joined rank %d, expected %d", p.c_str(), who, last);
  };
  if (rank != last) {
    join();
  } else {
    std::vector<bool> only(size, false);
    only[last] = true;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      const std::string name = p + "ar." + kerasdist::ReduceOpName(op);
      const uint64_t seed = 30000 + round * 10 + static_cast<int>(op);
      Buf in = MakeInput(DataType::kFloat32, op, 1001, 0, seed, 1);  // as rank 0 of 1
      Buf out(in.bytes);
      auto slot = std::make_shared<Slot>();
      Request r = MakeRequest(name, OpType::kAllreduce, DataType::kFloat32, {1001}, slot);
      r.meta.reduce_op = op;
      r.input = in.data();
      r.output = out.data();
      e->Enqueue(std::move(r));
      ExpectOk(Wait(slot, name), name);
      Buf want = MakeExpected(DataType::kFloat32, op, 1001, seed, 1, {true});
      ExpectEqual(name.c_str(), DataType::kFloat32, out.data(), want.data(), 1001);
    }
    std::vector<int64_t> dim0(size, 0);
    dim0[last] = 3;
    OneAllgather(e, rank, size, DataType::kInt64, dim0, {2}, p + "alone", 31000 + round);
    OneBroadcast(e, rank, size, DataType::kFloat64, last, 777, false, 32000 + round);
    join();
    *n += 4;
  }
  ++*n;
}

// Adasum on float32 / float64 in cases with an exact answer: the same
// vector on every rank gives that vector, disjoint (orthogonal) ones their
// sum. On a size that is not a power of two, an error on every rank.
void AdasumSweep(kerasdist::Engine* e, int rank, int size, int* n) {
  const bool pow2 = (size & (size - 1)) == 0;
  int k = 0;
  for (DataType t : {DataType::kFloat32, DataType::kFloat64})
    for (size_t count : {static_cast<size_t>(size) * 7, (static_cast<size_t>(1) << 20) + 3})
      for (bool same : {true, false}) {
        const std::string name = Name("adasum", t, std::to_string(count) + (same ? ".same" : ".orth"));
        const size_t elem = kerasdist::DataTypeSize(t);
        Buf in(count * elem), want(count * elem), out(count * elem);
        for (size_t i = 0; i < count; ++i) {
          // Blocks of `count / size` elements: rank r owns block r.
          const size_t owner = std::min(i / (count / size), static_cast<size_t>(size - 1));
          const double v = same ? 0.25 * static_cast<double>(i % 97) - 3.0
                                : (owner == static_cast<size_t>(rank) ? 1.0 + rank : 0.0);
          const double w = same ? v : 1.0 + static_cast<double>(owner);
          if (t == DataType::kFloat32) {
            reinterpret_cast<float*>(in.data())[i] = static_cast<float>(v);
            reinterpret_cast<float*>(want.data())[i] = static_cast<float>(w);
          } else {
            reinterpret_cast<double*>(in.data())[i] = v;
            reinterpret_cast<double*>(want.data())[i] = w;
          }
        }
        auto slot = std::make_shared<Slot>();
        Request r = MakeRequest(name, OpType::kAllreduce, t, {static_cast<int64_t>(count)}, slot);
        r.meta.reduce_op = ReduceOp::kAdasum;
        r.input = in.data();
        r.output = out.data();
        e->Enqueue(std::move(r));
        Status s = Wait(slot, name);
        ++*n;
        if (!pow2) {
          KDT_CHECK(!s.ok() && s.message().find("power-of-two") != std::string::npos,
                    "'%s' on %d ranks: expected the power-of-two error, got: %s", name.c_str(),
                    size, s.message().c_str());
          if (++k == 2) return;  // the error, twice, is enough
          continue;
        }
        ExpectOk(s, name);
        ExpectEqual(name.c_str(), t, out.data(), want.data(), count);
      }
}

}  // namespace

int RunSweep(kerasdist::Engine* e, int rank, int size) {
  int n = 0;
  Barrier(e, "sweep.start");
  AllreduceSweep(e, rank, size, &n);
  AllgatherSweep(e, rank, size, &n);
  BroadcastSweep(e, rank, size, &n);
  GroupedSweep(e, rank, size, &n);
  AdasumSweep(e, rank, size, &n);
  for (int round = 0; round < 2; ++round) JoinRound(e, rank, size, round, &n);
  n += RunScatterSweep(e, rank, size);  // scatter.cc
  Barrier(e, "sweep.end");
  return n + 2;
}

}  // namespace kdt
