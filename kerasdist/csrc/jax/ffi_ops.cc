// kerasdist's collectives as XLA FFI custom calls on the CPU, for JAX.
//
// Built against the FFI headers that jaxlib ships (jax.ffi.include_dir())
// and the engine library's C API only; registered from Python with the
// public jax.ffi.register_ffi_target. Each handler is asynchronous: it
// enqueues its batch with kerasdist_enqueue() and returns an ffi::Future at
// once, so an XLA thread never blocks on the network.
//
// The engine calls `Done` on its own thread. XLA runs the program's next
// thunks inside Promise::SetAvailable() on the thread that completes the
// promise, so there `Done` only queues the call; one completer thread of
// this library fulfils the promises, holding no lock while it does. A batch
// that finishes within the engine's spin while the handler waits inline
// (KERASDIST_INLINE) is completed on the handler's own XLA thread.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "capi/kerasdist.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

enum Kind { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter };

// One custom call in flight: what the engine reads and writes until the
// batch completes, and the promise to fulfil then.
struct Call {
  ffi::Promise promise;
  Kind kind = kAllreduce;
  std::string name;
  std::string dim0_name;  // allgather: the batch's first request
  std::vector<std::vector<int64_t>> shapes;
  std::vector<kerasdist_request> requests;
  int32_t set_size = 0;
  // allgather, alltoall: the output XLA allocated, and what it must be.
  void* out = nullptr;
  std::vector<int64_t> expected;
  std::vector<char> scratch;     // receives an output of another shape
  bool shape_ok = true;
  int64_t dim0 = 0;              // allgather: this rank's first dimension
  std::vector<int64_t> dim0s;    // ... and every rank's
  std::vector<int32_t> received; // alltoall: rows from each rank
  int32_t code = KERASDIST_OK;
  std::string message;
  std::thread::id enqueuer;  // the XLA thread that ran the handler
};

