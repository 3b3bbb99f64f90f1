// Pipelined chain broadcast. Ranks are ordered by distance from the root,
// position p = (rank - root) mod N. Position 0 sends every segment to
// position 1; each middle position forwards a segment as soon as it has
// arrived; the last position only receives. For large buffers the time
// approaches S / bandwidth regardless of N.
#include <algorithm>
#include <cstring>
#include <memory>

#include "algorithms/collectives.h"

namespace kerasdist {

Status ChainBroadcast(Transport* transport, void* buf, size_t bytes, int root,
                      const CollectiveOptions& options, std::vector<char>* scratch) {
  const int n = transport->size();
  if (n == 1 || bytes == 0) return Status::OK();
  const int pos = (transport->rank() - root + n) % n;
  const int next = (transport->rank() + 1) % n;
  const int prev = (transport->rank() + n - 1) % n;
  char* p = static_cast<char*>(buf);
  const size_t seg = std::max<size_t>(1, options.segment_bytes);
  const size_t nseg = (bytes + seg - 1) / seg;
  auto seg_len = [&](size_t j) { return std::min(seg, bytes - j * seg); };
  std::vector<std::unique_ptr<Transfer>> sends;
  auto finish_sends = [&]() -> Status {
    for (auto& t : sends) {
      Status s = WaitTransfer(t.get(), options.timeout_ms);
      if (!s.ok()) return s;
    }
    return Status::OK();
  };
  if (pos == 0) {
    for (size_t j = 0; j < nseg; ++j)
      sends.push_back(transport->Isend(next, kTagData, p + j * seg, seg_len(j)));
    return finish_sends();
  }
  const bool forward = pos != n - 1;
  const size_t window = std::max(1, options.segments_in_flight);
  // Shared memory copies in place; MPI lands in engine-owned scratch first.
  const bool stage = !transport->CanRecvReduce(prev);
  if (stage && scratch->size() < seg * window) scratch->resize(seg * window);
  auto dest = [&](size_t j) {
    return stage ? scratch->data() + (j % window) * seg : p + j * seg;
  };
  std::vector<std::unique_ptr<Transfer>> recvs(nseg);
  for (size_t j = 0; j < nseg && j < window; ++j)
    recvs[j] = transport->Irecv(prev, kTagData, dest(j), seg_len(j));
  for (size_t j = 0; j < nseg; ++j) {
    Status s = WaitTransfer(recvs[j].get(), options.timeout_ms);
    if (!s.ok()) {
      for (auto& t : recvs)
        if (t) t->Cancel();
      return s;
    }
    recvs[j].reset();
    if (stage) std::memcpy(p + j * seg, dest(j), seg_len(j));
    if (forward)
      sends.push_back(transport->Isend(next, kTagData, p + j * seg, seg_len(j)));
    if (j + window < nseg)
      recvs[j + window] = transport->Irecv(prev, kTagData, dest(j + window),
                                           seg_len(j + window));
  }
  return finish_sends();
}

}  // namespace kerasdist
