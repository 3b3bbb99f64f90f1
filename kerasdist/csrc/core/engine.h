// The engine: one background thread per process that owns all
// communication.
//
// Framework threads call Enqueue() with named collectives, in any order. The
// engine thread sends what became ready here to the coordinator (rank 0),
// which answers every rank with the same ordered list of responses once a
// tensor has been submitted everywhere. Each rank then runs the collectives
// in that order and calls each request's `done` with a Status. Because the
// order is agreed, framework ops may be issued in different orders on
// different ranks without deadlock or mismatched messages.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collectives.h"
#include "coordinator.h"
#include "hierarchical.h"
#include "message.h"
#include "setup_exchange.h"
#include "timeline.h"
#include "transport.h"

namespace kerasdist {

struct EngineConfig {
  CoordinatorOptions coordinator;
  CollectiveOptions collective;
  std::string timeline_path;  // empty: no timeline (only rank 0 writes one)
  bool shared_memory = true;  // ring links within a host over /dev/shm
  std::string version;        // the package version, agreed at init()
  // Allreduce algorithm across hosts: -1 chooses by topology (hierarchical
  // when several hosts each run several ranks), 0 the flat ring, 1
  // hierarchical where the topology allows it.
  int hierarchical = -1;
  std::string label;  // prefixes this engine's messages (a process set's)
  // How long the engine thread polls for new requests after its last
  // activity before it sleeps, and how long a kernel waits for its
  // collective to finish on its own thread (0: neither spins).
  int64_t spin_us = 30;
};

// Allocates the output once its shape is known (allgather), on the engine
// thread. Sets *data to the output buffer.
using AllocateFn =
    std::function<Status(const std::vector<int64_t>& shape, void** data)>;
using DoneFn = std::function<void(const Status&)>;

struct Request {
  std::string name;
  TensorMeta meta;
  const void* input = nullptr;
  void* output = nullptr;      // allreduce, broadcast: same size as input;
                               // reducescatter: this rank's rows
  AllocateFn allocate;         // allgather, alltoall
  int32_t* join_result = nullptr;  // join: receives the last rank to join
  int32_t* received_splits = nullptr;  // alltoall: rows from each rank (size())
  DoneFn done;
  int64_t enqueue_us = 0;
};

// "a,b,c" (shortened past 512 characters), for messages and the timeline.
std::string JoinNames(const std::vector<Request*>& reqs);

class Engine {
 public:
  Engine(std::unique_ptr<Transport> transport, const EngineConfig& config,
         const Topology& topology);
  ~Engine();
  void Start();
  // Thread-safe. If the engine has stopped, `done` runs at once with the
  // reason it stopped.
  void Enqueue(Request request);
  // Enqueues several requests at once, so that the engine sees them in the
  // same cycle and can fuse them. Same contract as Enqueue().
  void EnqueueBatch(std::vector<Request> requests);
  // Asks every rank to shut down and waits, bounded, for this engine thread.
  // Returns false if the thread had to be left behind: the Engine must then
  // never be destroyed.
  bool Shutdown();
  // True once the engine has stopped for any reason but a normal shutdown.
  bool Failed();
  int rank() const { return rank_; }
  bool hierarchical() const { return local_ != nullptr; }
  // Names in this rank's response cache (read while the engine runs: a
  // snapshot for tests and diagnostics).
  size_t cache_entries() const { return cache_entries_.load(); }
  int size() const { return size_; }
  // Requests enqueued and not yet completed (any thread; a hint).
  int open() const { return open_.load(std::memory_order_relaxed); }
  int64_t spin_us() const { return config_.spin_us; }

 private:
  void Loop();
  void RunLoop(Status* exit_status);
  void AbandonBuffers();
  void FinishShutdown(Status* exit_status);
  int64_t LivenessBoundUs() const;
  // Ranks tell each other they are alive at least this often.
  static constexpr int64_t kHeartbeatUs = 1000000;
  void EnqueueMany(Request* requests, size_t n);  // moves from requests
  void TakeNewRequests(RequestList* mine, bool* progressed);
  bool Execute(const ResponseList& list, Status* exit_status);
  bool ResponseFits(const Response& resp) const;
  Status RunResponse(const Response& resp, std::vector<Request*>& reqs);
  Status RunAllreduce(const Response& resp, std::vector<Request*>& reqs);
  Status RunAllgather(const Response& resp, Request* req);
  Status RunBroadcast(const Response& resp, Request* req);
  Status RunReducescatter(const Response& resp, std::vector<Request*>& reqs);  // engine_scatter.cc
  Status RunAlltoall(const Response& resp, Request* req);                      // engine_scatter.cc
  void SendControl(int peer, int tag, std::string bytes);
  void FinishControlSends(int64_t timeout_ms);
  void FailAll(const Status& status);
  // engine_rollcall.cc: after a failed transfer, asks every rank who is
  // alive (bounded) and returns the text naming the lost ranks.
  std::string RollCall(std::vector<bool>* heard_out = nullptr);
  void AnswerRollCall(int64_t now_us);
  bool TakeRollReport(int64_t now_us, int* peer, int* kind);
  int64_t RollCallWindowUs() const;
  std::string Prefix() const;

  std::unique_ptr<Transport> transport_;
  EngineConfig config_;
  Topology topology_;
  const int rank_;
  const int size_;
  std::thread thread_;

  // Shared with framework threads, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Request> queue_;
  bool shutdown_requested_ = false;
  bool stopped_ = false;
  bool detached_ = false;
  Status final_status_;

  // Engine-thread state.
  std::unordered_map<std::string, Request> inflight_;
  std::unordered_map<std::string, std::pair<int32_t, TensorMeta>> cache_;
  std::vector<std::string> id_names_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<GroupTransport> local_, cross_;  // set: hierarchical allreduce
  std::vector<char> fusion_buffer_;
  std::vector<char> scratch_;
  std::vector<std::pair<std::shared_ptr<std::string>, std::unique_ptr<Transfer>>>
      control_sends_;
  Timeline timeline_;
  bool joined_ = false;
  std::vector<int64_t> roll_heard_us_;  // when each rank last reported
  int64_t last_roll_probe_us_ = 0;
  uint64_t lists_run_ = 0;  // response lists with content executed
  std::atomic<size_t> cache_entries_{0};
  std::atomic<int> open_{0};
  void Finish(Request& r, const Status& s) {
    open_.fetch_sub(1, std::memory_order_relaxed);
    r.done(s);
  }
};

}  // namespace kerasdist
