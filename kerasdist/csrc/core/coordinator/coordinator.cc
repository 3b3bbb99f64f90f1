#include "coordinator/coordinator.h"
#include "transport/transport.h"

#include <algorithm>
#include <cstdio>

// Cost per step (see README.md, "Cost at scale"): a cached tensor that a
// rank submits costs one bit and a counter in its dense per-id Pending slot;
// readiness is a counter reaching the size, not a scan over ranks; metadata
// is stored once per distinct description, not per rank, so validation is
// per description. Hash lookups by name happen once per tensor per step (the
// first rank to submit it), never per rank. Stall inspection (every 100 ms)
// is linear in the pending tensors and looks at ranks only for stalled ones.
// The stall and deadlock inspectors are in coordinator_watch.cc, the bounds
// of the response cache (transient ids, LRU eviction) in coordinator_cache.cc.

namespace kerasdist {

Coordinator::Coordinator(int size, const CoordinatorOptions& options)
    : size_(size),
      options_(options),
      joined_(size, false),
      joined_bits_((size + 63) / 64, 0),
      seen_(size, 0) {
  words_ = (size + 63) / 64;
}

bool IsTransientName(const std::string& name) {
  return name.find(".noname.") != std::string::npos;
}

int32_t Coordinator::IdFor(const std::string& name, int32_t hint, ResponseList* out) {
  int32_t id;
  if (hint >= 0 && slots_[hint].live && names_[hint] == name) {
    id = hint;  // the usual case: no hash lookup
  } else if (auto it = ids_.find(name); it != ids_.end()) {
    id = it->second;
  } else {
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
      names_[id] = name;
      cached_meta_[id] = TensorMeta();
      announced_[id] = false;
      slots_[id] = IdSlot();
    } else {
      id = static_cast<int32_t>(names_.size());
      names_.push_back(name);
      cached_meta_.emplace_back();
      announced_.push_back(false);
      last_used_.push_back(0);
      slots_.emplace_back();
    }
    ids_.emplace(name, id);
    slots_[id].valid = slots_[id].live = true;
    if (IsTransientName(name)) transient_used_.push_back(id);
    // A name that is waiting again already: it moves to its live id.
    if (!by_name_.empty()) {
      auto p = by_name_.find(name);
      if (p != by_name_.end()) {
        pool_[p->second].by_name = false;
        pool_[p->second].ids.push_back(id);
        slots_[id].pending = p->second;
        by_name_.erase(p);
      }
    }
  }
  last_used_[id] = plans_ + 1;  // the list being built
  if (!announced_[id]) {
    announced_[id] = true;
    out->new_ids.emplace_back(id, name);
  }
  return id;
}

int32_t Coordinator::FindPending(const std::string& name) const {
  auto it = ids_.find(name);
  if (it != ids_.end()) return slots_[it->second].pending;
  if (by_name_.empty()) return -1;
  auto p = by_name_.find(name);
  return p == by_name_.end() ? -1 : p->second;
}

int32_t Coordinator::NewPending(const std::string& name, int64_t now_us) {
  int32_t idx;
  if (!free_slots_.empty()) {
    idx = free_slots_.back();
    free_slots_.pop_back();
  } else {
    idx = static_cast<int32_t>(pool_.size());
    pool_.emplace_back();
    hot_.emplace_back();
    if (pool_.size() > cap_) {  // more columns: lay bits_ out anew
      const size_t cap = std::max<size_t>(64, 2 * cap_);
      std::vector<uint64_t> bits(words_ * cap, 0);
      for (size_t w = 0; w < words_; ++w)
        std::copy(bits_.begin() + w * cap_, bits_.begin() + (w + 1) * cap_,
                  bits.begin() + w * cap);
      bits_.swap(bits);
      cap_ = cap;
    }
  }
  Pending& p = pool_[idx];
  p.name.assign(name);
  for (size_t w = 0; w < words_; ++w) bits_[w * cap_ + idx] = 0;
  hot_[idx] = Hot();
  p.ids.clear();
  p.first_seen_us = now_us;
  p.order = next_order_++;
  p.warned = p.by_name = p.allreduce = false;
  p.active = true;
  ++active_;
  auto it = ids_.find(name);
  if (it != ids_.end()) {
    slots_[it->second].pending = idx;
    p.ids.push_back(it->second);
  } else {
    p.by_name = true;
    by_name_.emplace(name, idx);
  }
  return idx;
}

