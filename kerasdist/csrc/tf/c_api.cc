// C entry points called from Python (kerasdist/runtime.py) through ctypes on
// the same shared library that TensorFlow loaded the ops from.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "binding.h"

namespace kerasdist {

namespace {
std::mutex g_mu;
bool g_failed = false;  // some engine of this process stopped on an error
std::shared_ptr<Context>* g_context = new std::shared_ptr<Context>();  // never freed
}  // namespace

std::shared_ptr<Context> CurrentContext() {
  std::lock_guard<std::mutex> lock(g_mu);
  return *g_context;
}

}  // namespace kerasdist

using kerasdist::Context;
using kerasdist::EngineConfig;

extern "C" {

// Returns 0 on success; otherwise writes a message into err.
int kerasdist_init(int fortran_comm, long long fusion_threshold,
                   long long cycle_time_us, long long stall_warning_us,
                   long long stall_shutdown_us, long long timeout_ms,
                   long long init_timeout_ms, long long segment_bytes,
                   int shared_memory, const char* timeline_path,
                   const char* version, long long deadlock_us, int hierarchical,
                   long long cache_capacity, long long small_allreduce_bytes,
                   long long fusion_tensor_limit, long long spin_us,
                   long long direct_allreduce_bytes, long long direct_group_bytes,
                   char* err, int err_len) {
  std::lock_guard<std::mutex> lock(kerasdist::g_mu);
  if (*kerasdist::g_context) return 0;  // init() twice is harmless
  EngineConfig config;
  config.coordinator.fusion_threshold_bytes = fusion_threshold;
  config.coordinator.fusion_tensor_limit_bytes = fusion_tensor_limit;
  config.coordinator.cycle_time_us = cycle_time_us;
  config.coordinator.stall_warning_us = stall_warning_us;
  config.coordinator.stall_shutdown_us = stall_shutdown_us;
  config.collective.timeout_ms = timeout_ms;
  if (segment_bytes > 0) config.collective.segment_bytes = segment_bytes;
  config.timeline_path = timeline_path ? timeline_path : "";
  config.shared_memory = shared_memory != 0;
  config.version = version ? version : "";
  config.coordinator.deadlock_us = deadlock_us;
  config.hierarchical = hierarchical;
  config.coordinator.cache_capacity = cache_capacity;
  config.collective.small_allreduce_bytes = static_cast<size_t>(small_allreduce_bytes);
  config.spin_us = spin_us;
  config.direct_allreduce_bytes = direct_allreduce_bytes;
  config.direct_group_bytes = direct_group_bytes;
  std::unique_ptr<Context> ctx;
  kerasdist::Status s =
      Context::Create(MPI_Comm_f2c(fortran_comm), config, init_timeout_ms, &ctx);
  if (!s.ok()) {
    // MPI may still hold requests of the failed setup (a pending
    // MPI_Comm_idup), on which MPI_Finalize would wait: bound the exit.
    kerasdist::g_failed = true;
    std::strncpy(err, s.message().c_str(), err_len - 1);
    err[err_len - 1] = '\0';
    return 1;
  }
  *kerasdist::g_context = std::shared_ptr<Context>(std::move(ctx));
  return 0;
}

int kerasdist_shutdown() {
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lock(kerasdist::g_mu);
    ctx.swap(*kerasdist::g_context);
  }
  // Kernels still running hold their own reference; the engine stops when
  // the last one is released. Shut it down now so that no rank waits on us.
  if (ctx) {
    ctx->Shutdown();
    if (ctx->AnyFailed()) {
      std::lock_guard<std::mutex> lock(kerasdist::g_mu);
      kerasdist::g_failed = true;
    }
  }
  return 0;
}

