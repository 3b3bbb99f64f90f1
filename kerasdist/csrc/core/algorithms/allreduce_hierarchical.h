// Hierarchical allreduce for ranks spread over several hosts, as Horovod's
// HOROVOD_HIERARCHICAL_ALLREDUCE and NCCL's trees do it in spirit:
//   1. reduce-scatter within each host (shared memory), so local rank l
//      holds the host's sum of chunk l;
//   2. a ring allreduce of that chunk among the ranks with the same local
//      rank, one per host: each carries 1/local_size of the data between
//      hosts, and every rank of a host sends at once;
//   3. allgather within each host.
// Per allreduce of S bytes on H hosts of L ranks, a host sends 2(H-1)/H * S
// bytes to other hosts, against 2(N-1)/N * S through one rank's link for the
// flat ring; the flat ring also takes 2(N-1) steps, this one 2(L-1)+2(H-1).
#pragma once

#include <vector>

#include "algorithms/collectives.h"
#include "transport/setup_exchange.h"

namespace kerasdist {

// A view of `parent` restricted to `ranks` (world ranks, in ring order):
// rank i of the view is world rank ranks[i]. Data only; control messages
// stay on the parent.
class GroupTransport : public Transport {
 public:
  GroupTransport(Transport* parent, std::vector<int> ranks);
  int rank() const override { return me_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  std::unique_ptr<Transfer> Isend(int peer, int tag, const void* buf,
                                  size_t bytes) override;
  std::unique_ptr<Transfer> Irecv(int peer, int tag, void* buf,
                                  size_t bytes) override;
  bool CanRecvReduce(int peer) const override;
  std::unique_ptr<Transfer> IrecvReduce(int peer, int tag, void* dest,
                                        size_t bytes, DataType dtype, ReduceOp op,
                                        const void* first = nullptr) override;
  bool Probe(int, int*, size_t*) override { return false; }
  Status RecvProbed(int, int, void*, size_t) override {
    return Status(StatusCode::kInternal, "control messages stay on the world transport");
  }
  std::string Name() const override { return parent_->Name(); }
  void Progress() override { parent_->Progress(); }
  bool Unsafe() const override { return parent_->Unsafe(); }

 private:
  Transport* parent_;
  std::vector<int> ranks_;
  int me_ = 0;
};

// Whether allreduces take the hierarchical algorithm, for the setting
// KERASDIST_HIERARCHICAL_ALLREDUCE (-1 auto, 0 off, 1 on): never when off,
// otherwise where the layout allows it (several hosts, several ranks on each,
// the same number on every host). Every rank decides alike: the setting and
// the topology are agreed at init.
bool UseHierarchical(int setting, const Topology& topology);

// The ranks of this rank's host, and the ranks with its local rank, in
// world-rank order.
std::vector<int> CrossRanks(const Topology& topology);

// In-place allreduce of `count` elements over `local` (this host) and
// `cross` (same local rank, other hosts).
Status HierarchicalAllreduce(GroupTransport* local, GroupTransport* cross,
                             void* buf, size_t count, DataType dtype, ReduceOp op,
                             const CollectiveOptions& options,
                             std::vector<char>* scratch, RingTimes* times);

}  // namespace kerasdist
