// The engine's side of the direct board (direct_board.h): kernels run small
// cached allreduces on the board themselves; the engine thread finishes the
// ones whose peers were late, bounds their wait, and (rank 0) decides which
// tensors move to the board.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "engine/direct_board.h"
#include "engine/engine.h"

namespace kerasdist {

void Engine::SetBoard(std::unique_ptr<DirectBoard> board) { board_ = std::move(board); }

bool Engine::TryDirect(Request* request) {
  if (!board_ || request->meta.reduce_op == ReduceOp::kAdasum) return false;
  // Stopping or stopped: Enqueue() says why. (Checked again, under the
  // lock, before the engine thread takes the op over.)
  if (closing_.load(std::memory_order_acquire)) return false;
  DirectOp op;
  switch (board_->Begin(request, &op)) {
    case DirectBoard::Begun::kNotDirect:
      return false;
    case DirectBoard::Begun::kInFlight:
      request->done(Status(StatusCode::kInvalidArgument,
                           Prefix() + "a collective named '" + request->name +
                               "' is already in flight on this rank. Names of concurrent "
                               "collectives must be unique."));
      return true;
    case DirectBoard::Begun::kPosted:
      break;
  }
  // As WaitInline (inline_wait.h): poll for the peers' posts only while the
  // engine has nothing else for this process.
  if (config_.spin_us > 0 && open() == 0) {
    const int64_t until = NowMicros() + config_.spin_us;
    while (true) {
      if (FinishDirect(&op)) return true;
      if (open() > 0 || NowMicros() >= until) break;
      std::this_thread::yield();
    }
  } else if (FinishDirect(&op)) {
    return true;
  }
  Status stopped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      open_.fetch_add(1, std::memory_order_relaxed);
      direct_waiting_.fetch_add(1, std::memory_order_relaxed);
      direct_pending_.push_back(std::move(op));
      cv_.notify_one();
      return true;
    }
    stopped = final_status_;
  }
  std::vector<int> missing;
  board_->Abandon(&op, &missing);
  op.request.done(stopped);
  return true;
}

bool Engine::FinishDirect(DirectOp* op) {
  Status s;
  bool fallback = false;
  const int64_t ready = NowMicros();
  if (!board_->Poll(op, &s, &fallback)) return false;
  const int64_t now = NowMicros();
  if (s.ok() && !fallback) board_->Progress(now);
  if (timeline_.enabled() && !fallback) {
    // As for the engine's collectives: the wait for every rank's post is
    // the tensor's negotiation, the reduction its collective.
    timeline_.Event(op->request.name, kRowNegotiation, op->start_us, ready, "allreduce", "op");
    timeline_.Event("direct_allreduce", kRowCollective, ready, now, op->request.name);
  }
  if (fallback) {
    // Every rank found the tensor too large for the board this round: every
    // rank runs this round through the coordinator.
    if (op->request.parts.empty()) {
      Enqueue(std::move(op->request));
    } else if (op->request.expand) {
      EnqueueBatch(op->request.expand());
    } else {
      op->request.done(Status(StatusCode::kInternal,
                              Prefix() + "grouped allreduce '" + op->request.name +
                                  "' outgrew the board but cannot be split into its tensors"));
    }
  } else {
    if (s.ok()) direct_ops_.fetch_add(1, std::memory_order_relaxed);
    op->request.done(s);
  }
  return true;
}

// The board's waits follow the coordinator's rules for the engine's
// collectives: a lost (silent) rank stops everyone after the liveness bound;
// a deadlock (every rank waits, nothing completes) after
// KERASDIST_DEADLOCK_TIME_SECONDS; a slow rank (alive, busy elsewhere) gets
// a warning and is waited for, unless KERASDIST_STALL_SHUTDOWN_TIME_SECONDS
// is set.
std::string Engine::DirectVerdict(DirectOp* op, int64_t now) {
  const int64_t waited = now - op->start_us;
  const CoordinatorOptions& rules = config_.coordinator;
  const bool check = waited >= 1000000 && now - op->checked_us >= 100000;
  const bool warn = !op->warned && rules.stall_warning_us > 0 && waited > rules.stall_warning_us;
  const bool stall = rules.stall_shutdown_us > 0 && waited > rules.stall_shutdown_us;
  if (!check && !warn && !stall) return "";
  op->checked_us = now;
  std::string who;
  for (int r : board_->Missing(*op)) {
    who += (who.empty() ? "" : ", ") + DescribeRank(topology_, r);
    const DirectBoard::RankState st = board_->State(r);
    const int64_t silent = now - st.alive_us;
    if (st.alive_us > 0 && silent > LivenessBoundUs())
      return DescribeRank(topology_, r) + " has shown no sign of life for " +
             std::to_string(silent / 1000000) + " s while allreduce '" + op->request.name +
             "' waits for it: it has stopped or lost its connection (bound: "
             "KERASDIST_TIMEOUT_SECONDS)";
  }
  const std::string what = "allreduce '" + op->request.name + "' has waited " +
                           std::to_string(waited / 1000000) + " s for " + who;
  if (rules.deadlock_us > 0 && waited > rules.deadlock_us) {
    bool all_stuck = true;
    for (int r = 0; r < size_ && all_stuck; ++r) {
      const DirectBoard::RankState st = board_->State(r);
      all_stuck = st.waiting && now - st.progress_us > rules.deadlock_us;
    }
    if (all_stuck)
      return "deadlock: " + what +
             ", while every rank waits on a collective and none has completed for " +
             std::to_string(rules.deadlock_us / 1000000) +
             " s: the ranks wait on collectives the others never submit (bound: "
             "KERASDIST_DEADLOCK_TIME_SECONDS)";
  }
  if (stall)
    return "stall: " + what + " (KERASDIST_STALL_SHUTDOWN_TIME_SECONDS)";
  if (warn) {
    op->warned = true;
    std::fprintf(stderr, "[kerasdist] WARNING: %sstall: %s to submit it; waiting\n",
                 Prefix().c_str(), what.c_str());
  }
  return "";
}

