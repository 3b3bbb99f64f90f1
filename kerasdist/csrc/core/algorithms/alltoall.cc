// Alltoall by pairwise exchange over the transport.
//
// Vocabulary: block j of the send buffer is what this rank sends to rank j;
// block i of the receive buffer is what it receives from rank i. Blocks are
// split into segments (options.segment_bytes) on the wire. At step k
// (1..N-1) rank r sends block r+k and receives block r-k (mod N): every pair
// of ranks exchanges exactly once per direction, and a rank needs only its
// two partners of the step to move on, so no step can wait on a later one.
// Its own block is a local copy.
#include <algorithm>
#include <cstring>
#include <memory>

#include "algorithms/collectives.h"

namespace kerasdist {

Status PairwiseAlltoall(Transport* transport, const void* send,
                        const std::vector<size_t>& send_offsets,
                        const std::vector<size_t>& send_bytes, void* recv,
                        const std::vector<size_t>& recv_offsets,
                        const std::vector<size_t>& recv_bytes,
                        const CollectiveOptions& options, std::vector<char>* scratch) {
  const int n = transport->size();
  const int r = transport->rank();
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  if (send_bytes[r])
    std::memcpy(out + recv_offsets[r], in + send_offsets[r], send_bytes[r]);
  const size_t seg = std::max<size_t>(1, options.segment_bytes);
  const size_t window = std::max(1, options.segments_in_flight);
  for (int k = 1; k < n; ++k) {
    const int dst = (r + k) % n;
    const int src = (r - k + n) % n;
    std::vector<std::unique_ptr<Transfer>> sends;
    for (size_t off = 0; off < send_bytes[dst]; off += seg)
      sends.push_back(transport->Isend(dst, kTagData, in + send_offsets[dst] + off,
                                       std::min(seg, send_bytes[dst] - off)));
    // Shared memory copies in place; MPI lands in engine-owned scratch first
    // (see collectives.h).
    const size_t bytes = recv_bytes[src];
    const size_t nseg = (bytes + seg - 1) / seg;
    const bool stage = !transport->CanRecvReduce(src);
    if (stage && scratch->size() < seg * window) scratch->resize(seg * window);
    auto len = [&](size_t j) { return std::min(seg, bytes - j * seg); };
    auto dest = [&](size_t j) {
      return stage ? scratch->data() + (j % window) * seg : out + recv_offsets[src] + j * seg;
    };
    std::vector<std::unique_ptr<Transfer>> recvs(nseg);
    for (size_t j = 0; j < nseg && j < window; ++j)
      recvs[j] = transport->Irecv(src, kTagData, dest(j), len(j));
    for (size_t j = 0; j < nseg; ++j) {
      Status s = WaitTransfer(recvs[j].get(), options.timeout_ms);
      if (!s.ok()) {
        for (auto& t : recvs)
          if (t) t->Cancel();
        return s;
      }
      recvs[j].reset();
      if (stage) std::memcpy(out + recv_offsets[src] + j * seg, dest(j), len(j));
      if (j + window < nseg)
        recvs[j + window] = transport->Irecv(src, kTagData, dest(j + window), len(j + window));
    }
    Status s = WaitTransfers(&sends, options.timeout_ms);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace kerasdist
