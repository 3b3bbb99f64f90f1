// The coordinator runs on rank 0's engine thread. It collects what every
// rank has submitted, decides which named collectives are ready on all ranks,
// validates that the ranks agree, fuses ready allreduces, and watches for
// stalls. Its output is a ResponseList that every rank executes in order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace kerasdist {

struct CoordinatorOptions {
  int64_t fusion_threshold_bytes = 64 << 20;
  int64_t cycle_time_us = 1000;        // longest a ready allreduce waits to fuse
  int64_t stall_warning_us = 60 * 1000000LL;
  int64_t stall_shutdown_us = 0;       // 0: never abort on a stall
  // Every rank waits on collectives the others have not submitted and
  // nothing new has arrived for this long: a deadlock, aborted. 0: never.
  int64_t deadlock_us = 60 * 1000000LL;
  // Named collectives whose metadata every rank caches (id-only requests).
  // Past this many, the least recently used are evicted.
  int64_t cache_capacity = 1024;
};

class Coordinator {
 public:
  Coordinator(int size, const CoordinatorOptions& options);

  // Records what `rank` submitted. Unknown cache ids abort the job.
  void Submit(int rank, const RequestList& list);

  // Builds the responses that can run now (may be empty). Also runs the
  // stall inspector; an expired stall shutdown turns into an abort.
  ResponseList Plan(int64_t now_us);

  // True when some tensors are waiting for other ranks (the engine then
  // polls more often).
  bool HasPending() const { return !pending_.empty() || !ready_.empty(); }

 private:
  struct Pending {
    std::string name;
    std::vector<TensorMeta> metas;  // per rank
    std::vector<bool> submitted;    // per rank
    int count = 0;
    int64_t first_seen_us = 0;
    uint64_t order = 0;
    bool warned = false;
  };
  struct Ready {
    std::string name;
    int32_t id;
    TensorMeta meta;  // rank-independent part (allgather: rank 0's)
    std::vector<int64_t> rank_dim0;
    std::vector<int64_t> splits;  // alltoall: Response::splits
    int contributors;
    int64_t ready_us;
    std::string error;
  };

  int32_t IdFor(const std::string& name, ResponseList* out);
  bool IsReady(const Pending& p) const;
  Ready Validate(const Pending& p, int64_t now_us);
  // Reducescatter and alltoall (coordinator_scatter.cc).
  void ValidateScatter(const Pending& p, Ready* out) const;
  static void AppendReducescatter(const TensorMeta& meta, Response* resp);
  void EmitReady(int64_t now_us, ResponseList* out);
  void InspectStalls(int64_t now_us, ResponseList* out);
  bool InspectDeadlock(int64_t now_us, ResponseList* out);
  void ReleaseTransientIds();
  void EvictIfFull(ResponseList* out);
  void FreeAcknowledged();

  int size_;
  CoordinatorOptions options_;
  std::unordered_map<std::string, Pending> pending_;
  std::vector<Ready> ready_;
  uint64_t next_order_ = 0;
  // Response cache: stable ids, the validated metadata per id.
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<TensorMeta> cached_meta_;
  std::vector<bool> announced_;
  // Join state.
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  // Shutdown / abort requested by some rank.
  int shutdown_rank_ = -1;
  std::string abort_message_;
  int64_t last_stall_check_us_ = 0;
  int64_t last_activity_us_ = 0;  // last submission or response
  // Ids of unnamed eager collectives (never repeated) are reused.
  std::vector<int32_t> free_ids_;
  std::vector<int32_t> transient_used_;
  // LRU bound: the plan number that last used each id; evicted ids wait
  // (still resolvable) until every rank has run the list announcing it.
  uint64_t plans_ = 0;                        // lists with content so far
  std::vector<uint64_t> last_used_;
  std::vector<uint64_t> seen_;                // per rank
  std::vector<std::pair<int32_t, uint64_t>> tombstones_;  // id, plan number

 public:
  size_t cached_names() const { return ids_.size(); }
  size_t tombstones() const { return tombstones_.size(); }
};

// Names that kerasdist generates for unnamed eager collectives; they never
// repeat, so caching them would only grow the cache.
bool IsTransientName(const std::string& name);

}  // namespace kerasdist
