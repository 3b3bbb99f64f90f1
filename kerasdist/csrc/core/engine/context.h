// The process's kerasdist state in one explicit object: the rank and size of
// the communicator, the transport, and the engine thread. The op binding
// keeps the single pointer to the live Context; nothing else is global.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include <mpi.h>

#include "engine/engine.h"

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
  // The engine of process set `id` (0: the global set, this engine), or
  // null when this rank is not in it or it does not exist.
  std::shared_ptr<Engine> EngineFor(int32_t id);
  // Registers process set `id` of `size` ranks; on its members (`comm`
  // not MPI_COMM_NULL, the members in order) also starts its engine over
  // `comm`. Every rank calls this. Bounded by init_timeout_ms.
  Status AddProcessSet(int32_t id, int size, MPI_Comm comm, int64_t init_timeout_ms,
                       const std::string& label);
  // The size of process set `id`, or -1 if it does not exist.
  int ProcessSetSize(int32_t id);
  // Stops and forgets process set `id`'s engine; false if it was unknown.
  bool RemoveProcessSet(int32_t id);
  // Stops the process sets' engines, then the global one. Bounded.
  void Shutdown();
  // Whether this engine or a process set's has stopped on an error.
  bool AnyFailed();
  const EngineConfig& config() const { return config_; }
  const std::string& transport_name() const { return transport_name_; }
  const Topology& topology() const { return topology_; }

 private:
  Context() = default;
  EngineConfig config_;
  std::string transport_name_;
  Topology topology_;
  std::shared_ptr<Engine> engine_;
  std::mutex sets_mu_;
  struct ProcessSet {
    int size = 0;
    std::shared_ptr<Engine> engine;  // null where this rank is not a member
  };
  std::map<int32_t, ProcessSet> sets_;
};

}  // namespace kerasdist
