// The C API's collectives (kerasdist.h): kerasdist_enqueue() checks a
// batch, turns it into the engine's requests and hands them over: a single
// small allreduce, or a group of one dtype, to the direct board when its
// name has a place there (TryDirect), everything else to the engine thread.
#include <cstring>
#include <utility>

#include "capi/current.h"
#include "capi/handle.h"
#include "capi/kerasdist.h"
#include "engine/engine.h"

namespace kerasdist {

static_assert(KERASDIST_BOOL == static_cast<int>(DataType::kBool), "dtype values");
static_assert(KERASDIST_ADASUM == static_cast<int>(ReduceOp::kAdasum), "reduce op values");
static_assert(KERASDIST_ALLTOALL == static_cast<int>(OpType::kAlltoall), "op values");
static_assert(KERASDIST_PRECONDITION == static_cast<int>(StatusCode::kPrecondition),
              "status values");

namespace {

Status Invalid(const std::string& message) {
  return Status(StatusCode::kInvalidArgument, message);
}

std::string Quoted(const char* name) { return name ? "'" + std::string(name) + "'" : "(unnamed)"; }

// The engine of process set `id`, or why a collective cannot run there.
Status LiveEngine(int32_t id, std::shared_ptr<Engine>* engine) {
  auto ctx = CurrentContext();
  if (!ctx)
    return Status(StatusCode::kPrecondition,
                  "kerasdist is not initialized. Call `kerasdist.init()` first.");
  *engine = ctx->EngineFor(id);
  if (*engine) return Status::OK();
  return Status(StatusCode::kPrecondition,
                "This rank (rank " + std::to_string(ctx->rank()) + ") is not in process set " +
                    std::to_string(id) +
                    (ctx->ProcessSetSize(id) < 0 ? ", which does not exist (or was removed)"
                                                 : "") +
                    ". Run a collective on a process set only on its member ranks.");
}

// Checks request `i` on this rank alone.
Status Check(const kerasdist_request& r, int32_t i, const kerasdist_request& first,
             bool grouped) {
  const std::string what = "request " + std::to_string(i) + " " + Quoted(r.name);
  if (r.struct_size != static_cast<int32_t>(sizeof(kerasdist_request)))
    return Invalid("kerasdist_enqueue: the caller was built against another kerasdist C "
                   "API (kerasdist_request differs); rebuild the binding");
  if (r.op < KERASDIST_ALLREDUCE || r.op > KERASDIST_ALLTOALL)
    return Invalid("Invalid collective " + std::to_string(r.op) + " in " + what);
  if (r.device != KERASDIST_DEVICE_CPU)
    return Invalid("kerasdist collectives take CPU tensors only. Received a tensor on device " +
                   std::to_string(r.device) + " (" + what + "); move it to the CPU first");
  if (r.process_set != first.process_set)
    return Invalid("Every request of one batch must use the same process set. Received " +
                   std::to_string(first.process_set) + " and " + std::to_string(r.process_set));
  if (!grouped && (!r.name || !*r.name))
    return Invalid("Every kerasdist collective needs a name (the same on every rank)");
  const bool data = r.op != KERASDIST_BARRIER && r.op != KERASDIST_JOIN;
  if (!data) return Status::OK();
  if (r.dtype < KERASDIST_FLOAT16 || r.dtype > KERASDIST_BOOL)
    return Invalid("Unsupported dtype " + std::to_string(r.dtype) + " in " + what);
  if (r.ndim < 0 || (r.ndim > 0 && !r.shape))
    return Invalid("Invalid shape in " + what);
  for (int32_t d = 0; d < r.ndim; ++d)
    if (r.shape[d] < 0) return Invalid("Negative dimension in the shape of " + what);
  if ((r.op == KERASDIST_ALLGATHER || r.op == KERASDIST_ALLTOALL) && r.ndim < 1)
    return Invalid(std::string(r.op == KERASDIST_ALLGATHER ? "allgather" : "alltoall") +
                   " requires a tensor with at least one dimension. Received a scalar (" +
                   what + "); reshape it to [1]");
  if (r.op == KERASDIST_ALLREDUCE || r.op == KERASDIST_REDUCESCATTER) {
    if (r.reduce_op < KERASDIST_AVERAGE || r.reduce_op > KERASDIST_ADASUM)
      return Invalid("Invalid reduce op " + std::to_string(r.reduce_op) + " in " + what);
  }
  if (r.op == KERASDIST_ALLTOALL && r.nsplits > 0 && !r.splits)
    return Invalid("alltoall: `splits` is NULL with nsplits > 0 in " + what);
  int64_t elements = 1;
  for (int32_t d = 0; d < r.ndim; ++d) elements *= r.shape[d];
  if (elements > 0 && !r.input) return Invalid("NULL input buffer in " + what);
  // A reducescatter's output holds only this rank's rows, which may be none.
  const bool same_size = r.op == KERASDIST_ALLREDUCE || r.op == KERASDIST_BROADCAST;
  if (same_size && elements > 0 && !r.output) return Invalid("NULL output buffer in " + what);
  if (grouped && (r.op != KERASDIST_ALLREDUCE || r.reduce_op != first.reduce_op ||
                  r.prescale != first.prescale || r.postscale != first.postscale))
    return Invalid("Every tensor of a grouped allreduce must be an allreduce with the same "
                   "op and scale factors (" + what + " differs)");
  return Status::OK();
}

void Describe(const kerasdist_request& r, TensorMeta* meta) {
  meta->type = static_cast<OpType>(r.op);
  meta->dtype = static_cast<DataType>(r.dtype);
  meta->reduce_op = static_cast<ReduceOp>(r.reduce_op);
  meta->prescale = r.prescale;
  meta->postscale = r.postscale;
  meta->root = r.root;
  if (r.op == KERASDIST_BARRIER || r.op == KERASDIST_JOIN) return;
  meta->shape.assign(r.shape, r.shape + r.ndim);
  if (r.op == KERASDIST_ALLTOALL) meta->splits.assign(r.splits, r.splits + r.nsplits);
}

// The engine request for `r` (index i of the batch); `done` reports it.
Request Build(const kerasdist_request& r, int32_t i, std::string name,
              kerasdist_handle* handle, DoneFn done) {
  Request q;
  q.name = std::move(name);
  Describe(r, &q.meta);
  q.input = r.input;
  q.output = r.output;
  q.done = std::move(done);
  if (handle) {
    auto& out = handle->outputs[i];
    if (r.op != KERASDIST_ALLGATHER && r.op != KERASDIST_ALLTOALL) {
      out.shape = q.meta.shape;
      out.has_shape = r.op != KERASDIST_BARRIER && r.op != KERASDIST_JOIN;
    }
  }
  if (r.op == KERASDIST_ALLGATHER || r.op == KERASDIST_ALLTOALL) {
    const size_t item = DataTypeSize(q.meta.dtype);
    if (r.allocate) {
      auto fn = r.allocate;
      void* user = r.allocate_user;
      q.allocate = [fn, user, i, handle](const std::vector<int64_t>& shape, void** data) {
        if (handle) {
          handle->outputs[i].shape = shape;
          handle->outputs[i].has_shape = true;
        }
        int32_t rc = fn(user, i, static_cast<int32_t>(shape.size()), shape.data(), data);
        if (rc == 0) return Status::OK();
        return Status(StatusCode::kInternal, "the binding could not allocate an output of shape " +
                                                 ShapeString(shape));
      };
    } else {
      q.allocate = [handle, i, item](const std::vector<int64_t>& shape, void** data) {
        auto& out = handle->outputs[i];
        out.shape = shape;
        out.has_shape = true;
        out.data.resize(static_cast<size_t>(NumElements(shape)) * item);
        *data = out.data.data();
        return Status::OK();
      };
    }
  }
  if (r.op == KERASDIST_ALLTOALL) {
    q.received_splits = r.received_splits;
    if (!q.received_splits && handle) {
      int32_t rank, size;
      kerasdist_process_set_info(r.process_set, &rank, &size);
      handle->outputs[i].received_splits.assign(size > 0 ? size : 0, 0);
      q.received_splits = handle->outputs[i].received_splits.data();
    }
  }
  if (r.op == KERASDIST_JOIN) {
    q.join_result = r.join_result;
    if (!q.join_result && handle) q.join_result = &handle->outputs[i].join_result;
  }
  return q;
}

// What a group needs after kerasdist_enqueue() returns: the requests,
// copied, so that the group can still be expanded into its members later.
struct GroupSpec {
  std::string base;
  std::vector<kerasdist_request> requests;
  std::vector<std::vector<int64_t>> shapes;
  bool one_dtype = true;
  int64_t bytes = 0;
};

std::vector<Request> Members(const std::shared_ptr<GroupSpec>& g, kerasdist_handle* handle,
                             const std::shared_ptr<Batch>& batch) {
  const int32_t n = static_cast<int32_t>(g->requests.size());
  std::vector<Request> reqs;
  reqs.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    kerasdist_request r = g->requests[i];
    r.shape = g->shapes[i].data();
    reqs.push_back(Build(r, i, g->base + "." + std::to_string(i), handle,
                         [batch](const Status& s) { batch->Complete(s); }));
  }
  if (g->one_dtype) {
    reqs[0].group_size = n;
    reqs[0].group_bytes = g->bytes;
  }
  return reqs;
}

// Tries the group on the direct board as one request; false: not there.
bool TryGroupDirect(Engine* engine, const std::shared_ptr<GroupSpec>& g,
                    kerasdist_handle* handle, const std::shared_ptr<Batch>& group_batch,
                    const std::shared_ptr<Batch>& members_batch) {
  const kerasdist_request& first = g->requests[0];
  Request group;
  Describe(first, &group.meta);
  group.name = g->base;
  group.parts.reserve(g->requests.size());
  group.shapes_hash = kShapeHashSeed;
  int64_t elements = 0;
  for (size_t i = 0; i < g->requests.size(); ++i) {
    const auto& dims = g->shapes[i];
    group.shapes_hash = MixShape(group.shapes_hash, dims.data(), dims.size());
    const size_t count = static_cast<size_t>(NumElements(dims));
    group.parts.push_back({g->requests[i].input, g->requests[i].output, count});
    elements += static_cast<int64_t>(count);
  }
  group.meta.shape = {elements};
  group.mixed_dtypes = !g->one_dtype;
  group.done = [group_batch](const Status& s) { group_batch->Complete(s); };
  group.expand = [g, handle, members_batch] { return Members(g, handle, members_batch); };
  return engine->TryDirect(&group);
}

}  // namespace
}  // namespace kerasdist

