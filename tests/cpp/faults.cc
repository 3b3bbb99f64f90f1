// Fault cases: collectives whose ranks disagree, shutdown then a new
// context, a peer frozen with SIGSTOP in the middle of a large allreduce, and
// integer reductions that overflow.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <thread>

#include "driver_util.h"

namespace kdt {

namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A checked float32 sum allreduce of `count` elements. `direct`: as the
// allreduce kernel runs it, on the direct board once its name has a slot
// there (direct_board.h), else through the engine.
void CheckedAllreduce(kerasdist::Engine* e, int rank, int size, const std::string& name,
                      size_t count, uint64_t seed, bool direct = false) {
  Buf in = MakeInput(DataType::kFloat32, ReduceOp::kSum, count, rank, seed, size);
  Buf out(in.bytes);
  auto slot = std::make_shared<Slot>();
  Request r = MakeRequest(name, OpType::kAllreduce, DataType::kFloat32,
                          {static_cast<int64_t>(count)}, slot);
  r.input = in.data();
  r.output = out.data();
  r.direct_ok = direct;
  if (!direct || !e->TryDirect(&r)) e->Enqueue(std::move(r));
  ExpectOk(Wait(slot, name), name);
  Buf want = MakeExpected(DataType::kFloat32, ReduceOp::kSum, count, seed, size,
                          std::vector<bool>(size, true));
  ExpectEqual(name.c_str(), DataType::kFloat32, out.data(), want.data(), count);
}

// Submits a collective whose metadata differs by rank; every rank must get
// kMismatch naming the tensor.
void ExpectMismatch(kerasdist::Engine* e, const std::string& name, Request r, size_t bytes,
                    bool direct = false) {
  Buf in(bytes), out(bytes);
  if (bytes) std::memset(in.data(), 1, bytes);
  auto slot = std::make_shared<Slot>();
  r.name = name;
  r.done = DoneInto(slot);
  r.input = in.data();
  r.output = out.data();
  auto g = std::make_shared<Gathered>();
  if (r.meta.type == OpType::kAllgather) r.allocate = AllocateInto(g, r.meta.dtype);
  r.direct_ok = direct;
  if (!direct || !e->TryDirect(&r)) e->Enqueue(std::move(r));
  Status s = Wait(slot, name);
  KDT_CHECK(s.code() == StatusCode::kMismatch, "'%s': expected kMismatch, got code %d: %s",
            name.c_str(), static_cast<int>(s.code()), s.message().c_str());
  KDT_CHECK(s.message().find(name) != std::string::npos, "'%s': message does not name it: %s",
            name.c_str(), s.message().c_str());
  KDT_CHECK(g->allocations == 0, "'%s': mismatched allgather allocated", name.c_str());
  std::printf("FAULT mismatch '%s' rank %d: %s\n", name.c_str(), g_rank,
              s.message().substr(0, 160).c_str());
}

Request Meta(OpType type, DataType t, std::vector<int64_t> shape) {
  Request r;
  r.meta.type = type;
  r.meta.dtype = t;
  r.meta.shape = std::move(shape);
  return r;
}

void Mismatches(kerasdist::Engine* e, int rank, int size) {
  ExpectMismatch(e, "mm.shape", Meta(OpType::kAllreduce, DataType::kFloat32, {4 + rank}),
                 (4 + rank) * 4);
  Request dt = Meta(OpType::kAllreduce, rank ? DataType::kInt32 : DataType::kFloat64, {6});
  ExpectMismatch(e, "mm.dtype", std::move(dt), 48);
  Request op = Meta(OpType::kAllreduce, DataType::kFloat32, {8});
  op.meta.reduce_op = rank ? ReduceOp::kMax : ReduceOp::kSum;
  ExpectMismatch(e, "mm.op", std::move(op), 32);
  Request root = Meta(OpType::kBroadcast, DataType::kUInt8, {16});
  root.meta.root = rank % 2;
  ExpectMismatch(e, "mm.root", std::move(root), 16);
  Request bad_root = Meta(OpType::kBroadcast, DataType::kUInt8, {16});
  bad_root.meta.root = size + 3;
  ExpectMismatch(e, "mm.badroot", std::move(bad_root), 16);
  ExpectMismatch(e, "mm.gather", Meta(OpType::kAllgather, DataType::kInt8, {2, 3 + rank}),
                 2 * (3 + rank));
  ExpectMismatch(e, "mm.type",
                 Meta(rank ? OpType::kBroadcast : OpType::kAllreduce, DataType::kFloat32, {5}),
                 20);
  // Later collectives work, including one reusing a failed name.
  CheckedAllreduce(e, rank, size, "after.mismatch", 1000, 1);
  CheckedAllreduce(e, rank, size, "mm.shape", 7, 2);
  for (int i = 0; i < 3; ++i) CheckedAllreduce(e, rank, size, "mm.shape", 7, 3 + i);
}

}  // namespace

