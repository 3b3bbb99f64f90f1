#include "engine/engine.h"

#include "algorithms/allreduce_hierarchical.h"

#include "engine/direct_board.h"

#include <algorithm>
#include <chrono>

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace kerasdist {

Engine::Engine(std::unique_ptr<Transport> transport, const EngineConfig& config,
               const Topology& topology)
    : transport_(std::move(transport)),
      config_(config),
      topology_(topology),
      rank_(transport_->rank()),
      size_(transport_->size()) {
  if (rank_ == 0) coordinator_ = std::make_unique<Coordinator>(size_, config_.coordinator);
  if (UseHierarchical(config_.hierarchical, topology_)) {
    local_ = std::make_unique<GroupTransport>(transport_.get(), topology_.local_ranks);
    cross_ = std::make_unique<GroupTransport>(transport_.get(), CrossRanks(topology_));
  } else if (config_.hierarchical == 1 && rank_ == 0) {
    std::fprintf(stderr,
                 "[kerasdist] WARNING: KERASDIST_HIERARCHICAL_ALLREDUCE=1, but the ranks do not "
                 "form several hosts with the same number of ranks each; using the flat "
                 "ring.\n");
  }
  if (rank_ == 0 && !config_.timeline_path.empty()) {
    if (!timeline_.Open(config_.timeline_path, rank_)) {
      std::fprintf(stderr, "[kerasdist] WARNING: cannot open timeline file '%s'\n",
                   config_.timeline_path.c_str());
    }
  }
}

Engine::~Engine() { Shutdown(); }

void Engine::Start() { thread_ = std::thread([this] { Loop(); }); }

bool Engine::Failed() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_ && final_status_.code() != StatusCode::kShutdown;
}

std::string Engine::Prefix() const {
  return config_.label + "rank " + std::to_string(rank_) + "/" + std::to_string(size_) + ": ";
}

void Engine::Finish(Request& r, const Status& s) {
  open_.fetch_sub(1, std::memory_order_relaxed);
  finished_ = true;  // the board hears of it once per cycle (RunLoop)
  r.done(s);
}

void Engine::Enqueue(Request request) { EnqueueMany(&request, 1); }

void Engine::EnqueueBatch(std::vector<Request> requests) {
  EnqueueMany(requests.data(), requests.size());
}

void Engine::EnqueueMany(Request* requests, size_t n) {
  const int64_t now = NowMicros();
  Status stopped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_ && !shutdown_requested_) {
      for (size_t i = 0; i < n; ++i) {
        requests[i].enqueue_us = now;
        queue_.push_back(std::move(requests[i]));
      }
      open_.fetch_add(static_cast<int>(n), std::memory_order_relaxed);
      cv_.notify_one();
      return;
    }
    stopped = stopped_ ? final_status_
                       : Status(StatusCode::kShutdown,
                                Prefix() + "kerasdist is shutting down");
  }
  for (size_t i = 0; i < n; ++i) requests[i].done(stopped);
}

bool Engine::Shutdown() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (detached_) return false;
    if (!thread_.joinable()) return true;
    shutdown_requested_ = true;
    closing_.store(true, std::memory_order_release);
    cv_.notify_one();
    // Bounded: the loop itself gives up after the collective timeout.
    const auto bound = std::chrono::milliseconds(
        config_.collective.timeout_ms + 10000);
    if (!cv_.wait_for(lock, bound, [this] { return stopped_; })) {
      std::fprintf(stderr,
                   "[kerasdist] WARNING: %sengine thread did not stop within "
                   "%lld ms; leaving it behind\n",
                   Prefix().c_str(), static_cast<long long>(bound.count()));
      thread_.detach();
      detached_ = true;
      return false;
    }
  }
  thread_.join();
  return true;
}

void Engine::TakeNewRequests(RequestList* mine, bool* progressed) {
  std::vector<Request> fresh;
  bool want_shutdown;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(queue_);
    want_shutdown = shutdown_requested_;
  }
  for (Request& r : fresh) {
    *progressed = true;
    if (inflight_.count(r.name)) {
      Finish(r, Status(StatusCode::kInvalidArgument,
                    Prefix() + "a collective named '" + r.name +
                        "' is already in flight on this rank. Names of "
                        "concurrent collectives must be unique."));
      continue;
    }
    auto hit = cache_.find(r.name);
    if (hit != cache_.end() && hit->second.second == r.meta) {
      mine->AddId(hit->second.first);
    } else {
      mine->AddNamed(r.name, r.meta);
    }
    if (r.meta.type == OpType::kJoin) joined_ = true;
    inflight_.emplace(r.name, std::move(r));
  }
  mine->shutdown = want_shutdown;
}

