// Ring allreduce: reduce-scatter then allgather over N chunks.
//
// With N ranks and a buffer of S bytes, chunk c holds elements
// [c*q + min(c, rem), ...) where q = count / N and rem = count % N, so chunk
// sizes differ by at most one element. During reduce-scatter step t rank r
// sends chunk (r - t) and reduces the incoming chunk (r - t - 1); after N-1
// steps it holds the fully reduced chunk (r + 1). The allgather then
// circulates the reduced chunks for another N-1 steps. Each rank sends
// 2(N-1)/N * S bytes in total, which is bandwidth-optimal.
#include "collectives.h"
#include "ring_pass.h"

namespace kerasdist {

Status RingAllreduce(Transport* transport, void* buf, size_t count,
                     DataType dtype, ReduceOp op,
                     const CollectiveOptions& options,
                     std::vector<char>* scratch, RingTimes* times) {
  const int n = transport->size();
  const int r = transport->rank();
  if (times) times->start = NowMicros();
  if (n == 1 || count == 0) {
    if (times) times->reduce_scatter_end = times->end = NowMicros();
    return Status::OK();
  }
  const size_t elem = DataTypeSize(dtype);
  RingLayout layout;
  layout.element_bytes = elem;
  const size_t q = count / n, rem = count % n;
  size_t offset = 0;
  for (int c = 0; c < n; ++c) {
    const size_t elems = q + (static_cast<size_t>(c) < rem ? 1 : 0);
    layout.chunk_offset.push_back(offset);
    layout.chunk_bytes.push_back(elems * elem);
    offset += elems * elem;
  }
  std::vector<RingStep> steps;
  for (int t = 0; t < n - 1; ++t) {  // reduce-scatter
    steps.push_back({(r - t + 2 * n) % n, (r - t - 1 + 2 * n) % n, true});
  }
  const int owned = (r + 1) % n;
  for (int t = 0; t < n - 1; ++t) {  // allgather
    steps.push_back({(owned - t + 2 * n) % n, (owned - t - 1 + 2 * n) % n, false});
  }
  int64_t switch_time = 0;
  Status s = RunRingPass(transport, static_cast<char*>(buf), layout, steps,
                         dtype, op, options, scratch, &switch_time);
  if (times) {
    times->reduce_scatter_end = switch_time;
    times->end = NowMicros();
  }
  return s;
}

}  // namespace kerasdist