void DirectAllreduce(kerasdist::Engine* e, int rank, int size, const std::string& name,
                     size_t count, uint64_t seed) {
  CheckedAllreduce(e, rank, size, name, count, seed, /*direct=*/true);
}

// A checked float32 sum grouped allreduce of tensors of `counts` elements,
// as the C API runs a group (capi/enqueue.cc): one request listing the tensors'
// buffers, which the board takes once the group has a place there;
// otherwise (or when the group outgrows its place) a request per tensor
// named "<base>.<i>", the first telling rank 0 the group's size and bytes.
void CheckedGroup(kerasdist::Engine* e, int rank, int size, const std::string& base,
                  const std::vector<size_t>& counts, uint64_t seed) {
  const size_t n = counts.size();
  std::vector<Buf> ins, outs;
  for (size_t i = 0; i < n; ++i) {
    ins.push_back(MakeInput(DataType::kFloat32, ReduceOp::kSum, counts[i], rank, seed + i, size));
    outs.emplace_back(ins.back().bytes);
  }
  auto slot = std::make_shared<Slot>();
  auto members = [&ins, &outs, &counts, base, n, slot] {
    auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(n));
    auto first_error = std::make_shared<Status>();
    const kerasdist::DoneFn finish = DoneInto(slot);
    std::vector<Request> reqs;
    int64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      Request r = MakeRequest(base + "." + std::to_string(i), OpType::kAllreduce,
                              DataType::kFloat32, {static_cast<int64_t>(counts[i])}, nullptr);
      r.input = ins[i].data();
      r.output = outs[i].data();
      r.done = [remaining, first_error, finish](const Status& s) {
        if (!s.ok() && first_error->ok()) *first_error = s;
        if (remaining->fetch_sub(1) == 1) finish(*first_error);
      };
      bytes += static_cast<int64_t>(ins[i].bytes);
      reqs.push_back(std::move(r));
    }
    reqs[0].group_size = static_cast<int32_t>(n);
    reqs[0].group_bytes = bytes;
    return reqs;
  };
  Request group;
  group.name = base;
  group.meta.type = OpType::kAllreduce;
  group.meta.dtype = DataType::kFloat32;
  group.shapes_hash = kerasdist::kShapeHashSeed;
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t dim = static_cast<int64_t>(counts[i]);
    group.shapes_hash = kerasdist::MixShape(group.shapes_hash, &dim, 1);
    group.parts.push_back({ins[i].data(), outs[i].data(), counts[i]});
    total += dim;
  }
  group.meta.shape = {total};
  group.done = DoneInto(slot);
  group.expand = members;
  if (!e->TryDirect(&group)) e->EnqueueBatch(members());
  ExpectOk(Wait(slot, base), base);
  for (size_t i = 0; i < n; ++i) {
    Buf want = MakeExpected(DataType::kFloat32, ReduceOp::kSum, counts[i], seed + i, size,
                            std::vector<bool>(size, true));
    ExpectEqual(base.c_str(), DataType::kFloat32, outs[i].data(), want.data(), counts[i]);
  }
}