void Engine::SendControl(int peer, int tag, std::string bytes) {
  auto buf = std::make_shared<std::string>(std::move(bytes));
  auto t = transport_->Isend(peer, tag, buf->data(), buf->size());
  control_sends_.emplace_back(std::move(buf), std::move(t));
}

void Engine::FinishControlSends(int64_t timeout_ms) {
  for (auto& cs : control_sends_) {
    if (timeout_ms > 0) WaitTransfer(cs.second.get(), timeout_ms);
  }
  if (timeout_ms > 0) control_sends_.clear();
  // Without a timeout: drop only the completed ones.
  control_sends_.erase(
      std::remove_if(control_sends_.begin(), control_sends_.end(),
                     [](auto& cs) { return cs.second->Test(); }),
      control_sends_.end());
}

void Engine::Loop() {
#ifdef __linux__
  // The default 50 us timer slack would round every short poll sleep up to
  // 50 us; the engine's latency is made of such polls.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  // Named so that tools (and benchmarks/keras_synthetic.py, which reads its
  // CPU time from /proc/self/task/*/stat) can find it.
  prctl(PR_SET_NAME, "kd-engine", 0, 0, 0);
#endif
  Status exit_status(StatusCode::kShutdown, Prefix() + "kerasdist has been shut down");
  try {
    RunLoop(&exit_status);
  } catch (const std::exception& e) {
    exit_status = Status(StatusCode::kInternal,
                         Prefix() + "internal error in the engine: " + e.what());
  } catch (...) {
    exit_status = Status(StatusCode::kInternal, Prefix() + "internal error in the engine");
  }
  if (exit_status.code() == StatusCode::kShutdown && size_ > 1) FinishShutdown(&exit_status);
  FinishControlSends(std::min<int64_t>(2000, config_.collective.timeout_ms));
  if (transport_->Unsafe()) AbandonBuffers();
  FailAll(exit_status);
  timeline_.Close();
}

void Engine::FinishShutdown(Status* exit_status) {
  // Every worker acknowledges the shutdown. A rank that does not (frozen, or
  // its host gone) would make MPI_Finalize wait forever, so its silence turns
  // this shutdown into a failure, which bounds the exit (kerasdist_exit_guard).
  if (rank_ != 0) {
    SendControl(0, kTagBye, std::string());
    return;
  }
  std::vector<bool> acked(size_, false);
  int missing = size_ - 1;
  const int64_t deadline = NowMicros() + LivenessBoundUs();
  int64_t sleep_us = 1;
  while (missing > 0 && NowMicros() < deadline) {
    int peer;
    size_t bytes;
    if (transport_->Probe(kTagBye, &peer, &bytes)) {
      char sink[1];
      transport_->RecvProbed(peer, kTagBye, sink, 0);
      if (peer > 0 && peer < size_ && !acked[peer]) {
        acked[peer] = true;
        --missing;
      }
      sleep_us = 1;
      continue;
    }
    FinishControlSends(0);
    SleepMicros(sleep_us);
    sleep_us = std::min<int64_t>(1000, sleep_us * 2);
  }
  if (missing == 0) return;
  std::string who;
  for (int r = 1; r < size_; ++r)
    if (!acked[r]) who += (who.empty() ? "" : ", ") + DescribeRank(topology_, r);
  *exit_status = Status(StatusCode::kAborted,
                        Prefix() + "shut down, but " + who +
                            " did not acknowledge it within " +
                            std::to_string(LivenessBoundUs() / 1000000) +
                            " s: frozen or gone");
  std::fprintf(stderr, "[kerasdist] WARNING: %s\n", exit_status->message().c_str());
}

void Engine::AbandonBuffers() {
  // MPI could not confirm that it let go of a cancelled transfer: it may
  // still write into (or read from) these buffers, so they are never freed.
  new std::vector<char>(std::move(scratch_));
  new std::vector<char>(std::move(fusion_buffer_));
  scratch_.clear();
  fusion_buffer_.clear();
}