void Coordinator::Add(int32_t idx, int rank, int32_t id, const TensorMeta& meta) {
  Pending& p = pool_[idx];
  Hot& h = hot_[idx];
  uint64_t& word = bits_[static_cast<size_t>(rank >> 6) * cap_ + idx];
  const uint64_t bit = uint64_t{1} << (rank & 63);
  if (word & bit) return;  // submitted twice before it ran: the first counts
  word |= bit;
  int src = -1;
  if (h.num_sources > 0) {
    if (id >= 0 ? h.first_id == id : p.sources[0].meta == meta) {
      src = 0;
    } else {
      const Source& last = p.sources[h.num_sources - 1];
      if (id >= 0 ? last.id == id : last.meta == meta) src = h.num_sources - 1;
    }
  }
  if (src < 0) {
    src = h.num_sources++;
    if (static_cast<size_t>(src) == p.sources.size()) p.sources.emplace_back();
    p.sources[src].id = id;
    p.sources[src].meta = meta;
    if (src == 0) h.first_id = id;
    if (src == 1) {
      p.rank_source.assign(size_, 0);  // earlier ranks used [0]
      for (int32_t i : p.ids) slots_[i].fast = -1;
    }
    if (meta.type == OpType::kAllreduce && !p.allreduce) {
      p.allreduce = true;
      ++pending_allreduce_;
    }
  }
  if (h.num_sources > 1) p.rank_source[rank] = src;
  h.only_id = h.num_sources == 1 ? h.first_id : -1;
  if (++h.count == size_) complete_.push_back(idx);
}

void Coordinator::Join(int rank) {
  if (!joined_[rank]) {
    joined_[rank] = true;
    joined_bits_[rank >> 6] |= uint64_t{1} << (rank & 63);
    ++joined_count_;
  }
  last_joined_ = rank;
}

void Coordinator::Submit(int rank, const RequestList& list) {
  if (list.shutdown && shutdown_rank_ < 0) shutdown_rank_ = rank;
  seen_[rank] = std::max(seen_[rank], list.seen);
  if (list.entries.empty()) return;
  // The clock costs more than a submission (~70 ns in a VM): Plan(), which
  // the engine calls right after the submissions, stamps the activity, and
  // only new Pendings read the clock here, once per list.
  arrived_ = true;
  int64_t now = -1;
  const uint64_t bit = uint64_t{1} << (rank & 63);
  const RequestEntry* next = list.entries.data();
  const RequestEntry* const end = next + list.entries.size();
  while (next != end) {
    // The steady state, with no call and nothing reloaded: a cached id that
    // another rank already submitted with the same id, so only a bit and a
    // counter change. The slow path below may move these tables.
    const IdSlot* const slots = slots_.data();
    const size_t num_ids = slots_.size();
    Hot* const hot = hot_.data();
    uint64_t* const row = bits_.data() + static_cast<size_t>(rank >> 6) * cap_;
    const int size = size_;
    for (; next != end; ++next) {
      const int32_t id = next->id;
      if (static_cast<uint32_t>(id) >= num_ids) break;  // < 0 too
      const int32_t idx = slots[id].fast;
      if (idx < 0) break;
      if (row[idx] & bit) continue;  // submitted twice before it ran
      row[idx] |= bit;
      if (++hot[idx].count == size) complete_.push_back(idx);
    }
    if (next == end) break;
    const RequestEntry& e = *next++;
    if (e.id >= 0) {
      if (static_cast<size_t>(e.id) >= slots_.size() || !slots_[e.id].valid) {
        abort_message_ = "internal error: rank " + std::to_string(rank) +
                         " sent unknown cache id " + std::to_string(e.id);
        return;
      }
      int32_t idx = slots_[e.id].pending;
      if (idx < 0) {  // the first rank this step; a join never waits
        if (cached_meta_[e.id].type == OpType::kJoin) {
          Join(rank);
          continue;
        }
        idx = FindPending(names_[e.id]);
        if (idx < 0) idx = NewPending(names_[e.id], now < 0 ? (now = NowMicros()) : now);
        if (slots_[e.id].pending != idx) {  // an evicted id: a shortcut to it
          slots_[e.id].pending = idx;
          pool_[idx].ids.push_back(e.id);
        }
      }
      Add(idx, rank, e.id, cached_meta_[e.id]);
      if (hot_[idx].only_id == e.id) slots_[e.id].fast = idx;  // the next ranks' path
      continue;
    }
    const NamedRequest& named = list.Named(e);
    if (named.meta.type == OpType::kJoin) {
      Join(rank);
      continue;
    }
    int32_t idx = FindPending(named.name);
    if (idx < 0) idx = NewPending(named.name, now < 0 ? (now = NowMicros()) : now);
    Add(idx, rank, -1, named.meta);
  }
}

bool Coordinator::IsReady(int32_t idx) const {
  if (hot_[idx].count == size_) return true;
  if (joined_count_ == 0) return false;
  int have = hot_[idx].count;
  for (size_t w = 0; w < words_; ++w)
    have += __builtin_popcountll(joined_bits_[w] & ~bits_[w * cap_ + idx]);
  return have == size_;
}

