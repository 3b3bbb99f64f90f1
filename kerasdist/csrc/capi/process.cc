// The C API's process half (kerasdist.h): the library's one Context, init,
// shutdown, topology, process sets and queries.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <mpi.h>

#include "capi/current.h"
#include "capi/kerasdist.h"

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

void CopyMessage(const std::string& message, char* buf, int32_t len) {
  if (!buf || len <= 0) return;
  std::strncpy(buf, message.c_str(), len - 1);
  buf[len - 1] = '\0';
}

}  // namespace kerasdist

using kerasdist::Context;
using kerasdist::EngineConfig;

extern "C" {

int32_t kerasdist_api_version(void) { return KERASDIST_API_VERSION; }

void kerasdist_config_defaults(kerasdist_config* c) {
  EngineConfig d;
  std::memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(kerasdist_config);
  c->fusion_threshold_bytes = d.coordinator.fusion_threshold_bytes;
  c->fusion_tensor_limit_bytes = d.coordinator.fusion_tensor_limit_bytes;
  c->cycle_time_us = d.coordinator.cycle_time_us;
  c->stall_warning_us = d.coordinator.stall_warning_us;
  c->stall_shutdown_us = d.coordinator.stall_shutdown_us;
  c->deadlock_us = d.coordinator.deadlock_us;
  c->timeout_ms = d.collective.timeout_ms;
  c->init_timeout_ms = 300000;
  c->segment_bytes = static_cast<int64_t>(d.collective.segment_bytes);
  c->cache_capacity = d.coordinator.cache_capacity;
  c->small_allreduce_bytes = static_cast<int64_t>(d.collective.small_allreduce_bytes);
  c->spin_us = d.spin_us;
  c->direct_allreduce_bytes = d.direct_allreduce_bytes;
  c->direct_group_bytes = d.direct_group_bytes;
  c->shared_memory = d.shared_memory ? 1 : 0;
  c->hierarchical = d.hierarchical;
  c->timeline_path = "";
  c->version = "";
}

int32_t kerasdist_init(int32_t fortran_comm, const kerasdist_config* c, char* err,
                       int32_t err_len) {
  if (!c || c->struct_size != static_cast<int32_t>(sizeof(kerasdist_config))) {
    kerasdist::CopyMessage(
        "kerasdist_init: the caller was built against another kerasdist C API "
        "(kerasdist_config differs); rebuild the binding",
        err, err_len);
    return KERASDIST_INVALID_ARGUMENT;
  }
  std::lock_guard<std::mutex> lock(kerasdist::g_mu);
  if (*kerasdist::g_context) return KERASDIST_OK;  // init() twice is harmless
  EngineConfig config;
  config.coordinator.fusion_threshold_bytes = c->fusion_threshold_bytes;
  config.coordinator.fusion_tensor_limit_bytes = c->fusion_tensor_limit_bytes;
  config.coordinator.cycle_time_us = c->cycle_time_us;
  config.coordinator.stall_warning_us = c->stall_warning_us;
  config.coordinator.stall_shutdown_us = c->stall_shutdown_us;
  config.coordinator.deadlock_us = c->deadlock_us;
  config.coordinator.cache_capacity = c->cache_capacity;
  config.collective.timeout_ms = c->timeout_ms;
  if (c->segment_bytes > 0) config.collective.segment_bytes = c->segment_bytes;
  config.collective.small_allreduce_bytes = static_cast<size_t>(c->small_allreduce_bytes);
  config.timeline_path = c->timeline_path ? c->timeline_path : "";
  config.shared_memory = c->shared_memory != 0;
  config.version = c->version ? c->version : "";
  config.hierarchical = c->hierarchical;
  config.spin_us = c->spin_us;
  config.direct_allreduce_bytes = c->direct_allreduce_bytes;
  config.direct_group_bytes = c->direct_group_bytes;
  std::unique_ptr<Context> ctx;
  kerasdist::Status s =
      Context::Create(MPI_Comm_f2c(fortran_comm), config, c->init_timeout_ms, &ctx);
  if (!s.ok()) {
    // MPI may still hold requests of the failed setup (a pending
    // MPI_Comm_idup), on which MPI_Finalize would wait: bound the exit.
    kerasdist::g_failed = true;
    kerasdist::CopyMessage(s.message(), err, err_len);
    return static_cast<int32_t>(s.code());
  }
  *kerasdist::g_context = std::shared_ptr<Context>(std::move(ctx));
  return KERASDIST_OK;
}

int32_t kerasdist_shutdown(void) {
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lock(kerasdist::g_mu);
    ctx.swap(*kerasdist::g_context);
  }
  // Requests still running hold their own reference to their engine; it
  // stops when the last one is released. Shut it down now so that no rank
  // waits on us.
  if (ctx) {
    ctx->Shutdown();
    if (ctx->AnyFailed()) {
      std::lock_guard<std::mutex> lock(kerasdist::g_mu);
      kerasdist::g_failed = true;
    }
  }
  return KERASDIST_OK;
}

