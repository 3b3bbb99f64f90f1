#include "engine/context.h"

#include <vector>

#include "engine/direct_board.h"
#include "transport/mpi_transport.h"
#include "algorithms/allreduce_hierarchical.h"
#include "transport/setup_exchange.h"
#include "transport/shm_transport.h"

namespace kerasdist {

namespace {

// An engine thread left behind (a bounded shutdown that timed out) still
// uses its Engine: such an Engine is never freed.
void StopAndFree(Engine* e) {
  if (e->Shutdown()) delete e;
}

// The transport stack and engine over `comm`: the bounded setup exchange
// (agreed settings, topology), shared memory between ranks on one host,
// then the engine, started.
Status StartEngine(MPI_Comm comm, const EngineConfig& config, int64_t init_timeout_ms,
                   std::shared_ptr<Engine>* engine, Topology* topology,
                   std::string* transport_name) {
  std::unique_ptr<MpiTransport> mpi;
  Status s = MpiTransport::Create(comm, init_timeout_ms, &mpi);
  if (!s.ok()) return s;
  WireSettings wire;
  wire.version = config.version;
  wire.segment_bytes = static_cast<int64_t>(config.collective.segment_bytes);
  wire.fusion_threshold = config.coordinator.fusion_threshold_bytes;
  wire.fusion_tensor_limit = config.coordinator.fusion_tensor_limit_bytes;
  wire.cycle_time_us = config.coordinator.cycle_time_us;
  wire.hierarchical = config.hierarchical;
  wire.small_allreduce_bytes = static_cast<int64_t>(config.collective.small_allreduce_bytes);
  wire.direct_allreduce_bytes = config.direct_allreduce_bytes;
  wire.direct_group_bytes = config.direct_group_bytes;
  s = ExchangeSetup(mpi.get(), wire, init_timeout_ms, topology);
  if (!s.ok()) return s;
  // Small allreduces skip the coordinator where every rank shares /dev/shm.
  std::unique_ptr<DirectBoard> board;
  if ((config.direct_allreduce_bytes > 0 || config.direct_group_bytes > 0) &&
      topology->size > 1 &&
      topology->local_size == topology->size) {
    s = DirectBoard::Create(mpi.get(), config.shared_memory, init_timeout_ms, &board);
    if (!s.ok()) return s;
  }
  std::unique_ptr<Transport> transport;
  // The hierarchical allreduce also sends along each host's own ring, whose
  // wrap-around link is not a world-ring link.
  int also_right = -1;
  if (UseHierarchical(config.hierarchical, *topology)) {
    const auto& local = topology->local_ranks;
    also_right = local[(topology->local_rank + 1) % local.size()];
  }
  s = ShmTransport::Create(std::move(mpi), config.shared_memory, also_right,
                           init_timeout_ms, &transport);
  if (!s.ok()) return s;
  *transport_name = transport->Name();
  EngineConfig resolved = config;
  if (resolved.spin_us < 0)
    resolved.spin_us = topology->local_size == topology->size ? EngineConfig::kHostSpinUs : 0;
  engine->reset(new Engine(std::move(transport), resolved, *topology), StopAndFree);
  (*engine)->SetBoard(std::move(board));
  (*engine)->Start();
  return Status::OK();
}

}  // namespace

Status Context::Create(MPI_Comm comm, const EngineConfig& config,
                       int64_t init_timeout_ms, std::unique_ptr<Context>* out) {
  std::unique_ptr<Context> ctx(new Context());
  ctx->config_ = config;
  Status s = StartEngine(comm, config, init_timeout_ms, &ctx->engine_, &ctx->topology_,
                         &ctx->transport_name_);
  if (!s.ok()) return s;
  *out = std::move(ctx);
  return Status::OK();
}

std::shared_ptr<Engine> Context::EngineFor(int32_t id) {
  if (id == 0) return engine_;
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second.engine;
}

int Context::ProcessSetSize(int32_t id) {
  if (id == 0) return size();
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? -1 : it->second.size;
}

Status Context::AddProcessSet(int32_t id, int size, MPI_Comm comm, int64_t init_timeout_ms,
                              const std::string& label) {
  if (id <= 0) return Status(StatusCode::kInvalidArgument, "process set ids start at 1");
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (sets_.count(id))
      return Status(StatusCode::kInvalidArgument,
                    "process set " + std::to_string(id) + " already exists");
  }
  ProcessSet set;
  set.size = size;
  if (comm != MPI_COMM_NULL) {
    EngineConfig config = config_;
    config.timeline_path.clear();  // the global set's rank 0 writes the timeline
    config.label = label;
    Topology topology;
    std::string name;
    Status s = StartEngine(comm, config, init_timeout_ms, &set.engine, &topology, &name);
    if (!s.ok()) return s;
  }
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_[id] = std::move(set);
  return Status::OK();
}

bool Context::RemoveProcessSet(int32_t id) {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    auto it = sets_.find(id);
    if (it == sets_.end()) return false;
    engine = std::move(it->second.engine);
    sets_.erase(it);
  }
  // Stop it now, so that no other member waits on this one; kernels still
  // holding it see it stopped.
  if (engine) engine->Shutdown();
  return true;
}

bool Context::AnyFailed() {
  if (engine_->Failed()) return true;
  std::lock_guard<std::mutex> lock(sets_mu_);
  for (auto& kv : sets_)
    if (kv.second.engine && kv.second.engine->Failed()) return true;
  return false;
}

void Context::Shutdown() {
  std::vector<std::shared_ptr<Engine>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& kv : sets_)
      if (kv.second.engine) sets.push_back(kv.second.engine);
  }
  for (auto& e : sets) e->Shutdown();
  if (engine_) engine_->Shutdown();
}

Context::~Context() { Shutdown(); }

}  // namespace kerasdist
