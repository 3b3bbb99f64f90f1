// Small allreduces with no round trip through the coordinator.
//
// When every rank runs on one host, the ranks share one "board" in
// /dev/shm. Once rank 0 has seen a small allreduce complete through the
// coordinator with every rank taking part, it gives the tensor's name a
// slot, announced in the ordered response stream, so every rank switches
// that name to the board at the same point. From then on each execution is a
// round: a rank posts its input (and a description of it) under the slot and
// the round number, then waits until every rank has posted the same round,
// and reduces all the posts itself, in rank order, so the replicas stay
// bit-identical. No engine thread and no message is involved.
//
// Every rank sees the same posts, so every rank takes the same decision:
//   - descriptions differ (dtype, shape, op, scales): the op fails on every
//     rank with a mismatch error naming what each rank sent;
//   - all agree but the tensor no longer fits the slot: every rank sends
//     that round through the engine instead;
//   - a rank that has joined (hvd.join) posts a "joined" mark for the rounds
//     the others run, and contributes zeros, as it does in the engine. Posts
//     carry the number of joins their rank has completed, so that a rank
//     that has not yet heard that a join is over never stands in for a round
//     that starts after it.
// A grouped allreduce whose tensors share a dtype is one entity on the
// board: one slot for the group, its tensors posted back to back, one round
// per call.
// A rank writes round r + 1 into the other half of the slot from round r,
// and it can only reach round r + 1 once every rank has posted round r, so
// every rank has finished reading round r - 1: two halves suffice.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "transport/mpi_transport.h"
#include "transport/shm_transport.h"

namespace kerasdist {

class DirectBoard {
 public:
  // The posts live in one arena of this many bytes. A name's slot holds,
  // per rank and per half, a post of the size the tensor had when the slot
  // was given (SlotBytes), so that thousands of small tensors fit.
  static constexpr size_t kArenaBytes = size_t{16} << 20;
  static constexpr int kMaxSlots = 1 << 15;

  // Collective over `mpi`'s ranks, which must all run on this host. Sets
  // *out to null (on every rank) when some rank cannot map the board, or
  // `enabled` is false on some rank. Fails only if the exchange times out.
  static Status Create(MpiTransport* mpi, bool enabled, int64_t timeout_ms,
                       std::unique_ptr<DirectBoard>* out);

  // Arena bytes a slot for tensors of up to `capacity` bytes takes.
  size_t SlotBytes(size_t capacity) const;
  // `group`: the slot of a grouped allreduce, named by its first tensor
  // ("<name>.0"); the group's request carries "<name>" (GroupName).
  bool Has(const std::string& name, bool group);
  static std::string GroupName(const std::string& first);
  // Engine thread, in response order on every rank: `name` uses `slot`
  // (the next one: slots are numbered in order), for tensors of up to
  // `capacity` bytes, in place of any slot it had. False if that breaks the
  // order, the arena is full or the old slot is in use (a corrupt stream).
  bool Assign(int slot, const std::string& name, size_t capacity, bool group);

  using Op = DirectOp;  // one execution of a request on the board
  enum class Begun { kNotDirect, kInFlight, kPosted };
  // Kernel threads. kPosted: the request moved into *op and its input is
  // posted. kNotDirect: the request is untouched. A request with `parts`
  // is a grouped allreduce.
  Begun Begin(Request* request, Op* op);
  // Whether every rank has posted op's round. If so, finishes the op: on
  // success the result is in the request's output; *fallback is set when
  // every rank must run this round through the engine. Releases the slot.
  bool Poll(Op* op, Status* status, bool* fallback);
  // Gives up on op's round (timeout, shutdown), releasing the slot. Fills
  // *missing with the ranks that have not posted it.
  void Abandon(Op* op, std::vector<int>* missing);
  // The ranks that have not posted op's round yet.
  std::vector<int> Missing(const Op& op) const;
  // Engine thread of a joined rank: posts "joined" for every round another
  // rank has started and this one has not. Returns true if it posted any.
  bool ServeJoined();
  // Engine thread: every rank has joined; later posts belong to the next join.
  void EndJoin() { epoch_.fetch_add(1, std::memory_order_relaxed); }

  // What each rank's engine tells the others through the board, so that a
  // rank waiting on the board can tell a slow peer (alive, busy elsewhere)
  // from a lost one (silent) and from a deadlock (every rank waits, nothing
  // completes), as the coordinator does for the engine's collectives.
  struct RankState {
    int64_t alive_us = 0;     // the engine thread's last sign of life
    int64_t progress_us = 0;  // the last collective completed
    bool waiting = false;     // some collective is open
  };
  // Engine thread, every cycle (cheap: stores only when changed, or every ms).
  void Beat(int64_t now_us, bool waiting);
  // Any thread: a collective completed.
  void Progress(int64_t now_us);
  RankState State(int rank) const;

 private:
  struct Slot {
    std::string name;
    size_t offset = 0, capacity = 0;  // in the arena; bytes of one post's data
    uint64_t round = 0;  // the last round this rank posted
    bool busy = false;
  };
  DirectBoard() = default;
  // Rank `rank`'s post of `round` in the slot at `offset` (capacity bytes).
  char* Post(size_t offset, size_t capacity, uint64_t round, int rank) const;
  struct SharedState* StateOf(int rank) const;
  void Publish(size_t offset, size_t capacity, uint64_t round,
               const Request* request);  // null: joined

  std::unique_ptr<ShmTransport::Segment> seg_;
  size_t arena_used_ = 0;
  int rank_ = 0, size_ = 1;
  std::atomic<uint32_t> epoch_{0};
  int64_t beat_us_ = 0;  // engine thread: the last alive_us stored
  bool beat_waiting_ = false;
  std::mutex mu_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> by_name_, by_group_;
};

}  // namespace kerasdist
