// Internal: the segmented, pipelined ring pass shared by ring allreduce and
// ring allgather. A pass is a list of steps; at step s each rank sends chunk
// send_chunk(s) to its right neighbour and receives chunk recv_chunk(s) from
// its left one, reducing it into place (reduce-scatter steps) or storing it
// (allgather steps). The chunk received at step s is the one sent at step s+1,
// so each segment is forwarded as soon as it has arrived.
//
// With `src` (not null, not `buf`), the pass reads this rank's own data from
// `src` and writes only `buf`: step 0 sends out of `src`, and a reduce step
// computes buf = op(src, incoming). That is right when every chunk is
// reduced at most once and `buf` holds nothing yet (a ring reduce-scatter),
// and saves copying the whole input into `buf` first.
//
// With `finish`, each segment received at the last reduce step (this rank's
// fully reduced chunk) is passed to it before it is forwarded.
#pragma once

#include <vector>

#include "algorithms/collectives.h"

namespace kerasdist {

struct RingStep {
  int send_chunk;
  int recv_chunk;
  bool reduce;
};

struct RingLayout {
  std::vector<size_t> chunk_offset;  // bytes from the buffer start
  std::vector<size_t> chunk_bytes;
  size_t element_bytes = 1;          // segments never split an element
};

Status RunRingPass(Transport* transport, char* buf, const RingLayout& layout,
                   const std::vector<RingStep>& steps, DataType dtype,
                   ReduceOp op, const CollectiveOptions& options,
                   std::vector<char>* scratch, int64_t* phase_switch_time,
                   const char* src = nullptr,
                   const RingFinish* finish = nullptr);

}  // namespace kerasdist
