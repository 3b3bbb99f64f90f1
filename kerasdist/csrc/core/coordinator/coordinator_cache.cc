// The bounds of the coordinator's response cache: ids of unnamed (transient)
// collectives are reused at once, and past the capacity the least recently
// used names are evicted; an evicted id is reused only once every rank has
// acknowledged the list that evicted it.
#include "coordinator/coordinator.h"

#include <algorithm>

namespace kerasdist {

void Coordinator::ReleaseTransientIds() {
  // Called once a response list is complete: every rank applies its new ids
  // before running it, so an id can be announced anew in the next list.
  for (int32_t id : transient_used_) {
    ids_.erase(names_[id]);
    const int32_t idx = slots_[id].pending;
    if (idx >= 0) {  // waiting again under the same name: keep it by name
      pool_[idx].by_name = true;
      by_name_.emplace(names_[id], idx);
    }
    slots_[id] = IdSlot();
    names_[id].clear();
    names_[id].shrink_to_fit();
    free_ids_.push_back(id);
  }
  transient_used_.clear();
}

void Coordinator::EvictIfFull(ResponseList* out) {
  const size_t cap = static_cast<size_t>(std::max<int64_t>(16, options_.cache_capacity));
  if (ids_.size() <= cap) return;
  // Down to 3/4 of the capacity at once, so that scans stay rare. Ids in
  // this list, or whose names are waiting, stay.
  std::vector<std::pair<uint64_t, int32_t>> candidates;
  for (const auto& kv : ids_) {
    const int32_t id = kv.second;
    if (last_used_[id] > plans_ || slots_[id].pending >= 0) continue;
    candidates.emplace_back(last_used_[id], id);
  }
  std::sort(candidates.begin(), candidates.end());
  const size_t excess = ids_.size() - cap * 3 / 4;
  for (size_t i = 0; i < candidates.size() && i < excess; ++i) {
    const int32_t id = candidates[i].second;
    ids_.erase(names_[id]);
    slots_[id].live = false;  // still resolvable until acknowledged
    out->evicted.push_back(id);
    tombstones_.emplace_back(id, plans_ + 1);
  }
}

void Coordinator::FreeAcknowledged() {
  if (tombstones_.empty()) return;
  uint64_t all_seen = plans_;
  for (int r = 1; r < size_; ++r) all_seen = std::min(all_seen, seen_[r]);
  for (size_t i = 0; i < tombstones_.size();) {
    if (tombstones_[i].second <= all_seen) {
      const int32_t id = tombstones_[i].first;
      // A slot pointing at a Pending is only a shortcut here: that Pending
      // is registered under its name's live id or in by_name_.
      slots_[id] = IdSlot();
      names_[id].clear();
      names_[id].shrink_to_fit();
      cached_meta_[id] = TensorMeta();
      free_ids_.push_back(id);
      tombstones_[i] = tombstones_.back();
      tombstones_.pop_back();
    } else {
      ++i;
    }
  }
}

}  // namespace kerasdist