ffi::ErrorCode ToErrorCode(int32_t code) {
  switch (code) {
    case KERASDIST_INVALID_ARGUMENT:
    case KERASDIST_MISMATCH:
      return ffi::ErrorCode::kInvalidArgument;
    case KERASDIST_TIMEOUT:
      return ffi::ErrorCode::kDeadlineExceeded;
    case KERASDIST_ABORTED:
      return ffi::ErrorCode::kAborted;
    case KERASDIST_SHUTDOWN:
      return ffi::ErrorCode::kUnavailable;
    case KERASDIST_PRECONDITION:
      return ffi::ErrorCode::kFailedPrecondition;
    default:
      return ffi::ErrorCode::kInternal;
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Checks what only the completed batch tells: inside jit, allgather and
// alltoall need equal pieces on every rank. Every rank sees the same
// pieces, so every rank fails alike.
void CheckEqualPieces(Call* c) {
  if (c->code != KERASDIST_OK) return;
  bool equal = c->shape_ok;
  std::vector<int64_t> pieces;
  if (c->kind == kAllgather) pieces = c->dim0s;
  if (c->kind == kAlltoall) pieces.assign(c->received.begin(), c->received.end());
  for (int64_t p : pieces) equal = equal && p == pieces[0];
  if (equal) return;
  c->code = KERASDIST_INVALID_ARGUMENT;
  c->message = std::string(c->kind == kAllgather ? "allgather" : "alltoall") + " '" + c->name +
               "' inside `jax.jit` needs pieces of equal size on every rank, but the ranks' "
               "first dimensions (rows per rank) were " + ShapeString(pieces) +
               ". Call it outside `jax.jit` for pieces of different sizes.";
}

void Fulfil(Call* c) {
  CheckEqualPieces(c);
  ffi::Promise promise = std::move(c->promise);
  const int32_t code = c->code;
  std::string message = "kerasdist: " + c->message;
  delete c;
  if (code == KERASDIST_OK) {
    promise.SetAvailable();
  } else {
    promise.SetError(ffi::Error(ToErrorCode(code), std::move(message)));
  }
}

// Fulfils promises off the engine's threads. Never destroyed: a detached
// thread may still wait on it while the process exits.
class Completer {
 public:
  void Push(Call* c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(c);
      if (!started_) {
        started_ = true;
        std::thread([this] { Run(); }).detach();
      }
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    for (;;) {
      Call* c = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        // An idle wait for work, woken every 100 ms; no collective waits here.
        cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return !queue_.empty(); });
        if (queue_.empty()) continue;
        c = queue_.front();
        queue_.pop_front();
      }
      Fulfil(c);  // no lock held: XLA may run its next thunks here
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call*> queue_;
  bool started_ = false;
};

Completer* TheCompleter() {
  static Completer* completer = new Completer();
  return completer;
}

void Done(void* user, int32_t code, const char* message) {
  auto* c = static_cast<Call*>(user);
  c->code = code;
  c->message = message ? message : "";
  // On the handler's own XLA thread (the engine finished the batch while
  // kerasdist_enqueue waited inline, or refused it): complete here, before
  // the handler returns its future. From an engine thread: hand over.
  if (std::this_thread::get_id() == c->enqueuer) {
    Fulfil(c);
  } else {
    TheCompleter()->Push(c);
  }
}

// The engine's allocation callback for allgather and alltoall: XLA's output
// if the negotiated shape is the one jit expected, else a scratch buffer
// (the batch still completes on every rank; CheckEqualPieces reports it).
int32_t Allocate(void* user, int32_t index, int32_t ndim, const int64_t* shape, void** data) {
  auto* c = static_cast<Call*>(user);
  if (c->kind == kAllgather && index == 0) {  // every rank's first dimension
    c->dim0s.assign(shape[0], 0);
    *data = c->dim0s.data();
    return 0;
  }
  std::vector<int64_t> got(shape, shape + ndim);
  if (got == c->expected) {
    *data = c->out;
    return 0;
  }
  c->shape_ok = false;
  int64_t bytes = 1;
  for (int64_t d : got) bytes *= d;
  c->scratch.resize(static_cast<size_t>(bytes) * 8 + 8);
  *data = c->scratch.data();
  return 0;
}

// The C API's dtype for an XLA element type, or -1. uint32 and uint64 (JAX's
// PRNG keys) travel as int32 and int64 where nothing is computed on them.
int32_t DtypeCode(ffi::DataType t, bool reduces) {
  switch (t) {
    case ffi::DataType::F16: return KERASDIST_FLOAT16;
    case ffi::DataType::BF16: return KERASDIST_BFLOAT16;
    case ffi::DataType::F32: return KERASDIST_FLOAT32;
    case ffi::DataType::F64: return KERASDIST_FLOAT64;
    case ffi::DataType::S8: return KERASDIST_INT8;
    case ffi::DataType::S16: return KERASDIST_INT16;
    case ffi::DataType::S32: return KERASDIST_INT32;
    case ffi::DataType::S64: return KERASDIST_INT64;
    case ffi::DataType::U8: return KERASDIST_UINT8;
    case ffi::DataType::U16: return KERASDIST_UINT16;
    case ffi::DataType::PRED: return KERASDIST_BOOL;
    case ffi::DataType::U32: return reduces ? -1 : KERASDIST_INT32;
    case ffi::DataType::U64: return reduces ? -1 : KERASDIST_INT64;
    default: return -1;
  }
}

// A future that has already failed: for errors found before enqueueing.
ffi::Future Failed(Call* c, const std::string& message) {
  ffi::Future future(c->promise);
  c->code = KERASDIST_INVALID_ARGUMENT;
  c->message = message;
  Fulfil(c);
  return future;
}

// Adds request i for `in` -> `out` to the call; false on an unsupported dtype.
bool AddRequest(Call* c, int32_t op, const ffi::AnyBuffer& in, void* out, bool reduces,
                int64_t process_set, std::string* error) {
  const int32_t dtype = DtypeCode(in.element_type(), reduces);
  if (dtype < 0) {
    *error = "kerasdist: unsupported element type " +
             std::to_string(static_cast<int>(in.element_type())) + " for '" + c->name + "'";
    return false;
  }
  auto dims = in.dimensions();
  c->shapes.emplace_back(dims.begin(), dims.end());
  kerasdist_request r;
  std::memset(&r, 0, sizeof(r));
  r.struct_size = sizeof(kerasdist_request);
  r.op = op;
  r.process_set = static_cast<int32_t>(process_set);
  r.device = KERASDIST_DEVICE_CPU;
  r.dtype = dtype;
  r.ndim = static_cast<int32_t>(dims.size());
  r.input = in.untyped_data();
  r.output = out;
  r.prescale = r.postscale = 1.0;
  c->requests.push_back(r);
  return true;
}

// Points the requests at their names and shapes, then hands the batch over.
ffi::Future Enqueue(Call* c, const char* group_name) {
  ffi::Future future(c->promise);
  for (size_t i = 0; i < c->requests.size(); ++i) {
    c->requests[i].name = c->name.c_str();
    c->requests[i].shape = c->shapes[i].data();
  }
  if (c->kind == kAllgather) {
    c->dim0_name = c->name + ".dim0";
    c->requests[0].name = c->dim0_name.c_str();
  }
  // The engine copies names and shapes; Done may run (and free c) before
  // kerasdist_enqueue returns. KERASDIST_INLINE: when the engine is idle,
  // wait up to its spin for the batch on this thread, as TensorFlow's
  // kernels do, which saves the hand-over to the completer thread.
  c->enqueuer = std::this_thread::get_id();
  kerasdist_enqueue(c->requests.data(), static_cast<int32_t>(c->requests.size()), group_name,
                    KERASDIST_INLINE, &Done, c);
  return future;
}

int32_t SetSize(int64_t process_set) {
  int32_t rank = -1, size = 0;
  kerasdist_process_set_info(static_cast<int32_t>(process_set), &rank, &size);
  return size;
}

ffi::Future AllreduceImpl(ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view name, int64_t op, int64_t process_set,
                          double prescale, double postscale) {
  auto* c = new Call();
  c->kind = kAllreduce;
  c->name = std::string(name);
  std::string error;
  for (size_t i = 0; i < args.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value()) return Failed(c, "kerasdist: bad operands");
    if (!AddRequest(c, KERASDIST_ALLREDUCE, *in, (*out)->untyped_data(), true, process_set,
                    &error))
      return Failed(c, error);
    c->requests.back().reduce_op = static_cast<int32_t>(op);
    c->requests.back().prescale = prescale;
    c->requests.back().postscale = postscale;
  }
  if (c->requests.empty()) return Failed(c, "kerasdist: an allreduce of no tensors");
  const bool grouped = c->requests.size() > 1;
  return Enqueue(c, grouped ? c->name.c_str() : nullptr);
}

