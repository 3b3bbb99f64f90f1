// The coordinator's stall inspector and deadlock detector. Both run from
// Plan() at most every 100 ms; the stall pass is linear in the pending
// collectives and lists ranks only for those that stalled.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <cstdio>

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

void Coordinator::InspectStalls(int64_t now_us, ResponseList* out) {
  if (now_us - last_stall_check_us_ < 100000) return;
  last_stall_check_us_ = now_us;
  if (InspectDeadlock(now_us, out)) return;
  const bool can_abort = options_.stall_shutdown_us > 0;
  std::vector<int32_t> stalled;  // oldest first
  for (size_t i = 0; i < pool_.size(); ++i) {
    const Pending& p = pool_[i];
    if (!p.active) continue;
    const int64_t age = now_us - p.first_seen_us;
    if ((can_abort && age > options_.stall_shutdown_us) ||
        (!p.warned && age > options_.stall_warning_us))
      stalled.push_back(static_cast<int32_t>(i));
  }
  std::sort(stalled.begin(), stalled.end(),
            [this](int32_t a, int32_t b) { return pool_[a].order < pool_[b].order; });
  for (int32_t idx : stalled) {
    Pending& p = pool_[idx];
    const int64_t age = now_us - p.first_seen_us;
    std::vector<int> have, missing;
    for (int r = 0; r < size_; ++r) (Has(idx, r) ? have : missing).push_back(r);
    const std::string what = std::string(OpTypeName(MetaOf(idx, have[0]).type)) +
                             " '" + p.name + "'";
    if (can_abort && age > options_.stall_shutdown_us) {
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
  if (options_.deadlock_us <= 0 || active_ == 0 || !ready_.empty()) return false;
  const int64_t quiet = now_us - std::max(last_activity_us_, int64_t{0});
  if (last_activity_us_ == 0 || quiet < options_.deadlock_us) return false;
  std::vector<int32_t> order;  // pending slots, oldest first
  for (size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].active) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(),
            [this](int32_t a, int32_t b) { return pool_[a].order < pool_[b].order; });
  std::vector<std::vector<int32_t>> waits(size_);
  for (int32_t idx : order)
    for (int r = 0; r < size_; ++r)
      if (Has(idx, r)) waits[r].push_back(idx);
  for (int r = 0; r < size_; ++r)
    if (waits[r].empty() && !joined_[r]) return false;  // r is busy: slow, not stuck
  std::string msg = "Deadlock: every rank waits on a collective that another rank has "
                    "not submitted, and nothing has arrived for " +
                    std::to_string(quiet / 1000000) + " s.";
  for (int r = 0; r < size_; ++r) {
    msg += " Rank " + std::to_string(r) + " waits on ";
    if (waits[r].empty()) msg += "the others (it has joined)";
    for (size_t i = 0; i < waits[r].size() && i < 4; ++i) {
      const int32_t idx = waits[r][i];
      msg += (i ? ", " : "") + std::string(OpTypeName(MetaOf(idx, r).type)) + " '" +
             pool_[idx].name + "'";
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

}  // namespace kerasdist
