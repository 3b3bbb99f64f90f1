// Control-plane messages between the ranks and the coordinator (rank 0).
//
// A worker sends a RequestList with the collectives that became ready on it;
// the coordinator answers every worker with the same ResponseList, and all
// ranks execute its responses in order. Tensors are referred to by a numeric
// id once the coordinator has announced it (the response cache): a request
// whose metadata has not changed since the last successful run sends only
// its id.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/common.h"

namespace kerasdist {

// What one rank says about one named collective.
struct TensorMeta {
  OpType type = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  // alltoall: rows sent to each rank (empty: split evenly). Validated by the
  // coordinator, so a rank's bad splits fail the collective on every rank.
  std::vector<int64_t> splits;

  bool operator==(const TensorMeta& o) const;
  bool operator!=(const TensorMeta& o) const { return !(*this == o); }
  // e.g. "allreduce(sum) float32 [2, 3]"
  std::string Describe() const;
};

// Ops whose metadata differs between ranks (allgather's first dimension,
// alltoall's splits): their metadata is never cached.
inline bool IsPerRankMeta(OpType type) {
  return type == OpType::kAllgather || type == OpType::kAlltoall;
}

// A collective submitted without a cache id: its name and metadata.
struct NamedRequest {
  std::string name;
  TensorMeta meta;
};

// 8 bytes, so that rank 0 decodes and walks a worker's cached ids (the
// steady state) densely; names and metadata live in RequestList::named.
struct RequestEntry {
  int32_t id = -1;     // >= 0: metadata is the cached one for this id
  int32_t named = -1;  // id < 0: its index in RequestList::named
};

struct RequestList {
  std::vector<RequestEntry> entries;  // in submission order
  std::vector<NamedRequest> named;    // of the entries without an id
  bool shutdown = false;  // this rank asks the job to shut down
  uint64_t seen = 0;      // response lists with content this rank has run

  void AddId(int32_t id) { entries.push_back({id, -1}); }
  void AddNamed(const std::string& name, const TensorMeta& meta) {
    entries.push_back({-1, static_cast<int32_t>(named.size())});
    named.push_back({name, meta});
  }
  const NamedRequest& Named(const RequestEntry& e) const { return named[e.named]; }
};

struct Response {
  OpType type = OpType::kAllreduce;  // kBarrier doubles as "complete only"
  std::vector<int32_t> ids;          // tensors, fused in this order
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> rank_dim0;    // allgather: first dimension per rank
  // Per id: element count (allreduce, broadcast) or elements per row
  // (allgather). Lets a rank that has joined take part without the tensor.
  std::vector<int64_t> counts;
  // alltoall: the rows rank i sends to rank j at [i * size + j];
  // reducescatter: the first dimension of each id (counts: elements per row).
  std::vector<int64_t> splits;
  int32_t contributors = 0;          // ranks that submitted (for averages)
  std::string error;                 // non-empty: fail these tensors
};

struct ResponseList {
  std::vector<std::pair<int32_t, std::string>> new_ids;  // id -> name
  std::vector<Response> responses;
  // Cache ids evicted after this list's responses: each rank forgets them
  // (and says so through RequestList::seen) before the id can be reused.
  std::vector<int32_t> evicted;
  // Quadruples (tensor id, slot, capacity in bytes, group): these
  // allreduces use the direct board from their next execution on
  // (direct_board.h); group 1: the grouped allreduce whose first tensor has
  // that id. Applied before the responses.
  std::vector<int32_t> direct;
  bool shutdown = false;
  bool abort = false;
  std::string message;  // why the job shuts down or aborts
  bool empty() const {
    return new_ids.empty() && responses.empty() && evicted.empty() && direct.empty() &&
           !shutdown && !abort;
  }
};

// Tensor ids are dense indices below this bound (the coordinator reuses the
// ids of unnamed tensors), so a decoded id can index a table safely.
constexpr int32_t kMaxTensorId = 1 << 24;

std::string Serialize(const RequestList& list);
// Parse() returns false for anything that is not a well-formed message:
// truncated, trailing bytes, counts larger than the bytes that follow,
// enum values out of range, negative ids, counts or dimensions. A list can be
// parsed into again and again (rank 0 reuses one for every worker): Parse()
// replaces all of it.
std::string Serialize(const ResponseList& list);
bool Parse(const std::string& bytes, RequestList* list);
bool Parse(const std::string& bytes, ResponseList* list);

}  // namespace kerasdist
