#include "context.h"

#include "mpi_transport.h"
#include "hierarchical.h"
#include "setup_exchange.h"
#include "shm_transport.h"

namespace kerasdist {

Status Context::Create(MPI_Comm comm, const EngineConfig& config,
                       int64_t init_timeout_ms, std::unique_ptr<Context>* out) {
  std::unique_ptr<MpiTransport> mpi;
  Status s = MpiTransport::Create(comm, init_timeout_ms, &mpi);
  if (!s.ok()) return s;
  WireSettings wire;
  wire.version = config.version;
  wire.segment_bytes = static_cast<int64_t>(config.collective.segment_bytes);
  wire.fusion_threshold = config.coordinator.fusion_threshold_bytes;
  wire.cycle_time_us = config.coordinator.cycle_time_us;
  wire.hierarchical = config.hierarchical;
  wire.small_allreduce_bytes = static_cast<int64_t>(config.collective.small_allreduce_bytes);
  Topology topology;
  s = ExchangeSetup(mpi.get(), wire, init_timeout_ms, &topology);
  if (!s.ok()) return s;
  std::unique_ptr<Transport> transport;
  // The hierarchical allreduce also sends along each host's own ring, whose
  // wrap-around link is not a world-ring link.
  int also_right = -1;
  if (UseHierarchical(config.hierarchical, topology)) {
    const auto& local = topology.local_ranks;
    also_right = local[(topology.local_rank + 1) % local.size()];
  }
  s = ShmTransport::Create(std::move(mpi), config.shared_memory, also_right,
                           init_timeout_ms, &transport);
  if (!s.ok()) return s;
  std::unique_ptr<Context> ctx(new Context());
  ctx->config_ = config;
  ctx->transport_name_ = transport->Name();
  ctx->topology_ = topology;
  ctx->engine_ = std::make_unique<Engine>(std::move(transport), config, topology);
  ctx->engine_->Start();
  *out = std::move(ctx);
  return Status::OK();
}

Context::~Context() {
  // An engine thread left behind still uses the Engine: never free it.
  if (engine_ && !engine_->Shutdown()) engine_.release();
}

}  // namespace kerasdist