void Engine::SilentWorkers(int64_t now, const std::vector<int64_t>& last_heard,
                           ResponseList* plan) {
  std::vector<int> silent;
  int64_t longest = 0;
  for (int w = 1; w < size_; ++w) {
    if (now - last_heard[w] > LivenessBoundUs()) {
      silent.push_back(w);
      longest = std::max(longest, now - last_heard[w]);
    }
  }
  if (silent.empty()) return;
  // A silent worker may be alive and blocked in a collective's transfer on
  // a lost rank further round the ring (it went quiet before its transfer's
  // own bound started): the roll call tells the lost from the blocked, so
  // that the error leads with the lost ones.
  std::vector<bool> heard;
  const std::string roll = RollCall(&heard);
  // Only silent ranks are named here: a rank heard from within the bound
  // that misses the roll call is busy in a transfer (the roll call's own
  // text lists it).
  std::vector<int> lost;
  for (int r : silent)
    if (!heard[r]) lost.push_back(r);
  const std::vector<int>& named = lost.empty() ? silent : lost;
  std::string who;
  for (int r : named) who += (who.empty() ? "" : ", ") + DescribeRank(topology_, r);
  plan->abort = true;
  plan->message = who + (named.size() == 1 ? " has" : " have") + " not answered rank 0 for " +
                  std::to_string(longest / 1000000) + " s while collectives wait" +
                  (lost.empty() ? ", though alive (a roll call): blocked on each other"
                                : ": stopped or lost the connection") +
                  " (bound: KERASDIST_TIMEOUT_SECONDS)" + roll;
}

int64_t Engine::LivenessBoundUs() const {
  return std::max<int64_t>(config_.collective.timeout_ms * 1000, 4 * kHeartbeatUs);
}

