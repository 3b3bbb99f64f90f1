// Ring reduce-scatter with per-rank blocks of different sizes (Horovod's
// reducescatter gives the first dim0 % N ranks one row more than the rest).
//
// Block r is the part of the buffer that rank r ends up owning. At step t
// rank r sends block (r - t - 1) to its right neighbour and reduces block
// (r - t - 2) from its left one into place; the block received at step t is
// the one sent at step t + 1, so after N-1 steps rank r has added every
// rank's copy of block r. This is the reduce-scatter phase of the ring
// allreduce with the ownership shifted by one, over the same segmented,
// pipelined ring pass.
#include "algorithms/collectives.h"
#include "algorithms/ring_pass.h"

namespace kerasdist {

Status RingReduceScatter(Transport* transport, void* buf,
                         const std::vector<size_t>& block_offsets,
                         const std::vector<size_t>& block_bytes, DataType dtype,
                         ReduceOp op, const CollectiveOptions& options,
                         std::vector<char>* scratch, RingTimes* times) {
  const int n = transport->size();
  const int r = transport->rank();
  if (times) times->start = NowMicros();
  RingLayout layout;
  layout.chunk_offset = block_offsets;
  layout.chunk_bytes = block_bytes;
  layout.element_bytes = DataTypeSize(dtype);
  std::vector<RingStep> steps;
  for (int t = 0; t < n - 1; ++t)
    steps.push_back({(r - t - 1 + 2 * n) % n, (r - t - 2 + 2 * n) % n, true});
  Status s = RunRingPass(transport, static_cast<char*>(buf), layout, steps, dtype, op,
                         options, scratch, nullptr);
  if (times) times->reduce_scatter_end = times->end = NowMicros();
  return s;
}

}  // namespace kerasdist
