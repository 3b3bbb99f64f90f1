// Randomized soak: rounds of collectives with random type, dtype, op, size
// and name (names repeat across rounds, with the same or new metadata, so
// the response cache is hit and invalidated; some names are transient ones
// whose ids the coordinator recycles). All ranks draw the same collectives
// from the shared seed; each rank enqueues them in its own random order from
// two threads, one request at a time and in small batches.
#include <algorithm>
#include <map>
#include <thread>

#include "driver_util.h"

namespace kdt {

namespace {

struct Spec {
  OpType type = OpType::kAllreduce;
  DataType t = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;               // allreduce, broadcast
  std::vector<int64_t> dim0;      // allgather: rows per rank
  std::vector<int64_t> trailing;  // allgather
  int root = 0;
  uint64_t seed = 0;
};

size_t RandomCount(Rng& rng, int size) {
  static const size_t common[] = {0, 1, 2, 5, 63, 1000, 4097, 50000};
  const int pick = rng.Int(0, 19);
  if (pick == 0) return 262147;
  if (pick == 1) return static_cast<size_t>(size - 1);
  if (pick == 2) return static_cast<size_t>(size + 1);
  return common[rng.Next() % 8];
}

Spec RandomSpec(Rng& rng, int size) {
  Spec s;
  const int kind = rng.Int(0, 9);
  s.type = kind < 6 ? OpType::kAllreduce : kind < 8 ? OpType::kAllgather : OpType::kBroadcast;
  s.t = kAllTypes[rng.Next() % 8];
  s.op = kAllOps[rng.Next() % 5];
  s.count = RandomCount(rng, size);
  s.root = rng.Int(0, size - 1);
  if (s.type == OpType::kAllgather) {
    for (int r = 0; r < size; ++r) s.dim0.push_back(rng.Int(0, 6));
    const int dims = rng.Int(0, 2);
    for (int d = 0; d < dims; ++d) s.trailing.push_back(rng.Int(1, 40));
  }
  return s;
}

struct Live {
  std::string name;
  Spec spec;
  Buf in, out;
  SlotPtr slot = std::make_shared<Slot>();
  std::shared_ptr<Gathered> gathered = std::make_shared<Gathered>();
};

int64_t RowOf(const Spec& s) {
  int64_t row = 1;
  for (int64_t d : s.trailing) row *= d;
  return row;
}

Request Build(Live& l, int rank, int size) {
  const Spec& s = l.spec;
  std::vector<int64_t> shape;
  if (s.type == OpType::kAllgather) {
    shape.push_back(s.dim0[rank]);
    shape.insert(shape.end(), s.trailing.begin(), s.trailing.end());
    l.in = GatherInput(s.t, s.dim0[rank], RowOf(s), rank, s.seed);
  } else {
    shape.push_back(static_cast<int64_t>(s.count));
    l.in = MakeInput(s.t, s.type == OpType::kAllreduce ? s.op : ReduceOp::kMin, s.count, rank,
                     s.seed, size);
    l.out = Buf(l.in.bytes);
  }
  Request r = MakeRequest(l.name, s.type, s.t, shape, l.slot);
  r.meta.reduce_op = s.type == OpType::kAllreduce ? s.op : ReduceOp::kSum;
  r.meta.root = s.type == OpType::kBroadcast ? s.root : 0;
  r.input = l.in.data();
  r.output = l.out.data();
  if (s.type == OpType::kAllgather) r.allocate = AllocateInto(l.gathered, s.t);
  return r;
}

void Verify(const Live& l, int size) {
  const Spec& s = l.spec;
  const char* what = l.name.c_str();
  if (s.type == OpType::kAllreduce) {
    Buf want = MakeExpected(s.t, s.op, s.count, s.seed, size, std::vector<bool>(size, true));
    ExpectEqual(what, s.t, l.out.data(), want.data(), s.count);
  } else if (s.type == OpType::kBroadcast) {
    Buf want = MakeInput(s.t, ReduceOp::kMin, s.count, s.root, s.seed, size);
    ExpectEqual(what, s.t, l.out.data(), want.data(), s.count);
  } else {
    std::lock_guard<std::mutex> lock(l.gathered->mu);
    int64_t rows = 0;
    for (int64_t d : s.dim0) rows += d;
    KDT_CHECK(l.gathered->allocations == 1 && !l.gathered->shape.empty() &&
                  l.gathered->shape[0] == rows,
              "%s: allocations %d, rows %lld", what, l.gathered->allocations,
              static_cast<long long>(l.gathered->shape.empty() ? -1 : l.gathered->shape[0]));
    Buf want = GatherExpected(s.t, s.dim0, RowOf(s), s.seed);
    ExpectEqual(what, s.t, l.gathered->buf.data(), want.data(),
                static_cast<size_t>(rows * RowOf(s)));
  }
}

}  // namespace

int RunSoak(kerasdist::Engine* e, int rank, int size, uint64_t seed, int rounds) {
  Rng shared(seed);
  std::map<std::string, Spec> last;  // name -> what it carried last
  int total = 0;
  for (int round = 0; round < rounds; ++round) {
    const int m = shared.Int(6, 30);
    std::vector<int> pool(40);
    for (int i = 0; i < 40; ++i) pool[i] = i;
    for (int i = 39; i > 0; --i) std::swap(pool[i], pool[shared.Next() % (i + 1)]);
    std::vector<Live> ops(m);
    for (int i = 0; i < m; ++i) {
      const bool transient = shared.Int(0, 4) == 0;
      ops[i].name = transient ? "soak.noname." + std::to_string(round) + "." + std::to_string(i)
                              : "soak.t" + std::to_string(pool[i]);
      auto it = last.find(ops[i].name);
      ops[i].spec = (it != last.end() && shared.Int(0, 1)) ? it->second : RandomSpec(shared, size);
      ops[i].spec.seed = Mix(seed ^ (static_cast<uint64_t>(round) << 20) ^ i);
      if (!transient) last[ops[i].name] = ops[i].spec;
    }
    std::vector<Request> reqs;
    for (Live& l : ops) reqs.push_back(Build(l, rank, size));
    // This rank's own order, split between two enqueuing threads.
    Rng local(seed ^ Mix(1000 + rank) ^ (static_cast<uint64_t>(round) << 32));
    std::vector<int> order(m);
    for (int i = 0; i < m; ++i) order[i] = i;
    for (int i = m - 1; i > 0; --i) std::swap(order[i], order[local.Next() % (i + 1)]);
    std::vector<int> a, b;
    for (int i = 0; i < m; ++i) (i % 2 ? b : a).push_back(order[i]);
    const uint64_t sa = local.Next(), sb = local.Next();
    std::thread ta([&, sa] {
      Rng r(sa);
      for (int idx : a) {
        if (r.Int(0, 2) == 0) std::this_thread::sleep_for(std::chrono::microseconds(r.Int(0, 300)));
        e->Enqueue(std::move(reqs[idx]));
      }
    });
    std::thread tb([&, sb] {
      Rng r(sb);
      for (size_t i = 0; i < b.size();) {
        const size_t k = std::min(b.size() - i, static_cast<size_t>(r.Int(1, 4)));
        std::vector<Request> batch;
        for (size_t j = 0; j < k; ++j) batch.push_back(std::move(reqs[b[i + j]]));
        e->EnqueueBatch(std::move(batch));
        i += k;
        std::this_thread::sleep_for(std::chrono::microseconds(r.Int(0, 200)));
      }
    });
    ta.join();
    tb.join();
    for (Live& l : ops) {
      ExpectOk(Wait(l.slot, l.name), "round " + std::to_string(round) + ": " + l.name);
      Verify(l, size);
    }
    total += m;
  }
  return total;
}

}  // namespace kdt
