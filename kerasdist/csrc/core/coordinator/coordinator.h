// The coordinator runs on rank 0's engine thread. It collects what every
// rank has submitted, decides which named collectives are ready on all ranks,
// validates that the ranks agree, fuses ready allreduces, and watches for
// stalls. Its output is a ResponseList that every rank executes in order.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "wire/message.h"

namespace kerasdist {

struct CoordinatorOptions {
  int64_t fusion_threshold_bytes = 64 << 20;
  // An allreduce of at least this many bytes is planned alone: fusing it
  // saves no latency worth its two copies through the fusion buffer, and
  // alone it is reduced from its input straight into its output. 0: none.
  int64_t fusion_tensor_limit_bytes = 1 << 20;
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
  bool HasPending() const { return active_ > 0 || !ready_.empty(); }

 private:
  // A collective that some ranks have submitted. Slots live in a pool and are
  // reused, vectors and all, so that a steady step allocates nothing.
  struct Source {   // one distinct description of the tensor
    int32_t id;     // >= 0: came as this cache id; -1: name and metadata
    TensorMeta meta;
  };
  struct Pending {
    std::string name;
    std::vector<Source> sources;       // [0, Hot::num_sources): [0] came first
    std::vector<int32_t> rank_source;  // per rank; filled once there are two
    std::vector<int32_t> ids;          // id slots that point at this one
    int64_t first_seen_us = 0;
    uint64_t order = 0;
    bool warned = false;
    bool active = false;   // waiting for ranks (not ready, not free)
    bool by_name = false;  // registered in by_name_ (no live id for its name)
    bool allreduce = false;  // some rank submitted it as an allreduce
  };
  // What every submission of a Pending touches, dense by slot (with the
  // bits_ column), so that a step's working set stays in the L1 cache.
  struct Hot {
    int32_t count = 0;        // ranks that submitted
    int32_t num_sources = 0;  // distinct descriptions
    int32_t first_id = -1;    // sources[0].id
    int32_t only_id = -1;     // first_id while it is the only description
  };
  struct Ready {
    int32_t slot;     // the Pending, kept until emitted
    int32_t id_hint;  // the live id its name had when it was submitted, or -1
    int32_t id;
    int source;       // whose metadata counts (allgather: the first rank's)
    std::vector<int64_t> splits;  // alltoall: Response::splits
    int contributors;
    int64_t ready_us;
    std::vector<int64_t> rank_dim0;
    std::string error;
  };
  // Per tensor id: the pending collective it resolves to, and its state.
  struct IdSlot {
    int32_t pending = -1;
    int32_t fast = -1;   // pending, while this id is its only description
    bool valid = false;  // resolvable (announced, possibly evicted)
    bool live = false;   // in ids_ (not evicted or released)
  };

  bool Has(int32_t idx, int rank) const {
    return (bits_[static_cast<size_t>(rank >> 6) * cap_ + idx] >> (rank & 63)) & 1;
  }
  int SourceOf(int32_t idx, int rank) const {
    return hot_[idx].num_sources > 1 ? pool_[idx].rank_source[rank] : 0;
  }
  const TensorMeta& MetaOf(int32_t idx, int rank) const {
    return pool_[idx].sources[SourceOf(idx, rank)].meta;
  }
  int32_t IdFor(const std::string& name, int32_t hint, ResponseList* out);
  int32_t FindPending(const std::string& name) const;
  int32_t NewPending(const std::string& name, int64_t now_us);
  void Add(int32_t idx, int rank, int32_t id, const TensorMeta& meta);
  void Join(int rank);
  bool IsReady(int32_t idx) const;
  Ready Validate(int32_t idx, int64_t now_us);
  // Reducescatter and alltoall (coordinator_scatter.cc).
  void ValidateScatter(int32_t idx, Ready* out) const;
  static void AppendReducescatter(const TensorMeta& meta, Response* resp);
  void Deactivate(int32_t idx);
  void EmitReady(int64_t now_us, ResponseList* out);
  void InspectStalls(int64_t now_us, ResponseList* out);
  bool InspectDeadlock(int64_t now_us, ResponseList* out);
  void ReleaseTransientIds();
  void EvictIfFull(ResponseList* out);
  void FreeAcknowledged();

  int size_;
  CoordinatorOptions options_;
  std::vector<Pending> pool_;
  std::vector<Hot> hot_;           // per slot
  // Which ranks submitted, a bit per rank and slot: word w of slot i at
  // bits_[w * cap_ + i], so one rank's words for all slots are adjacent.
  std::vector<uint64_t> bits_;
  size_t cap_ = 0;                 // slots that bits_ has room for
  size_t words_;                   // (size + 63) / 64
  std::vector<int32_t> free_slots_;
  std::vector<int32_t> complete_;  // slots every rank has submitted
  std::unordered_map<std::string, int32_t> by_name_;  // pending, name without live id
  size_t active_ = 0;              // pending (waiting) slots
  size_t pending_allreduce_ = 0;   // of which some rank submitted an allreduce
  std::vector<Ready> ready_;
  uint64_t next_order_ = 0;
  // Response cache: stable ids, the validated metadata per id.
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<TensorMeta> cached_meta_;
  std::vector<bool> announced_;
  std::vector<IdSlot> slots_;
  // Join state.
  std::vector<bool> joined_;
  std::vector<uint64_t> joined_bits_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  // Shutdown / abort requested by some rank.
  int shutdown_rank_ = -1;
  std::string abort_message_;
  int64_t last_stall_check_us_ = 0;
  int64_t last_activity_us_ = 0;  // last submission or response
  bool arrived_ = false;          // submissions since the last Plan()
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
