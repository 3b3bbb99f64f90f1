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

#include "mpi_transport.h"

namespace kerasdist {

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

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::vector<std::string> hosts;  // per rank
  std::vector<int> local_ranks;    // world ranks on this host, in order
  bool homogeneous = true;         // every host runs as many ranks
};

// Collective and bounded. On success fills *topology; fails with
// kInvalidArgument (the same message on every rank) if settings differ.
Status ExchangeSetup(MpiTransport* mpi, const WireSettings& mine,
                     int64_t timeout_ms, Topology* topology);

// "rank 3 (host node2)", for messages about lost ranks.
std::string DescribeRank(const Topology& topology, int rank);

}  // namespace kerasdist