using kerasdist::Batch;
using kerasdist::Status;
using kerasdist::StatusCode;

void kerasdist_handle::Complete(int32_t c, const std::string& m) {
  bool free_it;
  {
    std::lock_guard<std::mutex> lock(mu);
    code = c;
    message = m;
    done.store(true, std::memory_order_release);
    free_it = released;
    // Under the lock: once it is released, kerasdist_handle_release() may
    // free the handle at once.
    cv.notify_all();
  }
  if (free_it) delete this;
}

extern "C" {

kerasdist_handle* kerasdist_enqueue(const kerasdist_request* requests, int32_t count,
                                    const char* group_name, uint32_t flags,
                                    kerasdist_done_fn done, void* done_user) {
  using namespace kerasdist;
  kerasdist_handle* handle = done ? nullptr : new kerasdist_handle(count > 0 ? count : 0);
  auto batch = std::make_shared<Batch>(count, done, done_user, handle);
  if (count <= 0 || !requests) {
    batch->FailEarly(Invalid("kerasdist_enqueue needs at least one request"));
    return handle;
  }
  const bool grouped = group_name != nullptr;
  for (int32_t i = 0; i < count; ++i) {
    Status s = Check(requests[i], i, requests[0], grouped);
    if (!s.ok()) {
      batch->FailEarly(s);
      return handle;
    }
  }
  std::shared_ptr<Engine> engine;
  Status live = LiveEngine(requests[0].process_set, &engine);
  if (!live.ok()) {
    batch->FailEarly(live);
    return handle;
  }
  if (handle) handle->spin_us = engine->spin_us();

  if (grouped) {
    auto g = std::make_shared<GroupSpec>();
    g->base = group_name;
    g->requests.assign(requests, requests + count);
    g->shapes.resize(count);
    for (int32_t i = 0; i < count; ++i) {
      const kerasdist_request& r = requests[i];
      g->shapes[i].assign(r.shape, r.shape + r.ndim);
      g->one_dtype = g->one_dtype && r.dtype == requests[0].dtype;
      g->bytes += NumElements(g->shapes[i]) * static_cast<int64_t>(
                      DataTypeSize(static_cast<DataType>(r.dtype)));
    }
    // On the board the group is one request; through the engine, `count`.
    auto one = std::make_shared<Batch>(1, done, done_user, handle);
    if (TryGroupDirect(engine.get(), g, handle, one, batch)) return handle;
    if (flags & KERASDIST_INLINE) batch->set_wait(Handoff(*engine));
    engine->EnqueueBatch(Members(g, handle, batch));
  } else if (count == 1) {
    Request r = Build(requests[0], 0, requests[0].name, handle,
                      [batch](const Status& s) { batch->Complete(s); });
    if (requests[0].op == KERASDIST_ALLREDUCE) {
      r.direct_ok = true;
      if (engine->TryDirect(&r)) return handle;  // small and cached: no coordinator
    }
    if (flags & KERASDIST_INLINE) batch->set_wait(Handoff(*engine));
    engine->Enqueue(std::move(r));
  } else {
    std::vector<Request> reqs;
    reqs.reserve(count);
    for (int32_t i = 0; i < count; ++i)
      reqs.push_back(Build(requests[i], i, requests[i].name, handle,
                           [batch](const Status& s) { batch->Complete(s); }));
    if (flags & KERASDIST_INLINE) batch->set_wait(Handoff(*engine));
    engine->EnqueueBatch(std::move(reqs));
  }
  if (flags & KERASDIST_INLINE) {
    // The batch's own inline token, if Handoff gave one.
    WaitInline(*engine, batch->wait(), count, [batch] { batch->Deliver(); });
  }
  return handle;
}

int32_t kerasdist_check_process_set(int32_t id, char* err, int32_t err_len) {
  std::shared_ptr<kerasdist::Engine> engine;
  Status s = kerasdist::LiveEngine(id, &engine);
  kerasdist::CopyMessage(s.message(), err, err_len);
  return static_cast<int32_t>(s.code());
}

}  // extern "C"