ffi::Future BroadcastImpl(ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out,
                          std::string_view name, int64_t root, int64_t process_set) {
  auto* c = new Call();
  c->kind = kBroadcast;
  c->name = std::string(name);
  std::string error;
  if (!AddRequest(c, KERASDIST_BROADCAST, in, out->untyped_data(), false, process_set, &error))
    return Failed(c, error);
  c->requests.back().root = static_cast<int32_t>(root);
  return Enqueue(c, nullptr);
}

ffi::Future ReducescatterImpl(ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out,
                              std::string_view name, int64_t op, int64_t process_set,
                              double prescale, double postscale) {
  auto* c = new Call();
  c->kind = kReducescatter;
  c->name = std::string(name);
  std::string error;
  if (!AddRequest(c, KERASDIST_REDUCESCATTER, in, out->untyped_data(), true, process_set,
                  &error))
    return Failed(c, error);
  c->requests.back().reduce_op = static_cast<int32_t>(op);
  c->requests.back().prescale = prescale;
  c->requests.back().postscale = postscale;
  return Enqueue(c, nullptr);
}

ffi::Future AllgatherImpl(ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out,
                          std::string_view name, int64_t process_set) {
  auto* c = new Call();
  c->kind = kAllgather;
  c->name = std::string(name);
  c->set_size = SetSize(process_set);
  auto dims = in.dimensions();
  c->dim0 = dims.size() ? dims[0] : 0;
  c->out = out->untyped_data();
  auto out_dims = out->dimensions();
  c->expected.assign(out_dims.begin(), out_dims.end());
  // Request 0 gathers every rank's first dimension (one int64 each), so that
  // unequal pieces fail on every rank alike.
  kerasdist_request r;
  std::memset(&r, 0, sizeof(r));
  r.struct_size = sizeof(kerasdist_request);
  r.op = KERASDIST_ALLGATHER;
  r.process_set = static_cast<int32_t>(process_set);
  r.dtype = KERASDIST_INT64;
  r.ndim = 1;
  r.input = &c->dim0;
  r.allocate = &Allocate;
  r.allocate_user = c;
  c->shapes.push_back({1});
  c->requests.push_back(r);
  std::string error;
  if (!AddRequest(c, KERASDIST_ALLGATHER, in, nullptr, false, process_set, &error))
    return Failed(c, error);
  c->requests.back().allocate = &Allocate;
  c->requests.back().allocate_user = c;
  return Enqueue(c, nullptr);
}

ffi::Future AlltoallImpl(ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out,
                         std::string_view name, int64_t process_set) {
  auto* c = new Call();
  c->kind = kAlltoall;
  c->name = std::string(name);
  c->set_size = SetSize(process_set);
  c->out = out->untyped_data();
  auto out_dims = out->dimensions();
  c->expected.assign(out_dims.begin(), out_dims.end());
  c->received.assign(c->set_size > 0 ? c->set_size : 1, 0);
  std::string error;
  if (!AddRequest(c, KERASDIST_ALLTOALL, in, nullptr, false, process_set, &error))
    return Failed(c, error);
  c->requests.back().allocate = &Allocate;
  c->requests.back().allocate_user = c;
  c->requests.back().received_splits = c->received.data();
  return Enqueue(c, nullptr);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasdistAllreduce, AllreduceImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("op")
                                  .Attr<int64_t>("process_set")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasdistBroadcast, BroadcastImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("root")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasdistReducescatter, ReducescatterImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("op")
                                  .Attr<int64_t>("process_set")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasdistAllgather, AllgatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasdistAlltoall, AlltoallImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("process_set"));

// The C API version this library was built against, for the Python loader.
extern "C" int32_t kerasdist_jax_api_version(void) { return KERASDIST_API_VERSION; }
