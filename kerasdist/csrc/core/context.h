// The process's kerasdist state in one explicit object: the rank and size of
// the communicator, the transport, and the engine thread. The op binding
// keeps the single pointer to the live Context; nothing else is global.
#pragma once

#include <memory>

#include <mpi.h>

#include "engine.h"

namespace kerasdist {

class Context {
 public:
  // Duplicates `comm` (bounded by init_timeout_ms) and starts the engine.
  static Status Create(MPI_Comm comm, const EngineConfig& config,
                       int64_t init_timeout_ms, std::unique_ptr<Context>* out);
  ~Context();  // shuts the engine down

  int rank() const { return engine_->rank(); }
  int size() const { return engine_->size(); }
  Engine* engine() { return engine_.get(); }
  const EngineConfig& config() const { return config_; }
  const std::string& transport_name() const { return transport_name_; }
  const Topology& topology() const { return topology_; }

 private:
  Context() = default;
  EngineConfig config_;
  std::string transport_name_;
  Topology topology_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace kerasdist