// Registers process set `id` of `size` ranks and, on its members, starts its
// engine over `fortran_comm` (every rank calls this). Returns 0, or 1 with a message in err.
// `member` 0 registers the set on a rank outside it (fortran_comm unused).
int kerasdist_add_process_set(int id, int size, int member, int fortran_comm,
                              long long init_timeout_ms, const char* label, char* err,
                              int err_len) {
  auto ctx = kerasdist::CurrentContext();
  MPI_Comm comm = member ? MPI_Comm_f2c(fortran_comm) : MPI_COMM_NULL;
  kerasdist::Status s =
      ctx ? ctx->AddProcessSet(id, size, comm, init_timeout_ms, label ? label : "")
          : kerasdist::Status(kerasdist::StatusCode::kShutdown, "kerasdist is not initialized");
  if (s.ok()) return 0;
  std::strncpy(err, s.message().c_str(), err_len - 1);
  err[err_len - 1] = '\0';
  return 1;
}

// Stops process set `id`'s engine on this rank. 1 if it was there.
int kerasdist_remove_process_set(int id) {
  auto ctx = kerasdist::CurrentContext();
  return ctx && ctx->RemoveProcessSet(id) ? 1 : 0;
}

// Called at interpreter exit. After a failed collective, MPI_Finalize (which
// mpi4py calls next) can wait forever on a peer that is frozen or gone, or on
// requests MPI could not cancel. So if some engine of this process failed,
// a watchdog ends the process with exit code 1 should exiting take longer
// than `seconds`. A healthy job is never cut short: a rank that finishes
// early may legitimately wait in MPI_Finalize for the others.
int kerasdist_exit_guard(double seconds) {
  bool failed;
  {
    std::lock_guard<std::mutex> lock(kerasdist::g_mu);
    failed = kerasdist::g_failed ||
             (*kerasdist::g_context && (*kerasdist::g_context)->AnyFailed());
  }
  if (!failed) return 0;
  std::thread([seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::fprintf(stderr,
                 "[kerasdist] ERROR: a collective failed earlier and exiting (MPI_Finalize) "
                 "did not finish within %.0f s; ending the process with exit code 1.\n",
                 seconds);
    std::fflush(nullptr);
    std::_Exit(1);
  }).detach();
  return 1;
}

// Writes local_rank, local_size, cross_rank, cross_size, homogeneous and
// whether allreduces take the hierarchical algorithm.
int kerasdist_topology(int* out) {
  auto ctx = kerasdist::CurrentContext();
  if (!ctx) return 1;
  const auto& t = ctx->topology();
  out[5] = ctx->engine()->hierarchical() ? 1 : 0;
  out[0] = t.local_rank;
  out[1] = t.local_size;
  out[2] = t.cross_rank;
  out[3] = t.cross_size;
  out[4] = t.homogeneous ? 1 : 0;
  return 0;
}

// Entries in this rank's response cache, or -1 before init().
long long kerasdist_cache_entries() {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? static_cast<long long>(ctx->engine()->cache_entries()) : -1;
}

// Allreduces this rank completed on the direct board, or -1 before init().
long long kerasdist_direct_ops() {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? static_cast<long long>(ctx->engine()->direct_ops()) : -1;
}

// The engine's spin in microseconds (KERASDIST_SPIN_MICROSECONDS, or the
// choice by topology), or -1 before init().
long long kerasdist_spin_us() {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? static_cast<long long>(ctx->engine()->spin_us()) : -1;
}

int kerasdist_is_initialized() { return kerasdist::CurrentContext() ? 1 : 0; }

int kerasdist_rank() {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? ctx->rank() : -1;
}

int kerasdist_size() {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? ctx->size() : -1;
}

#ifndef KERASDIST_TF_VERSION
#define KERASDIST_TF_VERSION "unknown"
#endif
// The TensorFlow version the library was compiled against (set by setup.py).
const char* kerasdist_built_tf_version() { return KERASDIST_TF_VERSION; }

// Writes the transport's description (e.g. the MPI library) into buf.
int kerasdist_transport_name(char* buf, int len) {
  auto ctx = kerasdist::CurrentContext();
  std::string name = ctx ? ctx->transport_name() : "";
  std::strncpy(buf, name.c_str(), len - 1);
  buf[len - 1] = '\0';
  return ctx ? 0 : 1;
}

}  // extern "C"
