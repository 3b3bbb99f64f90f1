#include "context.h"

#include "mpi_transport.h"
#include "shm_transport.h"

namespace kerasdist {

Status Context::Create(MPI_Comm comm, const EngineConfig& config,
                       int64_t init_timeout_ms, std::unique_ptr<Context>* out) {
  std::unique_ptr<MpiTransport> mpi;
  Status s = MpiTransport::Create(comm, init_timeout_ms, &mpi);
  if (!s.ok()) return s;
  std::unique_ptr<Transport> transport;
  s = ShmTransport::Create(std::move(mpi), config.shared_memory, init_timeout_ms,
                           &transport);
  if (!s.ok()) return s;
  std::unique_ptr<Context> ctx(new Context());
  ctx->config_ = config;
  ctx->transport_name_ = transport->Name();
  ctx->engine_ = std::make_unique<Engine>(std::move(transport), config);
  ctx->engine_->Start();
  *out = std::move(ctx);
  return Status::OK();
}

Context::~Context() {
  if (engine_) engine_->Shutdown();
}

}  // namespace kerasdist
