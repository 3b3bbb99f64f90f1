#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "reduce.h"

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace kerasdist {

namespace {

const char kJoinName[] = "__kerasdist_join__";

}  // namespace

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
    RequestEntry e;
    auto hit = cache_.find(r.name);
    if (hit != cache_.end() && hit->second.second == r.meta) {
      e.id = hit->second.first;
    } else {
      e.name = r.name;
      e.meta = r.meta;
    }
    if (r.meta.type == OpType::kJoin) joined_ = true;
    mine->entries.push_back(std::move(e));
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
        std::string wire(bytes, '\0');
        RequestList theirs;
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
      if (plan.empty() && coordinator_->HasPending()) {
        for (int w = 1; w < size_; ++w) {
          const int64_t silent = now - last_heard[w];
          if (silent > LivenessBoundUs()) {
            plan.abort = true;
            plan.message = DescribeRank(topology_, w) + " has not answered rank 0 for " +
                           std::to_string(silent / 1000000) +
                           " s while collectives wait for it: it has stopped or lost its "
                           "connection (bound: KERASDIST_TIMEOUT_SECONDS)";
            break;
          }
        }
      }
      if (!plan.empty() || now - last_sent_us > kHeartbeatUs) {
        // An empty list is the heartbeat that tells workers rank 0 is alive.
        if (!plan.empty()) progressed = true;
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
    if (!running) break;
    AnswerRollCall(NowMicros());
    if (progressed) {
      idle_since = NowMicros();
      backoff_us = 0;
      continue;
    }
    const bool busy = !inflight_.empty() || shutdown_sent ||
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
                   [this] { return !queue_.empty() || shutdown_requested_; });
    }
  }
}

void Engine::FailAll(const Status& status) {
  std::vector<Request> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(queue_);
    final_status_ = status;
    stopped_ = true;
  }
  for (auto& kv : inflight_) Finish(kv.second, status);
  inflight_.clear();
  for (auto& r : rest) Finish(r, status);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

bool Engine::ResponseFits(const Response& resp) const {
  for (int32_t id : resp.ids)
    if (static_cast<size_t>(id) >= id_names_.size() || id_names_[id].empty()) return false;
  if (!resp.error.empty()) return true;  // nothing runs, the requests fail
  if (resp.type == OpType::kAllgather)
    return resp.rank_dim0.size() == static_cast<size_t>(size_) && resp.ids.size() == 1;
  if (resp.type == OpType::kBroadcast)
    return resp.ids.size() == 1 && resp.root >= 0 && resp.root < size_;
  if (resp.type == OpType::kReducescatter) return resp.splits.size() == resp.ids.size();
  if (resp.type == OpType::kAlltoall)
    return resp.ids.size() == 1 && resp.splits.size() == static_cast<size_t>(size_) * size_;
  return true;
}

bool Engine::Execute(const ResponseList& list, Status* exit_status) {
  if (!list.empty()) ++lists_run_;
  for (const auto& p : list.new_ids) {
    if (static_cast<size_t>(p.first) >= id_names_.size()) id_names_.resize(p.first + 1);
    id_names_[p.first] = p.second;
  }
  for (const Response& resp : list.responses) {
    const int64_t start = NowMicros();
    std::vector<Request*> reqs;
    if (resp.type == OpType::kJoin) {
      auto it = inflight_.find(kJoinName);
      if (it != inflight_.end()) {
        if (it->second.join_result) *it->second.join_result = resp.root;
        Finish(it->second, Status::OK());
        inflight_.erase(it);
      }
      joined_ = false;
      continue;
    }
    if (!ResponseFits(resp)) {
      *exit_status = Status(StatusCode::kAborted,
                            Prefix() + "corrupt response from rank 0 (unknown tensor id or "
                                       "wrong per-rank sizes); stopping");
      return false;
    }
    for (int32_t id : resp.ids) {
      auto it = inflight_.find(id_names_[id]);
      reqs.push_back(it == inflight_.end() ? nullptr : &it->second);
      if (!reqs.back() && !joined_) {
        *exit_status = Status(StatusCode::kInternal,
                              Prefix() + "internal error: response for unknown tensor '" +
                                  id_names_[id] + "'");
        return false;
      }
      if (reqs.back() && timeline_.enabled())
        timeline_.Event(it->second.name, kRowNegotiation, it->second.enqueue_us,
                        start, OpTypeName(resp.type), "op");
    }
    Status s;
    if (!resp.error.empty()) {
      s = Status(StatusCode::kMismatch, Prefix() + resp.error);
    } else {
      s = RunResponse(resp, reqs);
      if (!s.ok()) {
        // A failed transfer leaves the ranks out of step: stop the engine.
        // The peer it names may be healthy and waiting further round the
        // ring: the roll call finds the ranks that are really lost.
        *exit_status = Status(s.code() == StatusCode::kTimeout ? StatusCode::kTimeout
                                                               : StatusCode::kAborted,
                              Prefix() + s.message() + " in " + OpTypeName(resp.type) +
                                  " '" + JoinNames(reqs) + "'" + RollCall());
        return false;
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      Request* r = reqs[i];
      if (!r) {
        // Joined: rank 0 may now cache a description under this id that this
        // rank never saw; drop ours, so its next use sends the description.
        auto it = cache_.find(id_names_[resp.ids[i]]);
        if (it != cache_.end() && it->second.first == resp.ids[i]) cache_.erase(it);
        continue;
      }
      if (s.ok() && !IsPerRankMeta(r->meta.type) && !IsTransientName(r->name))
        cache_[r->name] = {resp.ids[i], r->meta};
      Finish(*r, s);
      inflight_.erase(r->name);
    }
  }
  for (int32_t id : list.evicted) {
    if (static_cast<size_t>(id) >= id_names_.size()) continue;
    auto it = cache_.find(id_names_[id]);
    if (it != cache_.end() && it->second.first == id) cache_.erase(it);
    id_names_[id].clear();
  }
  cache_entries_.store(cache_.size());
  if (list.abort) {
    std::fprintf(stderr, "[kerasdist] ERROR: %s%s\n", Prefix().c_str(), list.message.c_str());
    *exit_status = Status(StatusCode::kAborted, Prefix() + list.message);
    return false;
  }
  if (list.shutdown) {
    *exit_status = Status(StatusCode::kShutdown,
                          Prefix() + "kerasdist has been shut down (" + list.message +
                              "); call kerasdist.init() again to run collectives");
    return false;
  }
  return true;
}

}  // namespace kerasdist
