// The roll call after a failed transfer: who is really lost.
//
// A transfer that times out names the peer it waited on, but in a ring that
// peer may itself be healthy and blocked on the lost rank further round.
// So a rank whose collective failed sends a short report to every other
// rank and, for a bounded window, collects the reports the others send when
// their own collectives fail, and the answers of engines that are still
// running (they answer from their loop). The ranks it heard from are alive;
// the ones it did not are the lost ones, and the error names them with their
// hosts.
#include <cstring>

#include "engine/engine.h"

namespace kerasdist {

namespace {

enum RollKind : int32_t { kRollFailed = 1, kRollAlive = 2 };

std::string Encode(RollKind kind) {
  const int32_t k = kind;
  return std::string(reinterpret_cast<const char*>(&k), sizeof(k));
}

}  // namespace

int64_t Engine::RollCallWindowUs() const {
  // Long enough for the other ranks of a stalled ring to reach their own
  // timeouts (they started waiting within one ring step of this one).
  return std::min<int64_t>(2000000, std::max<int64_t>(config_.collective.timeout_ms * 1000 / 2,
                                                      200000));
}

bool Engine::TakeRollReport(int64_t now_us, int* peer_out, int* kind_out) {
  int peer;
  size_t bytes;
  if (!transport_->Probe(kTagRollCall, &peer, &bytes)) return false;
  std::string wire(bytes, '\0');
  Status s = transport_->RecvProbed(peer, kTagRollCall, &wire[0], bytes);
  *peer_out = peer;
  *kind_out = 0;
  if (!s.ok() || bytes != sizeof(int32_t)) return true;  // heard, unreadable
  int32_t kind;
  std::memcpy(&kind, wire.data(), sizeof(kind));
  *kind_out = kind;
  if (roll_heard_us_.size() != static_cast<size_t>(size_)) roll_heard_us_.assign(size_, 0);
  if (peer >= 0 && peer < size_) roll_heard_us_[peer] = now_us;
  return true;
}

void Engine::AnswerRollCall(int64_t now_us) {
  if (now_us - last_roll_probe_us_ < 1000) return;  // cheap: ~1 probe per ms
  last_roll_probe_us_ = now_us;
  int peer, kind;
  while (TakeRollReport(now_us, &peer, &kind)) {
    if (kind == kRollFailed) SendControl(peer, kTagRollCall, Encode(kRollAlive));
  }
}

std::string Engine::RollCall(std::vector<bool>* heard_out) {
  const int64_t start = NowMicros();
  if (roll_heard_us_.size() != static_cast<size_t>(size_)) roll_heard_us_.assign(size_, 0);
  const std::string report = Encode(kRollFailed);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) SendControl(r, kTagRollCall, report);
  const int64_t window = RollCallWindowUs();
  // Reports that arrived while this rank still ran count if they are recent.
  auto heard = [&](int r) { return roll_heard_us_[r] > start - 2 * window; };
  auto all_heard = [&] {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !heard(r)) return false;
    return true;
  };
  while (NowMicros() - start < window && !all_heard()) {
    int peer, kind;
    bool got = false;
    while (TakeRollReport(NowMicros(), &peer, &kind)) got = true;
    transport_->Progress();
    FinishControlSends(0);
    if (!got) SleepMicros(200);
  }
  if (heard_out) {
    heard_out->assign(size_, false);
    for (int r = 0; r < size_; ++r) (*heard_out)[r] = r != rank_ && heard(r);
  }
  std::string lost, alive;
  int n_lost = 0, n_alive = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    std::string& list = heard(r) ? alive : lost;
    if (!list.empty()) list += ", ";
    if (heard(r)) {
      list += std::to_string(r);
      ++n_alive;
    } else {
      list += DescribeRank(topology_, r);
      ++n_lost;
    }
  }
  const std::string secs = std::to_string((NowMicros() - start) / 100000 / 10.0).substr(0, 3);
  if (n_lost == 0)
    return "; every other rank answered a roll call within " + secs +
           " s, so none is lost: they are all waiting on each other";
  return "; lost: " + lost + " (no answer to a roll call within " + secs + " s" +
         (alive.empty() ? "" : (n_alive == 1 ? "; rank " : "; ranks ") + alive + " answered") + ")";
}

}  // namespace kerasdist
