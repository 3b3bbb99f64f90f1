// The coordinator's checks for reducescatter and alltoall. Every problem,
// including one rank's bad splits, becomes the response's error, so the
// collective fails on every rank with the same message and the engine goes
// on.
//
// Reducescatter: every rank sends the same dtype, op, scale factors and
// shape (at least 1-D); op is sum or average. Alltoall: the same dtype and
// trailing dimensions (at least 1-D); each rank's splits have one
// non-negative entry per rank summing to its first dimension, or are empty
// and its first dimension divides evenly (Horovod's default). Neither runs
// while a rank has joined: both need every rank's tensor.
#include <algorithm>

#include "coordinator/coordinator.h"

namespace kerasdist {

namespace {

std::string Ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// Rows rank `rank` sends to each of `size` ranks, or an empty vector if its
// splits are invalid.
std::vector<int64_t> ResolveSplits(const TensorMeta& m, int size) {
  const int64_t dim0 = m.shape[0];
  if (m.splits.empty()) {
    if (dim0 % size != 0) return {};
    return std::vector<int64_t>(size, dim0 / size);
  }
  if (m.splits.size() != static_cast<size_t>(size)) return {};
  int64_t sum = 0;
  for (int64_t s : m.splits) {
    if (s < 0 || s > dim0 - sum) return {};
    sum += s;
  }
  if (sum != dim0) return {};
  return m.splits;
}

}  // namespace

void Coordinator::ValidateScatter(int32_t idx, Ready* out) const {
  const Pending& p = pool_[idx];
  const TensorMeta& m0 = p.sources[out->source].meta;
  const std::string what = std::string(OpTypeName(m0.type)) + " '" + p.name + "'";
  std::vector<int> joined;
  for (int r = 0; r < size_; ++r)
    if (!Has(idx, r)) joined.push_back(r);
  if (!joined.empty()) {
    out->error = what + " cannot run while ranks " + Ranks(joined) +
                 " have joined: reducescatter and alltoall need a tensor from every rank.";
    return;
  }
  bool ok = !m0.shape.empty();
  for (int r = 0; r < size_ && ok; ++r) {
    const TensorMeta& m = MetaOf(idx, r);
    if (m0.type == OpType::kReducescatter) {
      ok = m == m0;
    } else {
      ok = m.type == m0.type && m.dtype == m0.dtype && m.shape.size() == m0.shape.size() &&
           std::equal(m.shape.begin() + 1, m.shape.end(), m0.shape.begin() + 1);
    }
  }
  if (!ok) {
    std::string msg = "Mismatched " + std::string(OpTypeName(m0.type)) + " for tensor '" +
                      p.name + "' across ranks:";
    for (int r = 0; r < size_; ++r)
      msg += (r ? "; rank " : " rank ") + std::to_string(r) + " sent " + MetaOf(idx, r).Describe();
    msg += m0.type == OpType::kReducescatter
               ? ". Every rank must call reducescatter with the same dtype, op and shape "
                 "(at least 1-D)."
               : ". Every rank must call alltoall with the same dtype, rank and trailing "
                 "dimensions (at least 1-D); the first dimension may differ.";
    out->error = msg;
    return;
  }
  if (m0.type == OpType::kReducescatter) {
    if (m0.reduce_op != ReduceOp::kSum && m0.reduce_op != ReduceOp::kAverage)
      out->error = "Invalid op for " + what + ". Expected sum or average. Received: " +
                   ReduceOpName(m0.reduce_op) + ".";
    return;
  }
  std::string bad;
  out->splits.clear();
  for (int r = 0; r < size_; ++r) {
    const TensorMeta& m = MetaOf(idx, r);
    std::vector<int64_t> rows = ResolveSplits(m, size_);
    if (rows.empty()) {
      bad += (bad.empty() ? " rank " : "; rank ") + std::to_string(r) + " sent " +
             (m.splits.empty() ? std::string("no splits") : "splits " + ShapeString(m.splits)) +
             " for a first dimension of " + std::to_string(m.shape[0]);
      continue;
    }
    out->splits.insert(out->splits.end(), rows.begin(), rows.end());
  }
  if (!bad.empty()) {
    out->splits.clear();
    out->error = "Invalid splits for " + what + ":" + bad + ". Expected " +
                 std::to_string(size_) +
                 " non-negative integers (rows for each rank, in rank order) that sum to "
                 "the tensor's first dimension, or no splits and a first dimension divisible "
                 "by " + std::to_string(size_) + ".";
  }
}

void Coordinator::AppendReducescatter(const TensorMeta& meta, Response* resp) {
  int64_t row = 1;  // elements per row
  for (size_t i = 1; i < meta.shape.size(); ++i) row *= meta.shape[i];
  resp->counts.push_back(row);
  resp->splits.push_back(meta.shape.empty() ? 0 : meta.shape[0]);
}

}  // namespace kerasdist
