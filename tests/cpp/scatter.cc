// Reducescatter and alltoall on the engine alone: every dtype, Horovod's
// uneven row split, fused batches, uneven and empty alltoall splits, large
// transfers across many segments, and splits that one rank gets wrong, each
// checked bit for bit against the reference.
#include <string>
#include <vector>

#include "driver_util.h"

namespace kdt {

namespace {

void RowsOf(int64_t dim0, int size, int rank, int64_t* first, int64_t* rows) {
  const int64_t q = dim0 / size, rem = dim0 % size;
  *first = rank * q + (rank < rem ? rank : rem);
  *rows = q + (rank < rem ? 1 : 0);
}

struct ScatterItem {
  DataType t;
  ReduceOp op;
  int64_t dim0, row;
};

// All items enqueued together: those of one dtype and op are fused.
void Reducescatters(kerasdist::Engine* e, int rank, int size, const std::string& tag,
                    const std::vector<ScatterItem>& items, uint64_t seed) {
  std::vector<Request> reqs;
  std::vector<Buf> ins, outs;
  std::vector<SlotPtr> slots;
  std::vector<std::string> names;
  for (size_t i = 0; i < items.size(); ++i) {
    const ScatterItem& it = items[i];
    int64_t first, rows;
    RowsOf(it.dim0, size, rank, &first, &rows);
    names.push_back("rs." + tag + "." + std::to_string(i));
    ins.push_back(MakeInput(it.t, it.op, static_cast<size_t>(it.dim0 * it.row), rank,
                            seed + i, size));
    outs.emplace_back(static_cast<size_t>(rows * it.row) * kerasdist::DataTypeSize(it.t));
    slots.push_back(std::make_shared<Slot>());
    Request r = MakeRequest(names.back(), OpType::kReducescatter, it.t, {it.dim0, it.row},
                            slots.back());
    r.meta.reduce_op = it.op;
    r.input = ins.back().data();
    r.output = outs.back().data();
    reqs.push_back(std::move(r));
  }
  e->EnqueueBatch(std::move(reqs));
  for (size_t i = 0; i < items.size(); ++i) {
    const ScatterItem& it = items[i];
    ExpectOk(Wait(slots[i], names[i]), names[i]);
    int64_t first, rows;
    RowsOf(it.dim0, size, rank, &first, &rows);
    Buf want = MakeExpected(it.t, it.op, static_cast<size_t>(it.dim0 * it.row), seed + i, size,
                            std::vector<bool>(size, true));
    ExpectEqual(names[i].c_str(), it.t, outs[i].data(),
                want.data() + first * it.row * kerasdist::DataTypeSize(it.t),
                static_cast<size_t>(rows * it.row));
  }
}

std::vector<int64_t> SplitsOf(int src, int size, int variant) {
  std::vector<int64_t> s(size);
  for (int j = 0; j < size; ++j)
    s[j] = variant == 9 ? 3000 + 17 * j + src : (src + 2 * j + variant) % 4;
  return s;
}

void OneAlltoall(kerasdist::Engine* e, int rank, int size, DataType t, int64_t row,
                 int variant, uint64_t seed) {
  const std::string name = "a2a." + std::string(kerasdist::DataTypeName(t)) + "." +
                           std::to_string(row) + "." + std::to_string(variant);
  std::vector<int64_t> mine = SplitsOf(rank, size, variant);
  int64_t dim0 = 0;
  for (int64_t s : mine) dim0 += s;
  Buf in = GatherInput(t, dim0, row, rank, seed);
  auto slot = std::make_shared<Slot>();
  auto g = std::make_shared<Gathered>();
  std::vector<int32_t> received(size, -1);
  Request r = MakeRequest(name, OpType::kAlltoall, t, {dim0, row}, slot);
  r.meta.splits = mine;
  r.input = in.data();
  r.allocate = AllocateInto(g, t);
  r.received_splits = received.data();
  e->Enqueue(std::move(r));
  ExpectOk(Wait(slot, name), name);
  const size_t e_bytes = kerasdist::DataTypeSize(t);
  std::vector<char> want;
  int64_t rows = 0;
  for (int src = 0; src < size; ++src) {
    std::vector<int64_t> s = SplitsOf(src, size, variant);
    int64_t total = 0, start = 0;
    for (int j = 0; j < size; ++j) total += s[j];
    for (int j = 0; j < rank; ++j) start += s[j];
    Buf theirs = GatherInput(t, total, row, src, seed);
    const size_t off = static_cast<size_t>(start * row) * e_bytes;
    want.insert(want.end(), theirs.data() + off,
                theirs.data() + off + static_cast<size_t>(s[rank] * row) * e_bytes);
    KDT_CHECK(received[src] == s[rank], "%s: received %d rows from rank %d, expected %lld",
              name.c_str(), received[src], src, static_cast<long long>(s[rank]));
    rows += s[rank];
  }
  std::lock_guard<std::mutex> lock(g->mu);
  KDT_CHECK(g->allocations == 1 && g->shape == (std::vector<int64_t>{rows, row}),
            "%s: output shape %s", name.c_str(), kerasdist::ShapeString(g->shape).c_str());
  ExpectEqual(name.c_str(), t, g->buf.data(), want.data(), static_cast<size_t>(rows * row));
}

// One rank's splits are wrong: the collective fails on every rank.
void BadSplits(kerasdist::Engine* e, int rank, int size) {
  const std::string name = "a2a.bad";
  std::vector<float> in(size, 1.0f);
  auto slot = std::make_shared<Slot>();
  auto g = std::make_shared<Gathered>();
  Request r = MakeRequest(name, OpType::kAlltoall, DataType::kFloat32, {size}, slot);
  r.meta.splits.assign(size, 1);
  if (rank == size - 1) r.meta.splits[0] = -1;
  r.input = in.data();
  r.allocate = AllocateInto(g, DataType::kFloat32);
  e->Enqueue(std::move(r));
  Status s = Wait(slot, name);
  KDT_CHECK(s.code() == kerasdist::StatusCode::kMismatch &&
                s.message().find("rank " + std::to_string(size - 1) + " sent splits") !=
                    std::string::npos,
            "%s: %s", name.c_str(), s.message().c_str());
}

}  // namespace

int RunScatterSweep(kerasdist::Engine* e, int rank, int size) {
  int n = 0;
  uint64_t seed = 40000;
  const int64_t dims[] = {0, 1, size - 1, size + 1, 2 * size, 1001};
  for (DataType t : kAllTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage})
      for (int64_t d : dims) {
        Reducescatters(e, rank, size, std::to_string(++seed), {{t, op, d, 3}}, seed * 10);
        ++n;
      }
  std::vector<ScatterItem> fused;
  for (DataType t : kAllTypes)
    for (int64_t d : {int64_t{5}, int64_t{0}, int64_t{2} * size + 1})
      fused.push_back({t, ReduceOp::kAverage, d, 1 + d % 3});
  fused.push_back({DataType::kFloat32, ReduceOp::kSum, 100003, 7});  // many segments
  Reducescatters(e, rank, size, "fused", fused, 50000);
  n += static_cast<int>(fused.size());
  for (DataType t : kAllTypes)
    for (int variant = 0; variant < 4; ++variant) {
      OneAlltoall(e, rank, size, t, variant == 3 ? 0 : 3, variant, ++seed);
      ++n;
    }
  OneAlltoall(e, rank, size, DataType::kFloat64, 33, 9, ++seed);  // many segments per peer
  BadSplits(e, rank, size);
  return n + 2;
}

}  // namespace kdt