int32_t kerasdist_add_process_set(int32_t id, int32_t size, int32_t member,
                                  int32_t fortran_comm, int64_t init_timeout_ms,
                                  const char* label, char* err, int32_t err_len) {
  auto ctx = kerasdist::CurrentContext();
  MPI_Comm comm = member ? MPI_Comm_f2c(fortran_comm) : MPI_COMM_NULL;
  kerasdist::Status s =
      ctx ? ctx->AddProcessSet(id, size, comm, init_timeout_ms, label ? label : "")
          : kerasdist::Status(kerasdist::StatusCode::kPrecondition,
                              "kerasdist is not initialized");
  if (s.ok()) return KERASDIST_OK;
  kerasdist::CopyMessage(s.message(), err, err_len);
  return static_cast<int32_t>(s.code());
}

int32_t kerasdist_remove_process_set(int32_t id) {
  auto ctx = kerasdist::CurrentContext();
  return ctx && ctx->RemoveProcessSet(id) ? 1 : 0;
}

int32_t kerasdist_process_set_info(int32_t id, int32_t* rank, int32_t* size) {
  *rank = -1;
  *size = -1;
  auto ctx = kerasdist::CurrentContext();
  if (!ctx) return KERASDIST_PRECONDITION;
  *size = ctx->ProcessSetSize(id);
  if (*size < 0) return KERASDIST_INVALID_ARGUMENT;
  auto engine = ctx->EngineFor(id);
  if (!engine) return KERASDIST_PRECONDITION;
  *rank = engine->rank();
  return KERASDIST_OK;
}

// After a failed collective, MPI_Finalize (which mpi4py calls at exit) can
// wait forever on a peer that is frozen or gone, or on requests MPI could
// not cancel. So if some engine of this process failed, a watchdog ends the
// process with exit code 1 should exiting take longer than `seconds`. A
// healthy job is never cut short: a rank that finishes early may
// legitimately wait in MPI_Finalize for the others.
int32_t kerasdist_exit_guard(double seconds) {
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

int32_t kerasdist_topology(int32_t* out) {
  auto ctx = kerasdist::CurrentContext();
  if (!ctx) return KERASDIST_PRECONDITION;
  const auto& t = ctx->topology();
  out[0] = t.local_rank;
  out[1] = t.local_size;
  out[2] = t.cross_rank;
  out[3] = t.cross_size;
  out[4] = t.homogeneous ? 1 : 0;
  out[5] = ctx->engine()->hierarchical() ? 1 : 0;
  return KERASDIST_OK;
}

long long kerasdist_cache_entries(void) {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? static_cast<long long>(ctx->engine()->cache_entries()) : -1;
}

long long kerasdist_direct_ops(void) {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? static_cast<long long>(ctx->engine()->direct_ops()) : -1;
}

long long kerasdist_spin_us(void) {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? static_cast<long long>(ctx->engine()->spin_us()) : -1;
}

int32_t kerasdist_is_initialized(void) { return kerasdist::CurrentContext() ? 1 : 0; }

int32_t kerasdist_rank(void) {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? ctx->rank() : -1;
}

int32_t kerasdist_size(void) {
  auto ctx = kerasdist::CurrentContext();
  return ctx ? ctx->size() : -1;
}

int32_t kerasdist_transport_name(char* buf, int32_t len) {
  auto ctx = kerasdist::CurrentContext();
  kerasdist::CopyMessage(ctx ? ctx->transport_name() : "", buf, len);
  return ctx ? KERASDIST_OK : KERASDIST_PRECONDITION;
}

}  // extern "C"
