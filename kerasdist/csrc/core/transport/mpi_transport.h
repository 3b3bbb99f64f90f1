// Transport over MPI point-to-point on a private duplicate of a communicator.
//
// mpi4py owns MPI_Init/MPI_Finalize. The engine duplicates the communicator it
// is given (non-blocking, with a bound, so a rank that never calls init()
// cannot hang the others) and only the engine thread uses the duplicate.
#pragma once

#include <mpi.h>

#include <vector>

#include "transport/transport.h"

namespace kerasdist {

class MpiTransfer;

class MpiTransport : public Transport {
 public:
  // Duplicates `comm`. Fails with kTimeout if the other ranks do not join
  // within `timeout_ms`.
  static Status Create(MPI_Comm comm, int64_t timeout_ms,
                       std::unique_ptr<MpiTransport>* out);
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Transfer> Isend(int peer, int tag, const void* buf,
                                  size_t bytes) override;
  std::unique_ptr<Transfer> Irecv(int peer, int tag, void* buf,
                                  size_t bytes) override;
  bool Probe(int tag, int* peer, size_t* bytes) override;
  Status RecvProbed(int peer, int tag, void* buf, size_t bytes) override;
  std::string Name() const override;
  void Progress() override;
  bool Unsafe() const override { return !zombies_.empty(); }
  // Gathers `bytes` from every rank into `all` (rank order), bounded. Only
  // for setup, before the engine thread starts.
  Status Allgather(const void* mine, size_t bytes, void* all, int64_t timeout_ms);

 private:
  friend class MpiTransfer;
  explicit MpiTransport(MPI_Comm comm);
  std::unique_ptr<Transfer> Post(int peer, int tag, char* buf, size_t bytes,
                                 bool is_send);
  void Forget(MpiTransfer* t);
  int64_t CancelDeadline();
  int64_t cancel_deadline_us_ = 0;
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<MpiTransfer*> live_;       // transfers not yet complete
  std::vector<MPI_Request> zombies_;     // cancellations MPI did not confirm
};

}  // namespace kerasdist
