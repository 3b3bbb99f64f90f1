#include "coordinator.h"
#include "transport.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace kerasdist {

namespace {

std::string RankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s + "]";
}

}  // namespace

Coordinator::Coordinator(int size, const CoordinatorOptions& options)
    : size_(size), options_(options), joined_(size, false), seen_(size, 0) {}

bool IsTransientName(const std::string& name) {
  return name.find(".noname.") != std::string::npos;
}

int32_t Coordinator::IdFor(const std::string& name, ResponseList* out) {
  auto it = ids_.find(name);
  int32_t id;
  if (it == ids_.end()) {
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
      names_[id] = name;
      cached_meta_[id] = TensorMeta();
      announced_[id] = false;
    } else {
      id = static_cast<int32_t>(names_.size());
      names_.push_back(name);
      cached_meta_.emplace_back();
      announced_.push_back(false);
      last_used_.push_back(0);
    }
    ids_.emplace(name, id);
    if (IsTransientName(name)) transient_used_.push_back(id);
  } else {
    id = it->second;
  }
  last_used_[id] = plans_ + 1;  // the list being built
  if (!announced_[id]) {
    announced_[id] = true;
    out->new_ids.emplace_back(id, name);
  }
  return id;
}

void Coordinator::ReleaseTransientIds() {
  // Called once a response list is complete: every rank applies its new ids
  // before running it, so an id can be announced anew in the next list.
  for (int32_t id : transient_used_) {
    ids_.erase(names_[id]);
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
    if (last_used_[id] > plans_ || pending_.count(kv.first)) continue;
    candidates.emplace_back(last_used_[id], id);
  }
  std::sort(candidates.begin(), candidates.end());
  const size_t excess = ids_.size() - cap * 3 / 4;
  for (size_t i = 0; i < candidates.size() && i < excess; ++i) {
    const int32_t id = candidates[i].second;
    ids_.erase(names_[id]);
    out->evicted.push_back(id);
    tombstones_.emplace_back(id, plans_ + 1);
  }
}