// The direct board (direct_board.h): two threads on two names, a late
// peer, a tensor grown past the board, and a mismatch on the board; a
// grouped allreduce, also grown past its place and past the board.
void DirectRounds(kerasdist::Engine* e, int rank, int size) {
  const uint64_t before = e->direct_ops();
  std::thread other([&] {
    for (int i = 0; i < 300; ++i) DirectAllreduce(e, rank, size, "direct.b", 7, 100 + i);
  });
  for (int i = 0; i < 300; ++i) {
    if (rank == size - 1 && i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    DirectAllreduce(e, rank, size, "direct.a", 1000, i);
  }
  other.join();
  DirectAllreduce(e, rank, size, "direct.a", 40000, 999);  // through the engine
  DirectAllreduce(e, rank, size, "direct.a", 1000, 1000);
  const uint64_t used = e->direct_ops() - before;
  KDT_CHECK(used >= 2 * 297, "only %llu allreduces ran on the direct board",
            static_cast<unsigned long long>(used));
  for (int i = 0; i < 3; ++i) DirectAllreduce(e, rank, size, "direct.mm", 4, i);
  ExpectMismatch(e, "direct.mm", Meta(OpType::kAllreduce, DataType::kFloat32, {4 + rank}),
                 (4 + rank) * 4, /*direct=*/true);
  DirectAllreduce(e, rank, size, "direct.mm", 4, 5);
  const uint64_t groups_before = e->direct_ops();
  for (int i = 0; i < 50; ++i) CheckedGroup(e, rank, size, "direct.g", {3, 100, 1}, 7 * i);
  CheckedGroup(e, rank, size, "direct.g", {3, 900, 1}, 1);     // a larger place
  CheckedGroup(e, rank, size, "direct.g", {3, 900, 1}, 2);
  CheckedGroup(e, rank, size, "direct.g", {3, 300000, 1}, 3);  // past the board
  CheckedGroup(e, rank, size, "direct.g", {3, 10, 1}, 4);
  const uint64_t grouped = e->direct_ops() - groups_before;
  KDT_CHECK(grouped >= 48 + 2, "only %llu grouped allreduces ran on the direct board",
            static_cast<unsigned long long>(grouped));
}

void RunFaults(bool shm, int rank, int size) {
  auto ctx = CreateContext(DriverConfig(shm));
  Mismatches(ctx->engine(), rank, size);
  std::printf("PASS mismatch rank %d\n", rank);
  // A name already in flight on this rank: the second request fails with
  // kInvalidArgument, the first completes.
  {
    Buf in(40), out(40), in2(40), out2(40);
    std::memset(in.data(), 0, 40);
    auto s1 = std::make_shared<Slot>(), s2 = std::make_shared<Slot>();
    std::vector<Request> both;
    for (int i = 0; i < 2; ++i) {
      Request r = MakeRequest("dup", OpType::kAllreduce, DataType::kFloat32, {10}, i ? s2 : s1);
      r.input = i ? in2.data() : in.data();
      r.output = i ? out2.data() : out.data();
      both.push_back(std::move(r));
    }
    ctx->engine()->EnqueueBatch(std::move(both));
    ExpectOk(Wait(s1, "dup"), "dup");
    Status s = Wait(s2, "dup (second)");
    KDT_CHECK(s.code() == StatusCode::kInvalidArgument, "duplicate name: code %d: %s",
              static_cast<int>(s.code()), s.message().c_str());
    CheckedAllreduce(ctx->engine(), rank, size, "dup", 10, 9);
  }
  std::printf("PASS duplicate rank %d\n", rank);
  if (shm) {
    DirectRounds(ctx->engine(), rank, size);
    std::printf("PASS direct rank %d\n", rank);
  }
  // Shutdown, then a new context on the same communicator, three times.
  for (int round = 0; round < 3; ++round) {
    ctx->engine()->Shutdown();
    KDT_CHECK(!ctx->engine()->Failed(), "engine failed after a normal shutdown");
    auto slot = std::make_shared<Slot>();
    ctx->engine()->Enqueue(MakeRequest("late", OpType::kBarrier, DataType::kFloat32, {}, slot));
    Status s = Wait(slot, "late", 1);
    KDT_CHECK(s.code() == StatusCode::kShutdown, "enqueue after shutdown: code %d: %s",
              static_cast<int>(s.code()), s.message().c_str());
    ctx.reset();
    ctx = CreateContext(DriverConfig(shm));
    CheckedAllreduce(ctx->engine(), rank, size, "recreated", 4097, 10 + round);
    CheckedAllreduce(ctx->engine(), rank, size, "after.mismatch", 1000, 20 + round);
  }
  ctx.reset();
  std::printf("PASS recreate rank %d\n", rank);
}

// Rank 1 freezes itself during a 64 MiB allreduce; rank 0 must fail within
// a bound with kTimeout or kAborted naming rank 1, then kill rank 1.
void RunSigstop(bool shm, int rank, int size) {
  KDT_CHECK(size == 2, "sigstop runs on 2 ranks");
  long long pid = getpid(), pids[2];
  MPI_Allgather(&pid, 1, MPI_LONG_LONG, pids, 1, MPI_LONG_LONG, MPI_COMM_WORLD);
  std::printf("PIDS rank %d: %lld %lld\n", rank, pids[0], pids[1]);
  std::fflush(stdout);
  auto ctx = CreateContext(DriverConfig(shm, 3000));
  kerasdist::Engine* e = ctx->engine();
  CheckedAllreduce(e, rank, size, "warmup", 100000, 7);
  const size_t count = (64u << 20) / 4;
  Buf in(count * 4), out(count * 4);
  std::memset(in.data(), 0, in.bytes);
  auto slot = std::make_shared<Slot>();
  Request r = MakeRequest("big", OpType::kAllreduce, DataType::kFloat32,
                          {static_cast<int64_t>(count)}, slot);
  r.input = in.data();
  r.output = out.data();
  const double t0 = Seconds();
  e->Enqueue(std::move(r));
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::printf("FAULT sigstop rank 1 stopping itself\n");
    std::fflush(stdout);
    raise(SIGSTOP);
    Fail("rank 1 resumed after SIGSTOP");
  }
  Status s = Wait(slot, "big", 60);
  const double elapsed = Seconds() - t0;
  std::printf("FAULT sigstop survivor: code %d after %.1f s: %s\n", static_cast<int>(s.code()),
              elapsed, s.message().c_str());
  KDT_CHECK(s.code() == StatusCode::kTimeout || s.code() == StatusCode::kAborted,
            "expected kTimeout or kAborted, got %d", static_cast<int>(s.code()));
  KDT_CHECK(s.message().find("rank 1") != std::string::npos, "message does not name rank 1");
  KDT_CHECK(elapsed < 20, "took %.1f s with a 3 s timeout", elapsed);
  KDT_CHECK(e->Failed(), "engine not marked failed");
  // Anything enqueued now fails at once with the reason.
  auto late = std::make_shared<Slot>();
  e->Enqueue(MakeRequest("late", OpType::kBarrier, DataType::kFloat32, {}, late));
  Status ls = Wait(late, "late", 1);
  KDT_CHECK(!ls.ok(), "enqueue after the failure succeeded");
  const double t1 = Seconds();
  ctx.reset();
  std::printf("FAULT sigstop survivor: context released in %.1f s\n", Seconds() - t1);
  // The frozen peer cannot act on its own: end it. The test then checks
  // that neither process is left. Hydra stops the job once it sees the
  // peer killed, so report first and exit right after the kill.
  std::printf("PASS sigstop rank 0: killing peer %lld, exiting 0\n", pids[1]);
  std::fflush(nullptr);
  KDT_CHECK(kill(static_cast<pid_t>(pids[1]), SIGKILL) == 0, "kill(%lld) failed", pids[1]);
  // MPI_Finalize would wait on the dead peer.
  _exit(0);
}

