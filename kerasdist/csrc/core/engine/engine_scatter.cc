// The engine's reducescatter and alltoall: how an agreed response runs on
// this rank's buffers, over RingReduceScatter and PairwiseAlltoall
// (collectives.h).
//
// Reducescatter splits each tensor's first dimension as Horovod does: with
// d rows and N ranks, rank q owns d / N rows, and the first d % N ranks one
// more, in rank order. Several tensors (a grouped reducescatter) travel in
// one fused buffer whose block q is rank q's rows of every tensor, in
// order, so one ring pass reduces them all.
#include <algorithm>
#include <cstring>

#include "engine/engine.h"
#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

int64_t RowsOf(int64_t dim0, int size, int rank) {
  return dim0 / size + (rank < dim0 % size ? 1 : 0);
}

int64_t FirstRowOf(int64_t dim0, int size, int rank) {
  return rank * (dim0 / size) + std::min<int64_t>(rank, dim0 % size);
}

}  // namespace

Status Engine::RunReducescatter(const Response& resp, std::vector<Request*>& reqs) {
  const DataType dtype = resp.dtype;
  const size_t elem = DataTypeSize(dtype);
  // As in RunAllreduce: small-integer averages accumulate wider, float16
  // averages divide before they sum.
  const DataType acc = AccumulationType(dtype, resp.reduce_op);
  const size_t acc_elem = DataTypeSize(acc);
  const bool widen = acc != dtype;
  const int n = size_;
  double prescale = resp.prescale;
  ReduceOp finalize_op = resp.reduce_op;
  if (dtype == DataType::kFloat16 && resp.reduce_op == ReduceOp::kAverage) {
    prescale /= n;
    finalize_op = ReduceOp::kSum;
  }
  std::vector<size_t> block_offset(n), block_bytes(n);
  size_t total = 0;
  for (int q = 0; q < n; ++q) {
    block_offset[q] = total;
    for (size_t i = 0; i < reqs.size(); ++i)
      total += static_cast<size_t>(RowsOf(resp.splits[i], n, q) * resp.counts[i]) * acc_elem;
    block_bytes[q] = total - block_offset[q];
  }
  if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
  char* buf = fusion_buffer_.data();
  const int64_t t0 = NowMicros();
  for (int q = 0; q < n; ++q) {
    size_t off = block_offset[q];
    for (size_t i = 0; i < reqs.size(); ++i) {
      const size_t m = static_cast<size_t>(RowsOf(resp.splits[i], n, q) * resp.counts[i]);
      if (!reqs[i]) {
        std::memset(buf + off, 0, m * acc_elem);
      } else {
        const char* src = static_cast<const char*>(reqs[i]->input) +
                          FirstRowOf(resp.splits[i], n, q) * resp.counts[i] * elem;
        if (widen) {
          ConvertInteger(buf + off, acc, src, dtype, m);
          ScaleInPlace(buf + off, m, acc, prescale);
        } else {
          CopyScaled(buf + off, src, m, dtype, prescale);
        }
      }
      off += m * acc_elem;
    }
  }
  const int64_t t1 = NowMicros();
  RingTimes times;
  Status s = RingReduceScatter(transport_.get(), buf, block_offset, block_bytes, acc,
                               resp.reduce_op, config_.collective, &scratch_, &times);
  if (!s.ok()) return s;
  char* mine = buf + block_offset[rank_];
  Finalize(mine, block_bytes[rank_] / acc_elem, acc, finalize_op, n, resp.postscale);
  const int64_t t2 = NowMicros();
  size_t off = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const size_t m = static_cast<size_t>(RowsOf(resp.splits[i], n, rank_) * resp.counts[i]);
    if (reqs[i] && widen) {
      ConvertInteger(reqs[i]->output, dtype, mine + off, acc, m);
    } else if (reqs[i] && m) {
      std::memcpy(reqs[i]->output, mine + off, m * elem);
    }
    off += m * acc_elem;
  }
  if (timeline_.enabled()) {
    const std::string names = JoinNames(reqs);
    timeline_.Event("memcpy_in_fusion_buffer", kRowCopies, t0, t1, names);
    timeline_.Event("ring_reduce_scatter", kRowCollective, times.start, times.end, names);
    timeline_.Event("memcpy_out_fusion_buffer", kRowCopies, t2, NowMicros(), names);
  }
  return Status::OK();
}

Status Engine::RunAlltoall(const Response& resp, Request* req) {
  if (!req)  // the coordinator refuses alltoall while a rank has joined
    return Status(StatusCode::kInternal, "alltoall response on a rank without the tensor");
  const int n = size_;
  const size_t row_bytes = static_cast<size_t>(resp.counts[0]) * DataTypeSize(resp.dtype);
  std::vector<size_t> send_offset(n), send_bytes(n), recv_offset(n), recv_bytes(n);
  size_t sent = 0, received = 0;
  int64_t rows = 0;
  for (int q = 0; q < n; ++q) {
    send_offset[q] = sent;
    send_bytes[q] = static_cast<size_t>(resp.splits[rank_ * n + q]) * row_bytes;
    sent += send_bytes[q];
    recv_offset[q] = received;
    recv_bytes[q] = static_cast<size_t>(resp.splits[q * n + rank_]) * row_bytes;
    received += recv_bytes[q];
    rows += resp.splits[q * n + rank_];
  }
  std::vector<int64_t> shape = req->meta.shape;
  shape[0] = rows;
  void* out = nullptr;
  Status s = req->allocate(shape, &out);
  if (!s.ok()) return s;
  if (req->received_splits)
    for (int q = 0; q < n; ++q)
      req->received_splits[q] = static_cast<int32_t>(resp.splits[q * n + rank_]);
  const int64_t t0 = NowMicros();
  s = PairwiseAlltoall(transport_.get(), req->input, send_offset, send_bytes, out,
                       recv_offset, recv_bytes, config_.collective, &scratch_);
  if (s.ok() && timeline_.enabled())
    timeline_.Event("alltoall", kRowCollective, t0, NowMicros(), req->name);
  return s;
}

}  // namespace kerasdist
