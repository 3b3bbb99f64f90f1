#include "algorithms/ring_pass.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

struct SegmentRecv {
  int step;
  int chunk;
  size_t offset;  // bytes from the buffer start
  size_t bytes;
};

}  // namespace

Status RunRingPass(Transport* transport, char* buf, const RingLayout& layout,
                   const std::vector<RingStep>& steps, DataType dtype,
                   ReduceOp op, const CollectiveOptions& options,
                   std::vector<char>* scratch, int64_t* phase_switch_time,
                   const char* src, const RingFinish* finish) {
  const int n = transport->size();
  if (n == 1 || steps.empty()) return Status::OK();
  const int right = (transport->rank() + 1) % n;
  const int left = (transport->rank() + n - 1) % n;
  const size_t elem = layout.element_bytes;
  const size_t seg_bytes =
      std::max(elem, options.segment_bytes / elem * elem);
  const int window = std::max(1, options.segments_in_flight);

  // Every segment this rank will receive, in arrival order.
  std::vector<SegmentRecv> recvs;
  for (size_t s = 0; s < steps.size(); ++s) {
    const int c = steps[s].recv_chunk;
    for (size_t off = 0; off < layout.chunk_bytes[c]; off += seg_bytes) {
      recvs.push_back({static_cast<int>(s), c, layout.chunk_offset[c] + off,
                       std::min(seg_bytes, layout.chunk_bytes[c] - off)});
    }
  }
  // A transport that reduces as the data arrives needs no scratch buffer.
  // Any other (MPI) receives into engine-owned scratch, also when it only
  // stores (see collectives.h).
  const bool fused_reduce = transport->CanRecvReduce(left);
  if (!fused_reduce && scratch->size() < seg_bytes * window) {
    scratch->resize(seg_bytes * window);
  }

  // Outstanding sends keyed by the byte offset of their segment. A segment
  // is only ever received in place after its earlier send has completed;
  // waiting on anything wider (say, the whole chunk) can deadlock the ring.
  std::map<size_t, std::vector<std::unique_ptr<Transfer>>> sends;
  std::vector<std::unique_ptr<Transfer>> inflight(window);
  auto cancel_all = [&]() {
    for (auto& t : inflight)
      if (t) t->Cancel();
  };

  // Step 0 sends this rank's own chunk; later sends forward received data.
  if (src == buf) src = nullptr;
  const char* own = src ? src : buf;
  const int first = steps[0].send_chunk;
  for (size_t off = 0; off < layout.chunk_bytes[first]; off += seg_bytes) {
    sends[layout.chunk_offset[first] + off].push_back(transport->Isend(
        right, kTagData, own + layout.chunk_offset[first] + off,
        std::min(seg_bytes, layout.chunk_bytes[first] - off)));
  }

  auto post_recv = [&](size_t k) -> Status {
    const SegmentRecv& e = recvs[k];
    const bool reduce = steps[e.step].reduce;
    if (!reduce || fused_reduce) {
      // Writing into the segment in place: an earlier send out of it must
      // be done.
      Status s = WaitTransfers(&sends[e.offset], options.timeout_ms);
      if (!s.ok()) return s;
    }
    if (reduce && fused_reduce) {
      inflight[k % window] = transport->IrecvReduce(left, kTagData, buf + e.offset,
                                                    e.bytes, dtype, op, own + e.offset);
    } else {
      char* dest = fused_reduce ? buf + e.offset : scratch->data() + (k % window) * seg_bytes;
      inflight[k % window] = transport->Irecv(left, kTagData, dest, e.bytes);
    }
    return Status::OK();
  };

  for (size_t k = 0; k < recvs.size() && k < static_cast<size_t>(window); ++k) {
    Status s = post_recv(k);
    if (!s.ok()) {
      cancel_all();
      return s;
    }
  }
  bool switched = false;
  for (size_t k = 0; k < recvs.size(); ++k) {
    const SegmentRecv& e = recvs[k];
    if (!steps[e.step].reduce && !switched) {
      // The allgather starts when this rank begins waiting for its first
      // segment, not when that segment has arrived.
      switched = true;
      if (phase_switch_time) *phase_switch_time = NowMicros();
    }
    Status s = WaitTransfer(inflight[k % window].get(), options.timeout_ms);
    if (!s.ok()) {
      cancel_all();
      return s;
    }
    inflight[k % window].reset();
    if (steps[e.step].reduce && !fused_reduce) {
      ReduceFrom(buf + e.offset, src ? src + e.offset : buf + e.offset,
                 scratch->data() + (k % window) * seg_bytes, e.bytes / elem, dtype, op);
    } else if (!fused_reduce) {
      std::memcpy(buf + e.offset, scratch->data() + (k % window) * seg_bytes, e.bytes);
    }
    const bool last = static_cast<size_t>(e.step) + 1 == steps.size();
    if (finish && steps[e.step].reduce && (last || !steps[e.step + 1].reduce))
      (*finish)(buf + e.offset, e.bytes / elem);
    if (!last) {
      sends[e.offset].push_back(
          transport->Isend(right, kTagData, buf + e.offset, e.bytes));
    }
    if (k + window < recvs.size()) {
      s = post_recv(k + window);
      if (!s.ok()) {
        cancel_all();
        return s;
      }
    }
  }
  for (auto& segment_sends : sends) {
    Status s = WaitTransfers(&segment_sends.second, options.timeout_ms);
    if (!s.ok()) return s;
  }
  if (!switched && phase_switch_time) *phase_switch_time = NowMicros();
  return Status::OK();
}

}  // namespace kerasdist