void Engine::RunLoop(Status* exit_status) {
  bool shutdown_sent = false;
  int64_t shutdown_sent_us = 0;
  int64_t idle_since = NowMicros();
  int64_t backoff_us = 0;
  int64_t last_sent_us = NowMicros();
  const int64_t started_us = NowMicros();
  std::vector<int64_t> last_heard(size_, started_us);  // rank 0: per worker
  int64_t heard_root_us = started_us;                  // workers
  bool running = true;
  std::string wire;     // rank 0: a worker's request, then
  RequestList theirs;   // its decoding (Parse() replaces all of it)
  while (running) {
    bool progressed = false;
    RequestList mine;
    TakeNewRequests(&mine, &progressed);
    mine.seen = lists_run_;
    const bool ask_shutdown = mine.shutdown && !shutdown_sent;
    mine.shutdown = ask_shutdown;
    if (ask_shutdown) {
      shutdown_sent = true;
      shutdown_sent_us = NowMicros();
      progressed = true;
    }
    const int64_t now = NowMicros();
    if (rank_ == 0) {
      coordinator_->Submit(0, mine);
      int peer;
      size_t bytes;
      while (transport_->Probe(kTagRequest, &peer, &bytes)) {
        // Reused across messages: constructing a list's entries afresh for
        // every worker was most of rank 0's decoding time at scale.
        wire.resize(bytes);
        Status s = transport_->RecvProbed(peer, kTagRequest, &wire[0], bytes);
        if (s.ok() && !Parse(wire, &theirs))
          s = Status(StatusCode::kInternal, "corrupt request from rank " + std::to_string(peer));
        if (!s.ok()) {
          *exit_status = Status(StatusCode::kAborted, Prefix() + s.message());
          running = false;
          break;
        }
        last_heard[peer] = NowMicros();
        coordinator_->Submit(peer, theirs);
        if (!theirs.entries.empty() || theirs.shutdown) progressed = true;
      }
      if (!running) break;
      ResponseList plan = coordinator_->Plan(NowMicros());
      // A worker that stopped talking (frozen, or its host gone) while
      // others wait on it: stop everyone, naming it.
      if (plan.empty() && coordinator_->HasPending()) SilentWorkers(now, last_heard, &plan);
      if (!plan.empty() || now - last_sent_us > kHeartbeatUs) {
        // An empty list is the heartbeat that tells workers rank 0 is alive.
        if (!plan.empty()) progressed = true;
        AnnounceDirect(&plan);
        const std::string wire = Serialize(plan);
        for (int w = 1; w < size_; ++w) SendControl(w, kTagResponse, wire);
        last_sent_us = now;
        if (!plan.empty()) running = Execute(plan, exit_status);
      }
    } else {
      if (!mine.entries.empty() || mine.shutdown || now - last_sent_us > kHeartbeatUs) {
        SendControl(0, kTagRequest, Serialize(mine));
        last_sent_us = now;
      }
      int peer;
      size_t bytes;
      while (running && transport_->Probe(kTagResponse, &peer, &bytes)) {
        std::string wire(bytes, '\0');
        ResponseList plan;
        Status s = transport_->RecvProbed(peer, kTagResponse, &wire[0], bytes);
        if (s.ok() && !Parse(wire, &plan))
          s = Status(StatusCode::kInternal, "corrupt response from rank 0");
        if (!s.ok()) {
          *exit_status = Status(StatusCode::kAborted, Prefix() + s.message());
          running = false;
          break;
        }
        heard_root_us = NowMicros();
        if (plan.empty()) continue;  // heartbeat
        progressed = true;
        running = Execute(plan, exit_status);
      }
      const int64_t silent = NowMicros() - heard_root_us;
      if (running && (!inflight_.empty() || shutdown_sent) && silent > LivenessBoundUs()) {
        // Rank 0 may be alive but blocked on a lost rank (its own transfer
        // waits the same bound): the roll call tells which ranks are gone.
        std::vector<bool> heard;
        const std::string roll = RollCall(&heard);
        const bool root_answered = heard[0];
        *exit_status = Status(
            StatusCode::kAborted,
            Prefix() + DescribeRank(topology_, 0) + " (the coordinator) has not answered for " +
                std::to_string(silent / 1000000) + " s while this rank waits on collectives" +
                (root_answered ? ", though it is alive: it is blocked on a lost rank"
                               : ": it has stopped or lost its connection") +
                " (bound: KERASDIST_TIMEOUT_SECONDS)" + roll);
        running = false;
      }
      if (running && shutdown_sent &&
          NowMicros() - shutdown_sent_us > config_.collective.timeout_ms * 1000) {
        *exit_status = Status(StatusCode::kTimeout,
                              Prefix() + "timed out after " +
                                  std::to_string(config_.collective.timeout_ms) +
                                  " ms waiting for rank 0 to acknowledge shutdown");
        running = false;
      }
    }
    FinishControlSends(0);
    if (running && board_) {
      const int64_t beat = NowMicros();
      board_->Beat(beat, open() > 0);
      if (finished_) board_->Progress(beat);
      finished_ = false;
      running = PollDirect(exit_status, &progressed);
      if (!running && rank_ == 0) {
        // Stop the workers now, with the reason, rather than by silence.
        ResponseList stop;
        stop.abort = true;
        stop.message = exit_status->message();
        const std::string wire = Serialize(stop);
        for (int w = 1; w < size_; ++w) SendControl(w, kTagResponse, wire);
      }
      // A joined rank stands in for the rounds the others run on the board.
      if (joined_ && board_->ServeJoined()) progressed = true;
    }
    if (!running) break;
    AnswerRollCall(NowMicros());
    if (progressed) {
      idle_since = NowMicros();
      backoff_us = 0;
      continue;
    }
    const bool busy = !inflight_.empty() || shutdown_sent || direct_waiting_.load() > 0 ||
                      (coordinator_ && coordinator_->HasPending());
    if (busy) {
      // Waiting on other ranks: spin briefly, then poll with short sleeps.
      if (NowMicros() - idle_since < 50) {
        std::this_thread::yield();
      } else {
        backoff_us = std::min<int64_t>(100, backoff_us ? backoff_us * 2 : 2);
        SleepMicros(backoff_us);
      }
    } else if (NowMicros() - idle_since < config_.spin_us) {
      // Just finished: the next request (the next gradient, the next step's
      // first) often follows at once, and a poll beats a wake-up.
      std::this_thread::yield();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(5),
                   [this] {
                     return !queue_.empty() || shutdown_requested_ || !direct_pending_.empty();
                   });
    }
  }
}

void Engine::FailAll(const Status& status) {
  std::vector<Request> rest;
  std::vector<DirectOp> direct;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(queue_);
    direct.swap(direct_pending_);
    final_status_ = status;
    stopped_ = true;
    closing_.store(true, std::memory_order_release);
  }
  for (auto& kv : inflight_) Finish(kv.second, status);
  inflight_.clear();
  for (auto& r : rest) Finish(r, status);
  for (DirectOp& op : direct) {
    std::vector<int> missing;
    board_->Abandon(&op, &missing);
    direct_waiting_.fetch_sub(1, std::memory_order_relaxed);
    Finish(op.request, status);
  }
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

}  // namespace kerasdist
