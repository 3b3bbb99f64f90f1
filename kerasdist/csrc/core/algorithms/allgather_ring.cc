// Ring allgather with per-rank blocks of different sizes (ragged first
// dimension). At step t rank r forwards block (r - t) to its right neighbour
// and stores block (r - t - 1) from its left one; N-1 steps in all.
#include "algorithms/collectives.h"
#include "algorithms/ring_pass.h"

namespace kerasdist {

Status RingAllgather(Transport* transport, void* buf,
                     const std::vector<size_t>& block_offsets,
                     const std::vector<size_t>& block_bytes,
                     const CollectiveOptions& options,
                     std::vector<char>* scratch, RingTimes* times) {
  const int n = transport->size();
  const int r = transport->rank();
  if (times) times->start = times->reduce_scatter_end = NowMicros();
  RingLayout layout;
  layout.chunk_offset = block_offsets;
  layout.chunk_bytes = block_bytes;
  layout.element_bytes = 1;
  std::vector<RingStep> steps;
  for (int t = 0; t < n - 1; ++t) {
    steps.push_back({(r - t + 2 * n) % n, (r - t - 1 + 2 * n) % n, false});
  }
  Status s = RunRingPass(transport, static_cast<char*>(buf), layout, steps,
                         DataType::kUInt8, ReduceOp::kSum, options, scratch,
                         nullptr);
  if (times) times->end = NowMicros();
  return s;
}

}  // namespace kerasdist
