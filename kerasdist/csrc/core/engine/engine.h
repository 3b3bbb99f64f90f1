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

#include "algorithms/collectives.h"
#include "coordinator/coordinator.h"
#include "wire/message.h"
#include "transport/topology.h"
#include "common/timeline.h"
#include "transport/transport.h"

namespace kerasdist {

class GroupTransport;  // algorithms/allreduce_hierarchical.h

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
  // collective to finish on its own thread (0: neither spins). -1 chooses
  // by topology: kHostSpinUs when every rank runs on this host, where a
  // small collective finishes within it, else 0 (a collective across hosts
  // takes longer than any useful spin, and a spin there took 10-30% of the
  // bandwidth from ranks sharing cores in the 4x1 benchmark).
  int64_t spin_us = -1;
  static constexpr int64_t kHostSpinUs = 30;
  // Allreduces up to this many bytes skip the coordinator once cached, when
  // every rank runs on this host (direct_board.h); 0 turns that off.
  int64_t direct_allreduce_bytes = 65536;
  // The same for a grouped allreduce of one dtype, by its total bytes.
  int64_t direct_group_bytes = 1 << 20;
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
  bool direct_ok = false;  // a single allreduce kernel: may use the direct board
  // Member 0 of a grouped allreduce whose tensors share one dtype: the
  // group's size and total bytes, so that rank 0 can give the whole group
  // one place on the direct board (AnnounceDirect).
  int32_t group_size = 0;
  int64_t group_bytes = 0;
  // A grouped allreduce of one dtype run on the direct board as one request
  // (its own input and output stay unset; meta.shape is its total element
  // count): each tensor's buffers and element count, in order, a hash of
  // all their shapes (MixShape), and how to make the tensors' own requests
  // if the group must go through the engine instead.
  struct Part {
    const void* input;
    void* output;
    size_t count;
  };
  std::vector<Part> parts;
  uint64_t shapes_hash = 0;
  std::function<std::vector<Request>()> expand;
  // A grouped allreduce whose tensors do not share a dtype. It never runs
  // on the board, but where its name has a place there it posts a mark
  // (no data) for the round, so that ranks which sent one dtype fail with a
  // mismatch rather than wait for it; if every rank sent such a group, every
  // rank runs the round through the engine (`expand`).
  bool mixed_dtypes = false;
};

// Folds a shape into a hash (FNV-1a over its rank and dimensions); start
// from kShapeHashSeed.
constexpr uint64_t kShapeHashSeed = 1469598103934665603ULL;
inline uint64_t MixShape(uint64_t h, const int64_t* dims, size_t ndim) {
  h = (h ^ ndim) * 1099511628211ULL;
  for (size_t i = 0; i < ndim; ++i) h = (h ^ static_cast<uint64_t>(dims[i])) * 1099511628211ULL;
  return h;
}

// One execution of an allreduce on the direct board (direct_board.h).
struct DirectOp {
  int slot = -1;
  size_t offset = 0, capacity = 0;  // the slot's place in the board's arena
  uint64_t round = 0;
  Request request;
  int64_t start_us = 0;
  bool warned = false;  // the stall warning was printed
  int64_t checked_us = 0;  // when the engine last checked on the missing ranks
};

class DirectBoard;

// "a,b,c" (shortened past 512 characters), for messages and the timeline.
std::string JoinNames(const std::vector<Request*>& reqs);

class Engine {
 public:
  Engine(std::unique_ptr<Transport> transport, const EngineConfig& config,
         const Topology& topology);
  ~Engine();
  // Before Start(): the board this engine's small allreduces may use.
  void SetBoard(std::unique_ptr<DirectBoard> board);
  void Start();
  // Kernels: runs a single allreduce, or a grouped one (`parts` set), on
  // the direct board if its name has a slot there. Returns false, leaving *request untouched, if not (enqueue
  // it). Otherwise its `done` runs exactly once: on this thread if every
  // rank posts within the spin, else on the engine thread.
  bool TryDirect(Request* request);
  // Allreduces completed on the direct board so far (a hint, for tests).
  uint64_t direct_ops() const { return direct_ops_.load(std::memory_order_relaxed); }
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
  // Rank 0: workers silent past the liveness bound while collectives wait:
  // a roll call, then `plan` aborts naming the lost ones.
  void SilentWorkers(int64_t now, const std::vector<int64_t>& last_heard, ResponseList* plan);
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
  // The direct board (engine.cc): finish a posted op if every rank posted;
  // poll the ops handed to the engine thread (false: stop, *exit_status
  // says why); rank 0 gives slots to small cached allreduces in `plan`.
  bool FinishDirect(DirectOp* op);
  bool PollDirect(Status* exit_status, bool* progressed);
  // Why a direct op that still waits must stop everyone, or "" (engine_direct.cc).
  std::string DirectVerdict(DirectOp* op, int64_t now);
  void AnnounceDirect(ResponseList* plan);
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
  std::vector<DirectOp> direct_pending_;  // handed to the engine thread
  bool shutdown_requested_ = false;
  bool stopped_ = false;
  std::atomic<bool> closing_{false};  // either of the two above, read without mu_
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
  std::unique_ptr<DirectBoard> board_;
  int next_direct_slot_ = 0;        // rank 0: slots announced
  size_t direct_planned_bytes_ = 0;  // rank 0: arena bytes announced
  std::atomic<int> direct_waiting_{0};  // size of direct_pending_
  std::atomic<uint64_t> direct_ops_{0};
  bool finished_ = false;  // engine thread: a request completed this cycle
  void Finish(Request& r, const Status& s);  // engine.cc
};

}  // namespace kerasdist
