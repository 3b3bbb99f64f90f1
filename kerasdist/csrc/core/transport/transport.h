// Point-to-point transport used by the collective algorithms.
//
// Vocabulary: a *transfer* is one in-flight send or receive of a contiguous
// byte range with one peer. Transfers between a pair of ranks with the same
// tag are matched in posting order (MPI's non-overtaking rule), so both sides
// must post the same sequence of sizes. Algorithms only see this interface;
// they never touch the transport's internals.
//
// Thread contract: one thread (the engine thread) calls every method.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/common.h"

namespace kerasdist {

// Tags separate the control plane from the data plane.
enum Tag : int {
  kTagRequest = 1,   // worker -> coordinator request lists
  kTagResponse = 2,  // coordinator -> worker response lists
  kTagData = 3,      // collective payloads
  kTagBye = 4,       // worker -> coordinator: shutdown acknowledged
  kTagRollCall = 5,  // after a failed transfer: who is still alive
};

class Transfer {
 public:
  Transfer(int peer, size_t bytes, bool is_send)
      : peer_(peer), bytes_(bytes), is_send_(is_send) {}
  virtual ~Transfer() = default;
  // Drives progress; returns true once the transfer has completed.
  virtual bool Test() = 0;
  // Cancellation after a failure. Returns true once the transport no longer
  // touches the buffer; false if it may still read or write it (the caller
  // must then keep the buffer alive: see Transport::Unsafe()).
  virtual bool Cancel() = 0;
  // After Test() returned true: whether the transfer succeeded.
  virtual Status status() const { return Status::OK(); }
  int peer() const { return peer_; }
  size_t bytes() const { return bytes_; }
  bool is_send() const { return is_send_; }

 private:
  int peer_;
  size_t bytes_;
  bool is_send_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::unique_ptr<Transfer> Isend(int peer, int tag, const void* buf,
                                          size_t bytes) = 0;
  virtual std::unique_ptr<Transfer> Irecv(int peer, int tag, void* buf,
                                          size_t bytes) = 0;
  // Whether IrecvReduce() is available for data from `peer`.
  virtual bool CanRecvReduce(int peer) const { return false; }
  // Receives `bytes` from `peer` and reduces them into `dest` as they arrive
  // (dest[i] = op(first[i], incoming[i]), `first` defaulting to `dest`), with
  // no intermediate buffer. Only valid when CanRecvReduce(peer).
  virtual std::unique_ptr<Transfer> IrecvReduce(int peer, int tag, void* dest,
                                                size_t bytes, DataType dtype,
                                                ReduceOp op, const void* first = nullptr) {
    return nullptr;
  }
  // Non-blocking probe for a message with `tag` from any peer. On success
  // sets *peer and *bytes and returns true.
  virtual bool Probe(int tag, int* peer, size_t* bytes) = 0;
  // Receives a message that Probe reported (it has already arrived).
  virtual Status RecvProbed(int peer, int tag, void* buf, size_t bytes) = 0;
  virtual std::string Name() const = 0;
  // Advances every pending transfer of this transport, on every link. A rank
  // that waits on one link must keep its other links moving, or a ring whose
  // links use different transports (shared memory within a host, MPI between
  // hosts) stalls once one of them has filled its window.
  virtual void Progress() {}
  // True after a cancellation could not be confirmed: some buffer may still
  // be read or written by the transport, so the engine must not hand it back.
  virtual bool Unsafe() const { return false; }
};

// Waits for `t` with a bound. Spins briefly, then backs off with short
// sleeps. On timeout cancels the transfer and returns kTimeout with a message
// such as "timed out after 60000 ms receiving 4194304 bytes from rank 0".
Status WaitTransfer(Transfer* t, int64_t timeout_ms);

// Waits for every transfer in order, each with the bound above; on the first
// failure cancels the rest and returns that failure. Empties the vector on
// success.
Status WaitTransfers(std::vector<std::unique_ptr<Transfer>>* transfers, int64_t timeout_ms);

// Monotonic clock in microseconds.
int64_t NowMicros();

// Sleeps for `us` microseconds; used by the polling loops.
void SleepMicros(int64_t us);

}  // namespace kerasdist
