// Shared-memory data path between ring neighbours on one host.
//
// Every collective moves its payload from a rank to its right neighbour
// (ring allreduce, ring allgather, chain broadcast), on the world ring or, for
// the hierarchical allreduce, on the ring of the ranks of one host. When the
// two share /dev/shm, that link is a single-producer single-consumer queue of
// fixed-size slots in a segment both have mapped: the sender copies each
// fragment into a free slot and publishes it; the receiver copies it out, or
// reduces it straight into the destination (IrecvReduce), and frees the
// slot. Unlike MPI's single-copy path (process_vm_readv), nothing pins pages
// per message, and the reduce reads the incoming data only once.
//
// Control messages, and data to or from any other peer, go over the wrapped
// MpiTransport. Per link, both ends agree at setup whether shared memory
// works; if not, that link stays on MPI.
//
// Progress is driven by polling: Test() on any transfer advances every queued
// send and receive in posting order, so a rank waiting on a receive keeps
// feeding its own sends.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "transport/mpi_transport.h"

namespace kerasdist {

class ShmTransfer;

class ShmTransport : public Transport {
 public:
  // Wraps `mpi`; collective over its ranks. Returns `mpi` itself when no
  // link can use shared memory (a world of one, `enabled` false everywhere,
  // no common /dev/shm). Fails only if the bounded setup exchange times out.
  // `also_right`: another peer this rank sends ring data to (its right
  // neighbour on its host's ring), or -1.
  static Status Create(std::unique_ptr<MpiTransport> mpi, bool enabled,
                       int also_right, int64_t timeout_ms,
                       std::unique_ptr<Transport>* out);
  ~ShmTransport() override;

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  std::unique_ptr<Transfer> Isend(int peer, int tag, const void* buf,
                                  size_t bytes) override;
  std::unique_ptr<Transfer> Irecv(int peer, int tag, void* buf,
                                  size_t bytes) override;
  bool CanRecvReduce(int peer) const override;
  std::unique_ptr<Transfer> IrecvReduce(int peer, int tag, void* dest,
                                        size_t bytes, DataType dtype, ReduceOp op,
                                        const void* first = nullptr) override;
  bool Probe(int tag, int* peer, size_t* bytes) override;
  Status RecvProbed(int peer, int tag, void* buf, size_t bytes) override;
  std::string Name() const override;

  // Moves as much queued data as the slots allow, in both directions, and
  // drives MPI's pending transfers too.
  void Progress() override;
  // Only the shared-memory queues (called from MPI transfers' Test()).
  void ProgressShm();
  bool Unsafe() const override { return mpi_->Unsafe(); }
  // Drops a transfer from the queues (cancelled or destroyed early).
  void Forget(ShmTransfer* t);

  struct Segment {
    void* addr = nullptr;
    size_t bytes = 0;
    ~Segment();
  };

  // One direction of one link: this rank -> peer (out) or peer -> this rank.
  struct Channel {
    int peer = -1;
    std::unique_ptr<Segment> seg;
    uint64_t pos = 0;  // out: fragments published (head); in: consumed (tail)
    std::deque<ShmTransfer*> queue;
    Status broken;     // in: set once the incoming stream is corrupt
  };

 private:
  explicit ShmTransport(std::unique_ptr<MpiTransport> mpi);
  Channel* Find(std::vector<std::unique_ptr<Channel>>& v, int peer) const;
  void PushSends(Channel* c);
  void PullRecvs(Channel* c);

  std::unique_ptr<MpiTransport> mpi_;
  std::vector<std::unique_ptr<Channel>> outs_, ins_;  // at most two each
};

// 64 random bits for segment names and tokens, so that neither can be
// guessed by another user of /dev/shm.
uint64_t RandomBits();

// Creates (O_EXCL, `size` bytes reserved up front) or opens a segment of
// /dev/shm and maps it. Opening checks that it belongs to this user, is
// private to it and has `size` bytes. Null on failure, with the reason in
// *why.
std::unique_ptr<ShmTransport::Segment> MapSharedSegment(const std::string& name, bool create,
                                                        size_t size, std::string* why);

}  // namespace kerasdist
