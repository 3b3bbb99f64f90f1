// Ring allreduce: reduce-scatter then allgather over N chunks.
//
// With N ranks and a buffer of S bytes, chunk c holds elements
// [c*q + min(c, rem), ...) where q = count / N and rem = count % N, so chunk
// sizes differ by at most one element. During reduce-scatter step t rank r
// sends chunk (r - t) and reduces the incoming chunk (r - t - 1); after N-1
// steps it holds the fully reduced chunk (r + 1). The allgather then
// circulates the reduced chunks for another N-1 steps. Each rank sends
// 2(N-1)/N * S bytes in total, which is bandwidth-optimal.
#include <algorithm>
#include <cstring>

#include "algorithms/collectives.h"
#include "algorithms/ring_pass.h"

namespace kerasdist {

namespace {

// Chunk c of `count` elements split n ways: [offset, offset + elems).
void ChunkOf(size_t count, int n, int c, size_t* offset, size_t* elems) {
  const size_t q = count / n, rem = count % n;
  *offset = c * q + std::min<size_t>(c, rem);
  *elems = q + (static_cast<size_t>(c) < rem ? 1 : 0);
}

}  // namespace

int RingOwnedChunk(int rank, int size) { return (rank + 1) % size; }

Status RingAllreducePhases(Transport* transport, void* buf, size_t count,
                           DataType dtype, ReduceOp op,
                           const CollectiveOptions& options,
                           std::vector<char>* scratch, RingTimes* times,
                           bool reduce_scatter, bool allgather, const void* src,
                           const RingFinish* finish) {
  const int n = transport->size();
  const int r = transport->rank();
  if (times) times->start = NowMicros();
  if (src && src != buf && (n == 1 || !reduce_scatter))
    std::memcpy(buf, src, count * DataTypeSize(dtype));  // nothing to fold it into
  if (!reduce_scatter) src = nullptr;
  if (!(reduce_scatter && allgather)) finish = nullptr;  // no whole result here
  if (n == 1 || count == 0) {
    if (finish && count > 0) (*finish)(static_cast<char*>(buf), count);
    if (times) times->reduce_scatter_end = times->end = NowMicros();
    return Status::OK();
  }
  const size_t elem = DataTypeSize(dtype);
  RingLayout layout;
  layout.element_bytes = elem;
  for (int c = 0; c < n; ++c) {
    size_t off, elems;
    ChunkOf(count, n, c, &off, &elems);
    layout.chunk_offset.push_back(off * elem);
    layout.chunk_bytes.push_back(elems * elem);
  }
  std::vector<RingStep> steps;
  if (reduce_scatter) {
    for (int t = 0; t < n - 1; ++t)
      steps.push_back({(r - t + 2 * n) % n, (r - t - 1 + 2 * n) % n, true});
  }
  if (allgather) {
    const int owned = RingOwnedChunk(r, n);
    for (int t = 0; t < n - 1; ++t)
      steps.push_back({(owned - t + 2 * n) % n, (owned - t - 1 + 2 * n) % n, false});
  }
  int64_t switch_time = 0;
  Status s = RunRingPass(transport, static_cast<char*>(buf), layout, steps,
                         dtype, op, options, scratch, &switch_time,
                         static_cast<const char*>(src), finish);
  if (times) {
    times->reduce_scatter_end = allgather ? switch_time : NowMicros();
    times->end = NowMicros();
  }
  return s;
}

void RingChunk(size_t count, int size, int chunk, size_t* offset, size_t* elems) {
  ChunkOf(count, size, chunk, offset, elems);
}

Status RingAllreduce(Transport* transport, void* buf, size_t count,
                     DataType dtype, ReduceOp op,
                     const CollectiveOptions& options,
                     std::vector<char>* scratch, RingTimes* times,
                     const void* src, const RingFinish* finish) {
  return RingAllreducePhases(transport, buf, count, dtype, op, options, scratch,
                             times, true, true, src, finish);
}

}  // namespace kerasdist