void Coordinator::FreeAcknowledged() {
  uint64_t all_seen = plans_;
  for (int r = 1; r < size_; ++r) all_seen = std::min(all_seen, seen_[r]);
  for (size_t i = 0; i < tombstones_.size();) {
    if (tombstones_[i].second <= all_seen) {
      const int32_t id = tombstones_[i].first;
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

void Coordinator::Submit(int rank, const RequestList& list) {
  if (list.shutdown && shutdown_rank_ < 0) shutdown_rank_ = rank;
  seen_[rank] = std::max(seen_[rank], list.seen);
  if (!list.entries.empty()) last_activity_us_ = NowMicros();
  for (const RequestEntry& e : list.entries) {
    const std::string* name = &e.name;
    const TensorMeta* meta = &e.meta;
    if (e.id >= 0) {
      if (static_cast<size_t>(e.id) >= names_.size() || names_[e.id].empty()) {
        abort_message_ = "internal error: rank " + std::to_string(rank) +
                         " sent unknown cache id " + std::to_string(e.id);
        return;
      }
      name = &names_[e.id];
      meta = &cached_meta_[e.id];
    }
    if (meta->type == OpType::kJoin) {
      if (!joined_[rank]) {
        joined_[rank] = true;
        ++joined_count_;
      }
      last_joined_ = rank;
      continue;
    }
    auto it = pending_.find(*name);
    if (it == pending_.end()) {
      Pending p;
      p.name = *name;
      p.metas.resize(size_);
      p.submitted.assign(size_, false);
      p.first_seen_us = NowMicros();
      p.order = next_order_++;
      it = pending_.emplace(*name, std::move(p)).first;
    }
    Pending& p = it->second;
    if (!p.submitted[rank]) {
      p.submitted[rank] = true;
      p.metas[rank] = *meta;
      ++p.count;
    }
  }
}

bool Coordinator::IsReady(const Pending& p) const {
  int have = p.count;
  for (int r = 0; r < size_; ++r)
    if (joined_[r] && !p.submitted[r]) ++have;
  return have == size_;
}

Coordinator::Ready Coordinator::Validate(const Pending& p, int64_t now_us) {
  Ready out;
  out.name = p.name;
  out.id = -1;
  out.contributors = p.count;
  out.ready_us = now_us;
  int first = 0;
  while (!p.submitted[first]) ++first;
  const TensorMeta& m0 = p.metas[first];
  out.meta = m0;
  if (m0.type == OpType::kReducescatter || m0.type == OpType::kAlltoall) {
    ValidateScatter(p, &out);
    return out;
  }
  bool ok = true;
  for (int r = 0; r < size_ && ok; ++r) {
    if (!p.submitted[r]) continue;
    const TensorMeta& m = p.metas[r];
    if (m.type != m0.type || m.dtype != m0.dtype) {
      ok = false;
    } else if (m.type == OpType::kAllgather) {
      ok = !m.shape.empty() && m.shape.size() == m0.shape.size() &&
           std::equal(m.shape.begin() + 1, m.shape.end(), m0.shape.begin() + 1);
    } else if (m.type != OpType::kBarrier) {
      ok = m == m0;
    }
  }
  if (ok && m0.type == OpType::kAllgather && m0.shape.empty()) ok = false;
  if (!ok) {
    std::string msg = "Mismatched " + std::string(OpTypeName(m0.type)) +
                      " for tensor '" + p.name + "' across ranks:";
    for (int r = 0; r < size_; ++r) {
      msg += (r ? "; rank " : " rank ") + std::to_string(r) + " sent " +
             (p.submitted[r] ? p.metas[r].Describe() : std::string("nothing (joined)"));
    }
    msg += ". Every rank must call the same collective with the same dtype, "
           "op and shape";
    if (m0.type == OpType::kAllgather)
      msg += " (allgather: same rank and trailing dimensions, at least 1-D)";
    out.error = msg + ".";
    return out;
  }
  if (m0.type == OpType::kBroadcast) {
    if (m0.root < 0 || m0.root >= size_) {
      out.error = "Invalid root_rank for broadcast '" + p.name + "'. Expected 0 <= root_rank < " +
                  std::to_string(size_) + ". Received: root_rank=" + std::to_string(m0.root);
    } else if (!p.submitted[m0.root]) {
      out.error = "broadcast '" + p.name + "': root rank " + std::to_string(m0.root) +
                  " has already joined and cannot send";
    }
  }
  if (m0.type == OpType::kAllgather) {
    out.rank_dim0.assign(size_, 0);
    for (int r = 0; r < size_; ++r)
      if (p.submitted[r]) out.rank_dim0[r] = p.metas[r].shape[0];
  }
  return out;
}

void Coordinator::EmitReady(int64_t now_us, ResponseList* out) {
  // Hold ready allreduces back for up to one cycle while other allreduces
  // are still arriving, so that they can travel in one fused buffer.
  bool others_arriving = false;
  for (const auto& kv : pending_) {
    const Pending& p = kv.second;
    for (int r = 0; r < size_ && !others_arriving; ++r)
      others_arriving = p.submitted[r] && p.metas[r].type == OpType::kAllreduce;
  }
  int64_t oldest = now_us, ready_bytes = 0;
  for (const Ready& r : ready_) {
    if (r.meta.type != OpType::kAllreduce || !r.error.empty()) continue;
    oldest = std::min(oldest, r.ready_us);
    ready_bytes += NumElements(r.meta.shape) * DataTypeSize(r.meta.dtype);
  }
  const bool hold = others_arriving && options_.cycle_time_us > 0 &&
                    now_us - oldest < options_.cycle_time_us &&
                    ready_bytes < options_.fusion_threshold_bytes;

  using Key = std::tuple<int, int, int, double, double, int>;
  std::map<Key, size_t> open;  // fusion group -> index in out->responses
  std::map<Key, int64_t> open_bytes;
  std::vector<Ready> kept;
  for (Ready& r : ready_) {
    const bool is_allreduce = r.meta.type == OpType::kAllreduce && r.error.empty();
    const bool fuses =
        is_allreduce || (r.meta.type == OpType::kReducescatter && r.error.empty());
    if (is_allreduce && hold) {
      kept.push_back(std::move(r));
      continue;
    }
    r.id = IdFor(r.name, out);
    const int64_t count = NumElements(r.meta.shape);
    if (r.error.empty() && !IsPerRankMeta(r.meta.type))
      cached_meta_[r.id] = r.meta;
    if (fuses) {
      const int64_t bytes = count * DataTypeSize(r.meta.dtype);
      Key key{static_cast<int>(r.meta.type), static_cast<int>(r.meta.dtype),
              static_cast<int>(r.meta.reduce_op), r.meta.prescale, r.meta.postscale,
              r.contributors};
      auto it = open.find(key);
      if (it != open.end() &&
          open_bytes[key] + bytes <= options_.fusion_threshold_bytes) {
        Response& resp = out->responses[it->second];
        resp.ids.push_back(r.id);
        if (r.meta.type == OpType::kReducescatter)
          AppendReducescatter(r.meta, &resp);
        else
          resp.counts.push_back(count);
        open_bytes[key] += bytes;
        continue;
      }
      open[key] = out->responses.size();
      open_bytes[key] = bytes;
    }
    Response resp;
    resp.type = r.meta.type;
    resp.ids.push_back(r.id);
    resp.dtype = r.meta.dtype;
    resp.reduce_op = r.meta.reduce_op;
    resp.root = r.meta.root;
    resp.prescale = r.meta.prescale;
    resp.postscale = r.meta.postscale;
    resp.rank_dim0 = r.rank_dim0;
    resp.splits = r.splits;
    resp.contributors = r.contributors;
    resp.error = r.error;
    if (IsPerRankMeta(r.meta.type)) {  // allgather, alltoall
      int64_t row = 1;  // elements per row of the gathered tensor
      for (size_t i = 1; i < r.meta.shape.size(); ++i) row *= r.meta.shape[i];
      resp.counts.push_back(row);
    } else if (r.meta.type == OpType::kReducescatter) {
      AppendReducescatter(r.meta, &resp);
    } else {
      resp.counts.push_back(count);
    }
    out->responses.push_back(std::move(resp));
  }
  ready_ = std::move(kept);
}

void Coordinator::InspectStalls(int64_t now_us, ResponseList* out) {
  if (now_us - last_stall_check_us_ < 100000) return;
  last_stall_check_us_ = now_us;
  if (InspectDeadlock(now_us, out)) return;
  for (auto& kv : pending_) {
    Pending& p = kv.second;
    const int64_t age = now_us - p.first_seen_us;
    std::vector<int> have, missing;
    for (int r = 0; r < size_; ++r)
      (p.submitted[r] ? have : missing).push_back(r);
    int first = have.empty() ? 0 : have[0];
    const std::string what = std::string(OpTypeName(p.metas[first].type)) +
                             " '" + p.name + "'";
    if (options_.stall_shutdown_us > 0 && age > options_.stall_shutdown_us) {
      abort_message_ = "Stall shutdown after " + std::to_string(age / 1000000) +
                       " s: " + what + " was submitted by ranks " + RankList(have) +
                       " but not by ranks " + RankList(missing) +
                       " (KERASDIST_STALL_SHUTDOWN_TIME_SECONDS).";
      out->abort = true;
      out->message = abort_message_;
      return;
    }
    if (!p.warned && age > options_.stall_warning_us) {
      p.warned = true;
      std::fprintf(stderr,
                   "[kerasdist] WARNING: stall: %s has waited %.1f s; submitted "
                   "by ranks %s, missing ranks %s. One or more ranks may be "
                   "running a different collective, be slower, or have "
                   "finished early.\n",
                   what.c_str(), age / 1e6, RankList(have).c_str(),
                   RankList(missing).c_str());
      std::fflush(stderr);
    }
  }
}

bool Coordinator::InspectDeadlock(int64_t now_us, ResponseList* out) {
  // A slow rank is busy elsewhere and waits on nothing; in a deadlock every
  // rank waits on a collective that some other rank has not submitted, and
  // nothing new has arrived for the whole bound.
  if (options_.deadlock_us <= 0 || pending_.empty() || !ready_.empty()) return false;
  const int64_t quiet = now_us - std::max(last_activity_us_, int64_t{0});
  if (last_activity_us_ == 0 || quiet < options_.deadlock_us) return false;
  std::vector<std::vector<const Pending*>> waits(size_);
  for (const auto& kv : pending_)
    for (int r = 0; r < size_; ++r)
      if (kv.second.submitted[r]) waits[r].push_back(&kv.second);
  for (int r = 0; r < size_; ++r)
    if (waits[r].empty() && !joined_[r]) return false;  // r is busy: slow, not stuck
  std::string msg = "Deadlock: every rank waits on a collective that another rank has "
                    "not submitted, and nothing has arrived for " +
                    std::to_string(quiet / 1000000) + " s.";
  for (int r = 0; r < size_; ++r) {
    msg += " Rank " + std::to_string(r) + " waits on ";
    if (waits[r].empty()) msg += "the others (it has joined)";
    std::sort(waits[r].begin(), waits[r].end(),
              [](const Pending* a, const Pending* b) { return a->order < b->order; });
    for (size_t i = 0; i < waits[r].size() && i < 4; ++i) {
      const Pending* p = waits[r][i];
      msg += (i ? ", " : "") + std::string(OpTypeName(p->metas[r].type)) + " '" + p->name + "'";
    }
    if (waits[r].size() > 4) msg += " and " + std::to_string(waits[r].size() - 4) + " more";
    msg += ";";
  }
  msg.back() = '.';
  msg += " The ranks called different collectives: for example one rank left fit() "
         "early or ran a collective in a data-dependent branch. "
         "(KERASDIST_DEADLOCK_TIME_SECONDS sets this bound; 0 turns the check off.)";
  abort_message_ = msg;
  out->abort = true;
  out->message = msg;
  return true;
}

ResponseList Coordinator::Plan(int64_t now_us) {
  ResponseList out;
  if (abort_message_.empty() && names_.size() + pending_.size() >= kMaxTensorId - 65536) {
    abort_message_ = "more than " + std::to_string(kMaxTensorId - 65536) +
                     " distinct collective names: give collectives that repeat (per "
                     "step or per batch) the same name, or no name at all";
  }
  if (!abort_message_.empty()) {
    out.abort = true;
    out.message = abort_message_;
    return out;
  }
  std::vector<const Pending*> became_ready;
  for (const auto& kv : pending_)
    if (IsReady(kv.second)) became_ready.push_back(&kv.second);
  std::sort(became_ready.begin(), became_ready.end(),
            [](const Pending* a, const Pending* b) { return a->order < b->order; });
  std::vector<std::string> done;
  for (const Pending* p : became_ready) {
    ready_.push_back(Validate(*p, now_us));
    done.push_back(p->name);
  }
  for (const auto& name : done) pending_.erase(name);
  EmitReady(now_us, &out);
  if (joined_count_ == size_ && ready_.empty() && pending_.empty()) {
    Response resp;
    resp.type = OpType::kJoin;
    resp.root = last_joined_;
    out.responses.push_back(resp);
    joined_.assign(size_, false);
    joined_count_ = 0;
  }
  if (!out.responses.empty()) last_activity_us_ = now_us;
  ReleaseTransientIds();
  EvictIfFull(&out);
  InspectStalls(now_us, &out);
  if (shutdown_rank_ >= 0 && !out.abort) {
    out.shutdown = true;
    out.message = "rank " + std::to_string(shutdown_rank_) + " shut kerasdist down";
  }
  if (!out.empty()) ++plans_;
  FreeAcknowledged();
  return out;
}

}  // namespace kerasdist
