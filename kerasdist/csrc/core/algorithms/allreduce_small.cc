// Latency-optimal allreduce for small buffers.
//
// The ring takes 2(N-1) message latencies, whatever the size. Below a few
// tens of KiB the latency is the whole cost, so small buffers take fewer,
// larger steps:
//   direct exchange (N <= small_direct_max_ranks, 4): every rank sends its buffer to
//     every other rank and reduces all N buffers itself: one step.
//   recursive doubling (more ranks): log2(P) pairwise exchanges among the
//     largest power of two P <= N, plus one step before and one after for
//     the N - P ranks beyond it, which hand their data to a partner.
// Replicas stay bit-identical: in the direct exchange every rank reduces the
// buffers in rank order; in recursive doubling both ranks of a pair apply
// the operation with the lower rank's operand first, so they compute the
// same bytes (also for min/max with NaNs, whose result depends on order).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

// `mine` op `theirs` with the lower rank's operand first, into `mine`.
// `theirs` may be overwritten.
void ReduceOrdered(char* mine, char* theirs, bool mine_first, size_t count, size_t bytes,
                   DataType dtype, ReduceOp op) {
  if (mine_first) {
    ReduceInto(mine, theirs, count, dtype, op);
  } else {
    ReduceInto(theirs, mine, count, dtype, op);
    std::memcpy(mine, theirs, bytes);
  }
}

Status DirectExchange(Transport* t, char* buf, size_t count, size_t bytes, DataType dtype,
                      ReduceOp op, const CollectiveOptions& options, std::vector<char>* scratch) {
  const int n = t->size(), r = t->rank();
  if (scratch->size() < bytes * n) scratch->resize(bytes * n);
  char* slots = scratch->data();  // slot p: rank p's buffer
  std::vector<std::unique_ptr<Transfer>> transfers;
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    transfers.push_back(t->Irecv(from, kTagData, slots + from * bytes, bytes));
  }
  for (int k = 1; k < n; ++k) transfers.push_back(t->Isend((r + k) % n, kTagData, buf, bytes));
  Status s = WaitTransfers(&transfers, options.timeout_ms);
  if (!s.ok()) return s;
  std::memcpy(slots + r * bytes, buf, bytes);
  std::memcpy(buf, slots, bytes);
  for (int p = 1; p < n; ++p) ReduceInto(buf, slots + p * bytes, count, dtype, op);
  return Status::OK();
}

// One pairwise step: sends `buf` to `peer` and receives its buffer into
// `incoming`.
Status Exchange(Transport* t, int peer, char* buf, char* incoming, size_t bytes,
                const CollectiveOptions& options) {
  std::vector<std::unique_ptr<Transfer>> transfers;
  transfers.push_back(t->Irecv(peer, kTagData, incoming, bytes));
  transfers.push_back(t->Isend(peer, kTagData, buf, bytes));
  return WaitTransfers(&transfers, options.timeout_ms);
}

Status RecursiveDoubling(Transport* t, char* buf, size_t count, size_t bytes, DataType dtype,
                         ReduceOp op, const CollectiveOptions& options,
                         std::vector<char>* scratch) {
  const int n = t->size(), r = t->rank();
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  if (scratch->size() < bytes) scratch->resize(bytes);
  char* incoming = scratch->data();
  std::vector<std::unique_ptr<Transfer>> transfers;
  if (r >= p2) {
    // Hand the data to rank r - p2, then receive the result from it.
    transfers.push_back(t->Isend(r - p2, kTagData, buf, bytes));
    Status s = WaitTransfers(&transfers, options.timeout_ms);
    if (!s.ok()) return s;
    transfers.push_back(t->Irecv(r - p2, kTagData, incoming, bytes));
    s = WaitTransfers(&transfers, options.timeout_ms);
    if (!s.ok()) return s;
    std::memcpy(buf, incoming, bytes);
    return Status::OK();
  }
  if (r < extra) {
    transfers.push_back(t->Irecv(r + p2, kTagData, incoming, bytes));
    Status s = WaitTransfers(&transfers, options.timeout_ms);
    if (!s.ok()) return s;
    ReduceInto(buf, incoming, count, dtype, op);  // rank r < r + p2: r first
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    const int peer = r ^ mask;
    Status s = Exchange(t, peer, buf, incoming, bytes, options);
    if (!s.ok()) return s;
    ReduceOrdered(buf, incoming, r < peer, count, bytes, dtype, op);
  }
  if (r < extra) {
    transfers.push_back(t->Isend(r + p2, kTagData, buf, bytes));
    return WaitTransfers(&transfers, options.timeout_ms);
  }
  return Status::OK();
}

}  // namespace

bool UseSmallAllreduce(size_t bytes, int size, const CollectiveOptions& options) {
  return size > 1 && bytes > 0 && bytes <= options.small_allreduce_bytes;
}

Status SmallAllreduce(Transport* transport, void* buf, size_t count, DataType dtype,
                      ReduceOp op, const CollectiveOptions& options,
                      std::vector<char>* scratch, RingTimes* times) {
  if (times) times->start = NowMicros();
  const int n = transport->size();
  const size_t bytes = count * DataTypeSize(dtype);
  Status s;
  if (n > 1 && count > 0) {
    s = n <= options.small_direct_max_ranks
            ? DirectExchange(transport, static_cast<char*>(buf), count, bytes, dtype, op,
                             options, scratch)
            : RecursiveDoubling(transport, static_cast<char*>(buf), count, bytes, dtype, op,
                                options, scratch);
  }
  if (times) times->reduce_scatter_end = times->end = NowMicros();
  return s;
}

}  // namespace kerasdist
