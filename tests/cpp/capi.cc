// The engine library's C API (capi/kerasdist.h), as a binding uses it:
// init from a Fortran communicator, every collective through handles and
// through callbacks, outputs sized by the negotiation, grouped allreduces,
// the inline flag, errors found before enqueueing, a handle released while
// pending, and shutdown with a collective still waiting. Values are checked
// exactly against sums computed here.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "capi/kerasdist.h"
#include "driver_util.h"

namespace kdt {
namespace {

kerasdist_request Req(int32_t op, const char* name, int32_t dtype, const std::vector<int64_t>& shape,
                      const void* in, void* out) {
  kerasdist_request r{};
  r.struct_size = sizeof(r);
  r.op = op;
  r.name = name;
  r.dtype = dtype;
  r.ndim = static_cast<int32_t>(shape.size());
  r.shape = shape.data();
  r.input = in;
  r.output = out;
  r.reduce_op = KERASDIST_SUM;
  r.prescale = r.postscale = 1.0;
  return r;
}

int32_t Wait(kerasdist_handle* h, std::string* message = nullptr) {
  int32_t code = kerasdist_handle_wait(h, 30000);
  KDT_CHECK(code != KERASDIST_PENDING, "a handle did not complete within 30 s");
  char buf[1024];
  KDT_CHECK(kerasdist_handle_status(h, buf, sizeof(buf)) == code, "status differs from wait");
  if (message) *message = buf;
  return code;
}

struct Callback {
  std::atomic<int> calls{0};
  std::atomic<int> code{-2};
  std::thread::id thread;
};

void OnDone(void* user, int32_t code, const char*) {
  auto* cb = static_cast<Callback*>(user);
  cb->thread = std::this_thread::get_id();
  cb->code = code;
  cb->calls.fetch_add(1);
}

void WaitCallback(Callback* cb) {
  for (int i = 0; i < 30000 && cb->calls.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  KDT_CHECK(cb->calls.load() == 1, "callback ran %d times", cb->calls.load());
}

}  // namespace

void RunCApi(int rank, int size) {
  KDT_CHECK(kerasdist_api_version() == KERASDIST_API_VERSION, "API version");
  KDT_CHECK(!kerasdist_is_initialized(), "initialized before init");
  // Before init: every enqueue fails at once, with a handle and a callback.
  float x = 1;
  std::vector<int64_t> one = {1};
  auto r0 = Req(KERASDIST_ALLREDUCE, "early", KERASDIST_FLOAT32, one, &x, &x);
  kerasdist_handle* h = kerasdist_enqueue(&r0, 1, nullptr, 0, nullptr, nullptr);
  KDT_CHECK(Wait(h) == KERASDIST_PRECONDITION, "enqueue before init");
  kerasdist_handle_release(h);

  kerasdist_config config;
  kerasdist_config_defaults(&config);
  config.version = "capi-test";
  config.timeout_ms = 5000;
  config.deadlock_us = 4000000;
  char err[1024];
  int32_t rc = kerasdist_init(MPI_Comm_c2f(MPI_COMM_WORLD), &config, err, sizeof(err));
  KDT_CHECK(rc == KERASDIST_OK, "init: %s", err);
  KDT_CHECK(kerasdist_rank() == rank && kerasdist_size() == size, "rank/size");
  int32_t topo[6];
  KDT_CHECK(kerasdist_topology(topo) == KERASDIST_OK && topo[1] == size, "topology");

  // Allreduce, every rank's values known here; the direct board takes the
  // repeated small one after its first round.
  for (int round = 0; round < 5; ++round) {
    std::vector<double> in(1000), out(1000);
    for (size_t i = 0; i < in.size(); ++i) in[i] = (rank + 1) * static_cast<double>(i) + round;
    std::vector<int64_t> shape = {10, 100};
    auto r = Req(KERASDIST_ALLREDUCE, "sum", KERASDIST_FLOAT64, shape, in.data(), out.data());
    h = kerasdist_enqueue(&r, 1, nullptr, 0, nullptr, nullptr);
    KDT_CHECK(Wait(h) == KERASDIST_OK, "allreduce");
    int64_t dims[4];
    KDT_CHECK(kerasdist_handle_shape(h, 0, dims, 4) == 2 && dims[0] == 10 && dims[1] == 100,
              "allreduce shape");
    kerasdist_handle_release(h);
    const double ranks = size * (size + 1) / 2.0;
    for (size_t i = 0; i < in.size(); ++i)
      KDT_CHECK(out[i] == ranks * i + size * round, "allreduce[%zu] = %g", i, out[i]);
  }

  // Ragged allgather and alltoall: the handle holds the outputs.
  {
    std::vector<int32_t> in(rank + 1, rank);
    std::vector<int64_t> shape = {rank + 1};
    auto r = Req(KERASDIST_ALLGATHER, "gather", KERASDIST_INT32, shape, in.data(), nullptr);
    h = kerasdist_enqueue(&r, 1, nullptr, 0, nullptr, nullptr);
    KDT_CHECK(Wait(h) == KERASDIST_OK, "allgather");
    int64_t dims[2];
    const int64_t total = size * (size + 1) / 2;
    KDT_CHECK(kerasdist_handle_shape(h, 0, dims, 2) == 1 && dims[0] == total, "gather shape");
    std::vector<int32_t> out(total);
    KDT_CHECK(kerasdist_handle_copy_output(h, 0, out.data(), 4 * total) == 0, "copy out");
    KDT_CHECK(kerasdist_handle_copy_output(h, 0, out.data(), 4) == -1, "copy size check");
    size_t k = 0;
    for (int q = 0; q < size; ++q)
      for (int j = 0; j <= q; ++j) KDT_CHECK(out[k++] == q, "gather[%zu]", k - 1);
    kerasdist_handle_release(h);
  }
  {
    // Rank r sends q + 1 rows to rank q; each row holds the sender's rank.
    std::vector<int64_t> splits(size);
    int64_t rows = 0;
    for (int q = 0; q < size; ++q) rows += (splits[q] = q + 1);
    std::vector<int64_t> in(rows * 2, rank);
    std::vector<int64_t> shape = {rows, 2};
    auto r = Req(KERASDIST_ALLTOALL, "a2a", KERASDIST_INT64, shape, in.data(), nullptr);
    r.nsplits = size;
    r.splits = splits.data();
    h = kerasdist_enqueue(&r, 1, nullptr, 0, nullptr, nullptr);
    KDT_CHECK(Wait(h) == KERASDIST_OK, "alltoall");
    std::vector<int32_t> recv(size);
    KDT_CHECK(kerasdist_handle_received_splits(h, 0, recv.data(), size) == size, "splits");
    std::vector<int64_t> out(size * (rank + 1) * 2);
    KDT_CHECK(kerasdist_handle_copy_output(h, 0, out.data(), 8 * out.size()) == 0, "a2a out");
    for (int q = 0; q < size; ++q) KDT_CHECK(recv[q] == rank + 1, "received %d", recv[q]);
    for (size_t i = 0; i < out.size(); ++i)
      KDT_CHECK(out[i] == static_cast<int64_t>(i / (2 * (rank + 1))), "a2a[%zu]", i);
    kerasdist_handle_release(h);
  }

  // A grouped allreduce of two dtypes and a broadcast, through callbacks,
  // the group with the inline flag.
  for (int round = 0; round < 3; ++round) {
    std::vector<float> a(300, rank + 1.0f);
    std::vector<int32_t> b(7, rank);
    std::vector<int64_t> sa = {300}, sb = {7};
    kerasdist_request g[2] = {
        Req(KERASDIST_ALLREDUCE, nullptr, KERASDIST_FLOAT32, sa, a.data(), a.data()),
        Req(KERASDIST_ALLREDUCE, nullptr, KERASDIST_INT32, sb, b.data(), b.data())};
    Callback cb;
    KDT_CHECK(kerasdist_enqueue(g, 2, "group", KERASDIST_INLINE, OnDone, &cb) == nullptr,
              "callback enqueue returns no handle");
    WaitCallback(&cb);
    KDT_CHECK(cb.code.load() == KERASDIST_OK, "group code %d", cb.code.load());
    for (float v : a) KDT_CHECK(v == size * (size + 1) / 2.0f, "group float %g", v);
    for (int32_t v : b) KDT_CHECK(v == size * (size - 1) / 2, "group int %d", v);
  }
  {
    std::vector<uint8_t> buf(70000, static_cast<uint8_t>(rank == size - 1 ? 7 : 0));
    std::vector<int64_t> shape = {70000};
    auto r = Req(KERASDIST_BROADCAST, "bcast", KERASDIST_UINT8, shape, buf.data(), buf.data());
    r.root = size - 1;
    Callback cb;
    kerasdist_enqueue(&r, 1, nullptr, 0, OnDone, &cb);
    WaitCallback(&cb);
    for (uint8_t v : buf) KDT_CHECK(v == 7, "broadcast %d", v);
  }

  // Errors found on this rank alone, before enqueueing: every one fails at
  // once with INVALID_ARGUMENT and enqueues nothing.
  {
    auto bad = Req(KERASDIST_ALLREDUCE, "bad", 99, one, &x, &x);
    auto device = Req(KERASDIST_ALLREDUCE, "gpu", KERASDIST_FLOAT32, one, &x, &x);
    device.device = 1;
    auto scalar = Req(KERASDIST_ALLGATHER, "scalar", KERASDIST_FLOAT32, {}, &x, nullptr);
    scalar.ndim = 0;
    auto old = Req(KERASDIST_ALLREDUCE, "old", KERASDIST_FLOAT32, one, &x, &x);
    old.struct_size = 8;
    for (auto* r : {&bad, &device, &scalar, &old}) {
      std::string message;
      h = kerasdist_enqueue(r, 1, nullptr, 0, nullptr, nullptr);
      KDT_CHECK(Wait(h, &message) == KERASDIST_INVALID_ARGUMENT, "bad input '%s'", r->name);
      KDT_CHECK(!message.empty(), "no message for '%s'", r->name);
      kerasdist_handle_release(h);
    }
  }

  // A handle released before it completes is freed when it does; then a
  // barrier and join, and a mismatch that fails on every rank.
  {
    std::vector<float> v(1000, 1.0f);
    std::vector<int64_t> shape = {1000};
    auto r = Req(KERASDIST_ALLREDUCE, "released", KERASDIST_FLOAT32, shape, v.data(), v.data());
    kerasdist_handle_release(kerasdist_enqueue(&r, 1, nullptr, 0, nullptr, nullptr));
    auto bar = Req(KERASDIST_BARRIER, "barrier", 0, {}, nullptr, nullptr);
    h = kerasdist_enqueue(&bar, 1, nullptr, 0, nullptr, nullptr);
    KDT_CHECK(Wait(h) == KERASDIST_OK, "barrier");
    kerasdist_handle_release(h);
    auto join = Req(KERASDIST_JOIN, "__kerasdist_join__", 0, {}, nullptr, nullptr);
    h = kerasdist_enqueue(&join, 1, nullptr, 0, nullptr, nullptr);
    KDT_CHECK(Wait(h) == KERASDIST_OK, "join");
    const int32_t last = kerasdist_handle_join_result(h);
    KDT_CHECK(last >= 0 && last < size, "join result %d", last);
    kerasdist_handle_release(h);
    std::vector<int64_t> mshape = {rank == 0 ? 3 : 4};
    std::vector<float> m(mshape[0], 1.0f);
    auto mm = Req(KERASDIST_ALLREDUCE, "mismatch", KERASDIST_FLOAT32, mshape, m.data(), m.data());
    std::string message;
    h = kerasdist_enqueue(&mm, 1, nullptr, 0, nullptr, nullptr);
    KDT_CHECK(Wait(h, &message) == KERASDIST_MISMATCH, "mismatch: %s", message.c_str());
    kerasdist_handle_release(h);
  }
  std::printf("PASS capi rank %d\n", rank);

  // Shutdown with a collective only this rank enqueued: it fails, bounded.
  if (rank == 0) {
    std::vector<float> v(10, 1.0f);
    std::vector<int64_t> shape = {10};
    auto r = Req(KERASDIST_ALLREDUCE, "orphan", KERASDIST_FLOAT32, shape, v.data(), v.data());
    h = kerasdist_enqueue(&r, 1, nullptr, 0, nullptr, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kerasdist_shutdown();
    std::string message;
    const int32_t code = Wait(h, &message);
    KDT_CHECK(code != KERASDIST_OK, "a collective no peer ran succeeded");
    kerasdist_handle_release(h);
  } else {
    kerasdist_shutdown();
  }
  KDT_CHECK(!kerasdist_is_initialized(), "initialized after shutdown");
  std::printf("PASS capi-shutdown rank %d\n", rank);
}

}  // namespace kdt