bool Engine::PollDirect(Status* exit_status, bool* progressed) {
  if (direct_waiting_.load(std::memory_order_relaxed) == 0) return true;
  std::vector<DirectOp> ops, rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ops.swap(direct_pending_);
  }
  bool ok = true;
  const int64_t now = NowMicros();
  for (DirectOp& op : ops) {
    bool finished = FinishDirect(&op);
    if (!finished && ok) {
      const std::string why = DirectVerdict(&op, now);
      if (!why.empty()) {
        // The ranks are out of step on the board: stop, as after a failed
        // transfer; the other open collectives fail with the same status.
        std::vector<int> missing;
        board_->Abandon(&op, &missing);
        *exit_status = Status(StatusCode::kAborted, Prefix() + why);
        std::fprintf(stderr, "[kerasdist] ERROR: %s\n", exit_status->message().c_str());
        op.request.done(*exit_status);
        ok = false;
        finished = true;
      }
    }
    if (finished) {
      open_.fetch_sub(1, std::memory_order_relaxed);
      direct_waiting_.fetch_sub(1, std::memory_order_relaxed);
      *progressed = true;
    } else {
      rest.push_back(std::move(op));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (DirectOp& op : rest) direct_pending_.push_back(std::move(op));
  return ok;
}

void Engine::AnnounceDirect(ResponseList* plan) {
  if (!board_) return;
  for (const Response& resp : plan->responses) {
    // Only once every rank took part (nobody has joined) and it went well.
    if (resp.type != OpType::kAllreduce || !resp.error.empty() ||
        resp.reduce_op == ReduceOp::kAdasum || resp.contributors != size_ ||
        resp.ids.size() != resp.counts.size())
      continue;
    for (size_t i = 0; i < resp.ids.size(); ++i) {
      const int32_t id = resp.ids[i];
      // A name whose id is known here has completed before: it is cached.
      if (static_cast<size_t>(id) >= id_names_.size() || id_names_[id].empty()) continue;
      const std::string& name = id_names_[id];
      auto it = inflight_.find(name);
      if (it == inflight_.end()) continue;
      // A grouped allreduce of one dtype moves as a whole, named by its
      // first tensor, once that one is cached.
      const bool group = it->second.group_size > 0;
      if (!group && !it->second.direct_ok) continue;
      const size_t bytes =
          group ? static_cast<size_t>(it->second.group_bytes)
                : static_cast<size_t>(resp.counts[i]) * DataTypeSize(resp.dtype);
      const int64_t limit = group ? config_.direct_group_bytes : config_.direct_allreduce_bytes;
      if (limit <= 0 || bytes > static_cast<size_t>(limit)) continue;  // 0: off, even for empty tensors
      // A name already on the board comes here when it outgrew its slot: it
      // gets a larger one (the old one's arena bytes stay used).
      auto hit = cache_.find(name);
      if (!board_->Has(name, group) && (hit == cache_.end() || hit->second.first != id))
        continue;
      const size_t capacity = std::max<size_t>(64, (bytes + 63) / 64 * 64);
      const size_t need = board_->SlotBytes(capacity);
      if (next_direct_slot_ >= DirectBoard::kMaxSlots) return;  // the rest stays
      // with the coordinator, as does a tensor that no longer fits the arena.
      if (direct_planned_bytes_ + need > DirectBoard::kArenaBytes) continue;
      plan->direct.push_back(id);
      plan->direct.push_back(next_direct_slot_++);
      plan->direct.push_back(static_cast<int32_t>(capacity));
      plan->direct.push_back(group ? 1 : 0);
      direct_planned_bytes_ += need;
    }
  }
}

}  // namespace kerasdist
