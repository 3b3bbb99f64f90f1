#include "algorithms/allreduce_hierarchical.h"

#include <algorithm>
#include <map>

namespace kerasdist {

GroupTransport::GroupTransport(Transport* parent, std::vector<int> ranks)
    : parent_(parent), ranks_(std::move(ranks)) {
  me_ = static_cast<int>(std::find(ranks_.begin(), ranks_.end(), parent_->rank()) -
                         ranks_.begin());
}

std::unique_ptr<Transfer> GroupTransport::Isend(int peer, int tag, const void* buf,
                                                size_t bytes) {
  return parent_->Isend(ranks_[peer], tag, buf, bytes);
}

std::unique_ptr<Transfer> GroupTransport::Irecv(int peer, int tag, void* buf,
                                                size_t bytes) {
  return parent_->Irecv(ranks_[peer], tag, buf, bytes);
}

bool GroupTransport::CanRecvReduce(int peer) const {
  return parent_->CanRecvReduce(ranks_[peer]);
}

std::unique_ptr<Transfer> GroupTransport::IrecvReduce(int peer, int tag, void* dest,
                                                      size_t bytes, DataType dtype,
                                                      ReduceOp op, const void* first) {
  return parent_->IrecvReduce(ranks_[peer], tag, dest, bytes, dtype, op, first);
}

bool UseHierarchical(int setting, const Topology& t) {
  return setting != 0 && t.homogeneous && t.local_size > 1 && t.size > t.local_size;
}

std::vector<int> CrossRanks(const Topology& t) {
  std::map<std::string, int> seen;  // host -> ranks seen so far on it
  std::vector<int> out;
  for (int r = 0; r < t.size; ++r)
    if (seen[t.hosts[r]]++ == t.local_rank) out.push_back(r);
  return out;
}

Status HierarchicalAllreduce(GroupTransport* local, GroupTransport* cross,
                             void* buf, size_t count, DataType dtype, ReduceOp op,
                             const CollectiveOptions& options,
                             std::vector<char>* scratch, RingTimes* times) {
  if (times) times->start = NowMicros();
  RingTimes unused;
  Status s = RingAllreducePhases(local, buf, count, dtype, op, options, scratch,
                                 &unused, /*reduce_scatter=*/true, /*allgather=*/false);
  if (!s.ok()) return s;
  size_t offset, elems;
  RingChunk(count, local->size(), RingOwnedChunk(local->rank(), local->size()), &offset,
            &elems);
  char* chunk = static_cast<char*>(buf) + offset * DataTypeSize(dtype);
  s = RingAllreduce(cross, chunk, elems, dtype, op, options, scratch, &unused);
  if (!s.ok()) return s;
  if (times) times->reduce_scatter_end = NowMicros();
  s = RingAllreducePhases(local, buf, count, dtype, op, options, scratch, &unused,
                          /*reduce_scatter=*/false, /*allgather=*/true);
  if (times) times->end = NowMicros();
  return s;
}

}  // namespace kerasdist