Coordinator::Ready Coordinator::Validate(int32_t idx, int64_t now_us) {
  const Pending& p = pool_[idx];
  Ready out;
  out.slot = idx;
  out.id_hint = !p.by_name && !p.ids.empty() ? p.ids[0] : -1;
  out.id = -1;
  out.contributors = hot_[idx].count;
  out.ready_us = now_us;
  int first = 0;
  while (!Has(idx, first)) ++first;
  out.source = SourceOf(idx, first);
  const TensorMeta& m0 = p.sources[out.source].meta;
  if (m0.dtype == DataType::kBool &&
      (m0.type == OpType::kReducescatter ||
       (m0.type == OpType::kAllreduce && m0.reduce_op != ReduceOp::kMin &&
        m0.reduce_op != ReduceOp::kMax))) {
    out.error = std::string(OpTypeName(m0.type)) + " of '" + p.name + "' with op " +
                ReduceOpName(m0.reduce_op) +
                ": bool tensors are reduced only by allreduce with op Min (logical and) "
                "or Max (logical or). Cast to an integer dtype to sum or average them.";
    return out;
  }
  if (m0.type == OpType::kReducescatter || m0.type == OpType::kAlltoall) {
    ValidateScatter(idx, &out);
    return out;
  }
  // Every description that some rank sent must agree with the first rank's.
  bool ok = true;
  for (int s = 0; s < hot_[idx].num_sources && ok; ++s) {
    const TensorMeta& m = p.sources[s].meta;
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
             (Has(idx, r) ? MetaOf(idx, r).Describe() : std::string("nothing (joined)"));
    }
    msg += ". Every rank must call the same collective with the same dtype, "
           "op and shape";
    if (m0.type == OpType::kAllgather)
      msg += " (allgather: same rank and trailing dimensions, at least 1-D)";
    out.error = msg + ".";
    return out;
  }
  if (m0.type == OpType::kAllreduce && m0.reduce_op == ReduceOp::kAdasum) {
    if (size_ & (size_ - 1)) {
      out.error = "Adasum allreduce of '" + p.name +
                  "' needs a power-of-two number of ranks. Received: size=" +
                  std::to_string(size_) + ". Use op=Average or run on 2, 4, 8, ... ranks.";
    } else if (!IsAdasumType(m0.dtype)) {
      out.error = "Adasum allreduce of '" + p.name +
                  "' needs a floating-point tensor (float16, bfloat16, float32, float64). "
                  "Received: dtype=" + DataTypeName(m0.dtype) + ".";
    }
  }
  if (m0.type == OpType::kBroadcast) {
    if (m0.root < 0 || m0.root >= size_) {
      out.error = "Invalid root_rank for broadcast '" + p.name + "'. Expected 0 <= root_rank < " +
                  std::to_string(size_) + ". Received: root_rank=" + std::to_string(m0.root);
    } else if (!Has(idx, m0.root)) {
      out.error = "broadcast '" + p.name + "': root rank " + std::to_string(m0.root) +
                  " has already joined and cannot send";
    }
  }
  if (m0.type == OpType::kAllgather) {
    out.rank_dim0.assign(size_, 0);
    for (int r = 0; r < size_; ++r)
      if (Has(idx, r)) out.rank_dim0[r] = MetaOf(idx, r).shape[0];
  }
  return out;
}

void Coordinator::Deactivate(int32_t idx) {
  // Out of every lookup; the slot itself stays until its Ready is emitted.
  Pending& p = pool_[idx];
  for (int32_t id : p.ids)
    if (slots_[id].pending == idx) slots_[id].pending = slots_[id].fast = -1;
  if (p.by_name) by_name_.erase(p.name);
  if (p.allreduce) --pending_allreduce_;
  p.active = false;
  --active_;
}

