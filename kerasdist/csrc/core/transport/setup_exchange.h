// The one-time exchange at init(): every rank tells every other what shapes
// the wire (protocol and package version, segment size, fusion threshold,
// cycle time) and which host it runs on.
//
// Settings that differ would put the ranks out of step in ways that surface
// much later as a hang or a corrupt stream, so init() fails instead, on every
// rank, naming the setting and the ranks that differ. The host names give
// the topology (local and cross ranks) without any further MPI collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/common.h"
#include "transport/topology.h"

namespace kerasdist {

class MpiTransport;

// Bumped whenever the control messages or the data path change shape.
constexpr int32_t kProtocolVersion = 10;

struct WireSettings {
  std::string version;           // the Python package's version
  int64_t segment_bytes = 0;
  int64_t fusion_threshold = 0;
  int64_t fusion_tensor_limit = 0;
  int64_t cycle_time_us = 0;
  int64_t small_allreduce_bytes = 0;
  int64_t direct_allreduce_bytes = 0;
  int64_t direct_group_bytes = 0;
  int32_t hierarchical = 0;      // the allreduce algorithm chosen (0 flat)
};


// Collective and bounded. On success fills *topology; fails with
// kInvalidArgument (the same message on every rank) if settings differ.
Status ExchangeSetup(MpiTransport* mpi, const WireSettings& mine,
                     int64_t timeout_ms, Topology* topology);


}  // namespace kerasdist
