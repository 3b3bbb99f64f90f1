// Where the ranks run: agreed once at init() by the setup exchange
// (setup_exchange.h) from every rank's host name. Plain data, no MPI.
#pragma once

#include <string>
#include <vector>

namespace kerasdist {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::vector<std::string> hosts;  // per rank
  std::vector<int> local_ranks;    // world ranks on this host, in order
  bool homogeneous = true;         // every host runs as many ranks
};

// "rank 3 (host node2)", for messages about lost ranks.
std::string DescribeRank(const Topology& topology, int rank);

}  // namespace kerasdist
