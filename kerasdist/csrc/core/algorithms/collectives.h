// The collective algorithms, written over the Transport interface.
//
// Cross-rank contract for every function here: all ranks of the transport
// call it in the same order with the same dtype and op; counts agree as
// documented per function. The engine guarantees this by negotiating each
// collective before running it.
//
// Buffers: data from a peer whose link cannot deliver straight into place
// (MPI) is received into `scratch`, which the engine owns, and copied from
// there. So after a failure whose cancellation MPI could not confirm, only
// engine memory can still be written by MPI, never the caller's buffer; the
// engine then abandons that scratch instead of freeing it.
//
// Vocabulary (as in the ring literature):
//   chunk   - the 1/N slice of the buffer that one rank reduces
//             (reduce-scatter) or owns (allgather);
//   segment - the unit in flight on the wire; chunks are split into segments
//             so that receiving, reducing and forwarding overlap.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/common.h"
#include "transport/transport.h"

namespace kerasdist {

struct CollectiveOptions {
  size_t segment_bytes = 256 * 1024;  // bytes per message on the wire
  int segments_in_flight = 4;         // receives posted ahead
  int64_t timeout_ms = 60000;         // bound on every single wait
  // Allreduces of at most this many bytes take SmallAllreduce; 0: never.
  size_t small_allreduce_bytes = 32 * 1024;
  // Up to this many ranks the small allreduce is a direct exchange, beyond
  // it recursive doubling (tests lower it to run recursive doubling on few
  // ranks). Every rank must use the same value.
  int small_direct_max_ranks = 4;
};

// Phase boundaries, in NowMicros() time, for the timeline.
struct RingTimes {
  int64_t start = 0;
  int64_t reduce_scatter_end = 0;
  int64_t end = 0;
};

// In-place ring allreduce of `count` elements: a reduce-scatter then an
// allgather, N-1 steps each. Every rank sends 2(N-1)/N of the buffer.
// kAverage reduces as a sum; the caller divides (see Finalize in reduce.h).
// `scratch` is grown as needed and reused across calls.
// With `src` (not null), the input is read from `src` and `buf` is only
// written: no copy of the input into `buf` is needed first.
// With `finish` (not null), each rank applies it to its own chunk, segment
// by segment, as soon as that is fully reduced and before it circulates:
// the others receive the finished values, so the result is the same as
// finishing the whole buffer afterwards on every rank, bit for bit, at 1/N
// of the work and while the data is still in cache (Finalize's averaging).
using RingFinish = std::function<void(char* data, size_t elems)>;
Status RingAllreduce(Transport* transport, void* buf, size_t count,
                     DataType dtype, ReduceOp op,
                     const CollectiveOptions& options,
                     std::vector<char>* scratch, RingTimes* times,
                     const void* src = nullptr, const RingFinish* finish = nullptr);

// One or both phases of RingAllreduce. After the reduce-scatter alone, rank
// r holds the fully reduced chunk RingOwnedChunk(r, n), whose place in the
// buffer RingChunk() gives; the allgather alone circulates those chunks.
Status RingAllreducePhases(Transport* transport, void* buf, size_t count,
                           DataType dtype, ReduceOp op,
                           const CollectiveOptions& options,
                           std::vector<char>* scratch, RingTimes* times,
                           bool reduce_scatter, bool allgather,
                           const void* src = nullptr, const RingFinish* finish = nullptr);
int RingOwnedChunk(int rank, int size);
void RingChunk(size_t count, int size, int chunk, size_t* offset, size_t* elems);

// In-place allreduce for small buffers, in fewer message latencies than the
// ring: a direct exchange (one step) up to 4 ranks, recursive doubling
// (about log2 N steps) beyond. Every rank sends (N-1) x bytes (direct) or
// about log2(N) x bytes, so it only pays below a few tens of KiB. Same
// contract and result layout as RingAllreduce; replicas are bit-identical.
Status SmallAllreduce(Transport* transport, void* buf, size_t count, DataType dtype,
                      ReduceOp op, const CollectiveOptions& options,
                      std::vector<char>* scratch, RingTimes* times);
// Adasum (adasum.cc): the adaptive sum of every rank's buffer, per tensor
// (`counts`: elements of each tensor in `buf`, in order), as a binary tree
// over a power-of-two number of ranks; float16, bfloat16, float32, float64.
// Replicas are bit-identical.
Status AdasumAllreduce(Transport* transport, void* buf, const std::vector<int64_t>& counts,
                       DataType dtype, const CollectiveOptions& options,
                       std::vector<char>* scratch, RingTimes* times);
// Whether an allreduce of `bytes` on `size` ranks takes SmallAllreduce.
bool UseSmallAllreduce(size_t bytes, int size, const CollectiveOptions& options);

// In-place ring allgather of per-rank blocks of different sizes. On entry,
// rank r's block lies at byte offset block_offsets[r] of `buf`; on return all
// blocks are filled. All ranks pass the same block sizes.
Status RingAllgather(Transport* transport, void* buf,
                     const std::vector<size_t>& block_offsets,
                     const std::vector<size_t>& block_bytes,
                     const CollectiveOptions& options,
                     std::vector<char>* scratch, RingTimes* times);

// In-place ring reduce-scatter of per-rank blocks of different sizes. On
// entry every rank holds the whole buffer; on return rank r's block (at
// block_offsets[r], block_bytes[r] long, a multiple of the element size)
// holds the reduction of every rank's block r, and the other blocks hold
// partial sums. N-1 steps; each rank sends (N-1)/N of the buffer. kAverage
// reduces as a sum (the caller divides). All ranks pass the same blocks.
Status RingReduceScatter(Transport* transport, void* buf,
                         const std::vector<size_t>& block_offsets,
                         const std::vector<size_t>& block_bytes, DataType dtype,
                         ReduceOp op, const CollectiveOptions& options,
                         std::vector<char>* scratch, RingTimes* times);

// Alltoall by pairwise exchange: block j of `send` (send_offsets[j],
// send_bytes[j]) goes to rank j, and block i of `recv` is filled from rank
// i. At step k = 1..N-1 rank r sends to rank r+k and receives from rank r-k
// (mod N), segment by segment. Rank i's send_bytes[j] equals rank j's
// recv_bytes[i]; blocks may be empty.
Status PairwiseAlltoall(Transport* transport, const void* send,
                        const std::vector<size_t>& send_offsets,
                        const std::vector<size_t>& send_bytes, void* recv,
                        const std::vector<size_t>& recv_offsets,
                        const std::vector<size_t>& recv_bytes,
                        const CollectiveOptions& options, std::vector<char>* scratch);

// Pipelined chain broadcast of `bytes` from `root`, in place.
Status ChainBroadcast(Transport* transport, void* buf, size_t bytes, int root,
                      const CollectiveOptions& options, std::vector<char>* scratch);

}  // namespace kerasdist