void Coordinator::EmitReady(int64_t now_us, ResponseList* out) {
  // Hold ready allreduces back for up to one cycle while other allreduces
  // are still arriving, so that they can travel in one fused buffer.
  const bool others_arriving = pending_allreduce_ > 0;
  int64_t oldest = now_us, ready_bytes = 0;
  for (const Ready& r : ready_) {
    const TensorMeta& m = pool_[r.slot].sources[r.source].meta;
    if (m.type != OpType::kAllreduce || !r.error.empty()) continue;
    oldest = std::min(oldest, r.ready_us);
    ready_bytes += NumElements(m.shape) * DataTypeSize(m.dtype);
  }
  const bool hold = others_arriving && options_.cycle_time_us > 0 &&
                    now_us - oldest < options_.cycle_time_us &&
                    ready_bytes < options_.fusion_threshold_bytes;

  struct Open {  // a fusion group still taking tensors
    OpType type;
    DataType dtype;
    ReduceOp op;
    double prescale, postscale;
    int contributors;
    size_t index;  // in out->responses
    int64_t bytes;
  };
  std::vector<Open> open;
  std::vector<Ready> kept;
  for (Ready& r : ready_) {
    const TensorMeta& m = pool_[r.slot].sources[r.source].meta;
    const bool is_allreduce = m.type == OpType::kAllreduce && r.error.empty();
    const bool fuses = is_allreduce || (m.type == OpType::kReducescatter && r.error.empty());
    if (is_allreduce && hold) {
      kept.push_back(std::move(r));
      continue;
    }
    r.id = IdFor(pool_[r.slot].name, r.id_hint, out);
    const int64_t count = NumElements(m.shape);
    if (r.error.empty() && !IsPerRankMeta(m.type)) cached_meta_[r.id] = m;
    free_slots_.push_back(r.slot);
    const int64_t bytes = count * DataTypeSize(m.dtype);
    const bool alone = is_allreduce && options_.fusion_tensor_limit_bytes > 0 &&
                       bytes >= options_.fusion_tensor_limit_bytes;
    if (fuses && !alone) {
      auto g = std::find_if(open.begin(), open.end(), [&](const Open& o) {
        return o.type == m.type && o.dtype == m.dtype && o.op == m.reduce_op &&
               o.prescale == m.prescale && o.postscale == m.postscale &&
               o.contributors == r.contributors;
      });
      if (g != open.end() && g->bytes + bytes <= options_.fusion_threshold_bytes) {
        Response& resp = out->responses[g->index];
        resp.ids.push_back(r.id);
        if (m.type == OpType::kReducescatter)
          AppendReducescatter(m, &resp);
        else
          resp.counts.push_back(count);
        g->bytes += bytes;
        continue;
      }
      if (g == open.end()) {
        open.push_back(
          {m.type, m.dtype, m.reduce_op, m.prescale, m.postscale, r.contributors, 0, 0});
        g = open.end() - 1;
      }
      g->index = out->responses.size();  // a new group replaces a full one
      g->bytes = bytes;
    }
    Response resp;
    resp.type = m.type;
    resp.ids.push_back(r.id);
    resp.dtype = m.dtype;
    resp.reduce_op = m.reduce_op;
    resp.root = m.root;
    resp.prescale = m.prescale;
    resp.postscale = m.postscale;
    resp.rank_dim0 = std::move(r.rank_dim0);
    resp.splits = std::move(r.splits);
    resp.contributors = r.contributors;
    resp.error = std::move(r.error);
    if (IsPerRankMeta(m.type)) {  // allgather, alltoall
      int64_t row = 1;  // elements per row of the gathered tensor
      for (size_t i = 1; i < m.shape.size(); ++i) row *= m.shape[i];
      resp.counts.push_back(row);
    } else if (m.type == OpType::kReducescatter) {
      AppendReducescatter(m, &resp);
    } else {
      resp.counts.push_back(count);
    }
    out->responses.push_back(std::move(resp));
  }
  ready_ = std::move(kept);
}

ResponseList Coordinator::Plan(int64_t now_us) {
  ResponseList out;
  if (arrived_) {  // submissions since the last Plan()
    last_activity_us_ = std::max(last_activity_us_, now_us);
    arrived_ = false;
  }
  if (abort_message_.empty() && names_.size() + active_ >= kMaxTensorId - 65536) {
    abort_message_ = "more than " + std::to_string(kMaxTensorId - 65536) +
                     " distinct collective names: give collectives that repeat (per "
                     "step or per batch) the same name, or no name at all";
  }
  if (!abort_message_.empty()) {
    out.abort = true;
    out.message = abort_message_;
    return out;
  }
  // Complete ones are known from their counters; with joined ranks, any
  // pending one may be ready, so then all are looked at.
  std::vector<int32_t> became_ready;
  became_ready.swap(complete_);
  if (joined_count_ > 0) {
    for (size_t i = 0; i < pool_.size(); ++i)
      if (pool_[i].active && hot_[i].count < size_ && IsReady(static_cast<int32_t>(i)))
        became_ready.push_back(static_cast<int32_t>(i));
  }
  std::sort(became_ready.begin(), became_ready.end(),
            [this](int32_t a, int32_t b) { return pool_[a].order < pool_[b].order; });
  for (int32_t idx : became_ready) {
    ready_.push_back(Validate(idx, now_us));
    Deactivate(idx);
  }
  became_ready.clear();
  complete_.swap(became_ready);  // keeps the capacity
  EmitReady(now_us, &out);
  if (joined_count_ == size_ && ready_.empty() && active_ == 0) {
    Response resp;
    resp.type = OpType::kJoin;
    resp.root = last_joined_;
    out.responses.push_back(resp);
    joined_.assign(size_, false);
    std::fill(joined_bits_.begin(), joined_bits_.end(), 0);
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