// Integer sums and products that leave the element type's range. numpy wraps
// them; the core documents that sums wrap. int32/int64 arithmetic on signed
// values overflowing is undefined behaviour in C++, which UBSAN reports.
void RunOverflow(kerasdist::Engine* e, int rank, int size, bool prescale) {
  struct Case { DataType t; ReduceOp op; int64_t v; };
  const Case cases[] = {{DataType::kInt32, ReduceOp::kSum, 2000000000},
                        {DataType::kInt64, ReduceOp::kSum, INT64_MAX - 5},
                        {DataType::kInt32, ReduceOp::kProduct, 100000},
                        {DataType::kInt64, ReduceOp::kProduct, 1LL << 40}};
  for (const Case& c : cases) {
    if (prescale) break;
    const std::string name = std::string("wrap.") + kerasdist::DataTypeName(c.t) + "." +
                             kerasdist::ReduceOpName(c.op);
    const size_t e_size = kerasdist::DataTypeSize(c.t);
    Buf in(16 * e_size), out(16 * e_size);
    for (size_t i = 0; i < 16; ++i) PutInt(c.t, in.data(), i, c.v);
    auto slot = std::make_shared<Slot>();
    Request r = MakeRequest(name, OpType::kAllreduce, c.t, {16}, slot);
    r.meta.reduce_op = c.op;
    r.input = in.data();
    r.output = out.data();
    e->Enqueue(std::move(r));
    ExpectOk(Wait(slot, name), name);
    // Two's-complement wrap-around, as numpy computes it.
    uint64_t acc = static_cast<uint64_t>(c.v);
    for (int k = 1; k < size; ++k)
      acc = c.op == ReduceOp::kSum ? acc + static_cast<uint64_t>(c.v)
                                   : acc * static_cast<uint64_t>(c.v);
    Buf want(in.bytes);
    for (size_t i = 0; i < 16; ++i)
      PutInt(c.t, want.data(), i,
             c.t == DataType::kInt32 ? static_cast<int32_t>(static_cast<uint32_t>(acc))
                                     : static_cast<int64_t>(acc));
    ExpectEqual(name.c_str(), c.t, out.data(), want.data(), 16);
  }
  // Integer prescale out of range: the double -> integer conversion.
  if (prescale) {
    Buf in(4 * 8), out(4 * 8);
    for (size_t i = 0; i < 8; ++i) PutInt(DataType::kInt32, in.data(), i, 2000000000);
    auto slot = std::make_shared<Slot>();
    Request r = MakeRequest("wrap.prescale", OpType::kAllreduce, DataType::kInt32, {8}, slot);
    r.meta.prescale = 4.0;
    r.meta.reduce_op = ReduceOp::kMax;  // no overflow in the reduction itself
    r.input = in.data();
    r.output = out.data();
    e->Enqueue(std::move(r));
    ExpectOk(Wait(slot, "wrap.prescale"), "wrap.prescale");
  }
  std::printf("PASS overflow%s rank %d\n", prescale ? "-prescale" : "", rank);
}

}  // namespace kdt
