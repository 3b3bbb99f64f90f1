// The engine's collectives: how each agreed response list is executed
// (Execute), and how each response runs on this rank's buffers (fusion,
// accumulation type, joined ranks) over the algorithms in collectives.h.
#include <cstring>

#include "engine/direct_board.h"
#include "engine/engine.h"

#include "algorithms/allreduce_hierarchical.h"
#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

const char kJoinName[] = "__kerasdist_join__";  // the name every binding gives join() (the C API)

}  // namespace

std::string JoinNames(const std::vector<Request*>& reqs) {
  std::string s;
  for (const Request* r : reqs) {
    if (!r) continue;
    if (!s.empty()) s += ",";
    if (s.size() > 512) return s + "...";
    s += r->name;
  }
  return s;
}

bool Engine::ResponseFits(const Response& resp) const {
  for (int32_t id : resp.ids)
    if (static_cast<size_t>(id) >= id_names_.size() || id_names_[id].empty()) return false;
  if (!resp.error.empty()) return true;  // nothing runs, the requests fail
  if (resp.type == OpType::kAllgather)
    return resp.rank_dim0.size() == static_cast<size_t>(size_) && resp.ids.size() == 1;
  if (resp.type == OpType::kBroadcast)
    return resp.ids.size() == 1 && resp.root >= 0 && resp.root < size_;
  if (resp.type == OpType::kReducescatter) return resp.splits.size() == resp.ids.size();
  if (resp.type == OpType::kAlltoall)
    return resp.ids.size() == 1 && resp.splits.size() == static_cast<size_t>(size_) * size_;
  return true;
}

bool Engine::Execute(const ResponseList& list, Status* exit_status) {
  if (!list.empty()) ++lists_run_;
  for (const auto& p : list.new_ids) {
    if (static_cast<size_t>(p.first) >= id_names_.size()) id_names_.resize(p.first + 1);
    id_names_[p.first] = p.second;
  }
  for (size_t i = 0; i + 3 < list.direct.size(); i += 4) {
    const int32_t id = list.direct[i];
    if (!board_ || static_cast<size_t>(id) >= id_names_.size() || id_names_[id].empty() ||
        !board_->Assign(list.direct[i + 1], id_names_[id],
                        static_cast<size_t>(list.direct[i + 2]), list.direct[i + 3] != 0)) {
      *exit_status = Status(StatusCode::kAborted,
                            Prefix() + "corrupt response from rank 0 (a direct-board slot "
                                       "for an unknown tensor or a taken slot); stopping");
      return false;
    }
  }
  for (const Response& resp : list.responses) {
    const int64_t start = NowMicros();
    std::vector<Request*> reqs;
    if (resp.type == OpType::kJoin) {
      // The board's next epoch starts before join() returns: a post made
      // after it must never look like one of this join's rounds.
      joined_ = false;
      if (board_) board_->EndJoin();
      auto it = inflight_.find(kJoinName);
      if (it != inflight_.end()) {
        if (it->second.join_result) *it->second.join_result = resp.root;
        Finish(it->second, Status::OK());
        inflight_.erase(it);
      }
      continue;
    }
    if (!ResponseFits(resp)) {
      *exit_status = Status(StatusCode::kAborted,
                            Prefix() + "corrupt response from rank 0 (unknown tensor id or "
                                       "wrong per-rank sizes); stopping");
      return false;
    }
    for (int32_t id : resp.ids) {
      auto it = inflight_.find(id_names_[id]);
      reqs.push_back(it == inflight_.end() ? nullptr : &it->second);
      if (!reqs.back() && !joined_) {
        *exit_status = Status(StatusCode::kInternal,
                              Prefix() + "internal error: response for unknown tensor '" +
                                  id_names_[id] + "'");
        return false;
      }
      if (reqs.back() && timeline_.enabled())
        timeline_.Event(it->second.name, kRowNegotiation, it->second.enqueue_us,
                        start, OpTypeName(resp.type), "op");
    }
    Status s;
    if (!resp.error.empty()) {
      s = Status(StatusCode::kMismatch, Prefix() + resp.error);
    } else {
      s = RunResponse(resp, reqs);
      if (!s.ok()) {
        // A failed transfer leaves the ranks out of step: stop the engine.
        // The peer it names may be healthy and waiting further round the
        // ring: the roll call finds the ranks that are really lost.
        *exit_status = Status(s.code() == StatusCode::kTimeout ? StatusCode::kTimeout
                                                               : StatusCode::kAborted,
                              Prefix() + s.message() + " in " + OpTypeName(resp.type) +
                                  " '" + JoinNames(reqs) + "'" + RollCall());
        return false;
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      Request* r = reqs[i];
      if (!r) {
        // Joined: rank 0 may now cache a description under this id that this
        // rank never saw; drop ours, so its next use sends the description.
        auto it = cache_.find(id_names_[resp.ids[i]]);
        if (it != cache_.end() && it->second.first == resp.ids[i]) cache_.erase(it);
        continue;
      }
      if (s.ok() && !IsPerRankMeta(r->meta.type) && !IsTransientName(r->name))
        cache_[r->name] = {resp.ids[i], r->meta};
      Finish(*r, s);
      inflight_.erase(r->name);
    }
  }
  for (int32_t id : list.evicted) {
    if (static_cast<size_t>(id) >= id_names_.size()) continue;
    auto it = cache_.find(id_names_[id]);
    if (it != cache_.end() && it->second.first == id) cache_.erase(it);
    id_names_[id].clear();
  }
  cache_entries_.store(cache_.size());
  if (list.abort) {
    std::fprintf(stderr, "[kerasdist] ERROR: %s%s\n", Prefix().c_str(), list.message.c_str());
    *exit_status = Status(StatusCode::kAborted, Prefix() + list.message);
    return false;
  }
  if (list.shutdown) {
    *exit_status = Status(StatusCode::kShutdown,
                          Prefix() + "kerasdist has been shut down (" + list.message +
                              "); call kerasdist.init() again to run collectives");
    return false;
  }
  return true;
}

Status Engine::RunResponse(const Response& resp, std::vector<Request*>& reqs) {
  switch (resp.type) {
    case OpType::kAllreduce: return RunAllreduce(resp, reqs);
    case OpType::kAllgather: return RunAllgather(resp, reqs[0]);
    case OpType::kBroadcast: return RunBroadcast(resp, reqs[0]);
    case OpType::kReducescatter: return RunReducescatter(resp, reqs);
    case OpType::kAlltoall: return RunAlltoall(resp, reqs[0]);
    default: return Status::OK();  // barrier: agreement is the whole job
  }
}

Status Engine::RunAllreduce(const Response& resp, std::vector<Request*>& reqs) {
  const DataType dtype = resp.dtype;
  const size_t elem = DataTypeSize(dtype);
  size_t total = 0;
  for (int64_t c : resp.counts) total += static_cast<size_t>(c);
  const int contributors = resp.contributors > 0 ? resp.contributors : size_;
  // Averages of small integers are summed in a wider type, so that a mean
  // that fits is exact (uint8 [200, 200] averages to 200, not 72); float16
  // averages divide before summing, so that a mean that fits never
  // overflows to inf. Sums keep the element type: they wrap (integers) or
  // round at every step (floats) as numpy's arithmetic in that type does.
  const DataType acc = AccumulationType(dtype, resp.reduce_op);
  const size_t acc_elem = DataTypeSize(acc);
  double prescale = resp.prescale;
  ReduceOp finalize_op = resp.reduce_op;
  if (dtype == DataType::kFloat16 && resp.reduce_op == ReduceOp::kAverage) {
    prescale /= contributors;
    finalize_op = ReduceOp::kSum;
  }
  const bool widen = acc != dtype;
  const bool single = !widen && reqs.size() == 1 && reqs[0] != nullptr;
  const bool adasum = resp.reduce_op == ReduceOp::kAdasum;
  const bool small =
      !adasum && UseSmallAllreduce(total * acc_elem, size_, config_.collective);
  // One tensor on the flat ring with no prescale: the ring reads the input
  // itself and writes only the output, so nothing is copied up front.
  const void* ring_src =
      single && !adasum && !small && !local_ && prescale == 1.0 ? reqs[0]->input : nullptr;
  char* buf;
  const int64_t t0 = NowMicros();
  if (single) {
    buf = static_cast<char*>(reqs[0]->output);
    if (!ring_src) CopyScaled(buf, reqs[0]->input, total, dtype, prescale);
  } else {
    if (fusion_buffer_.size() < total * acc_elem) fusion_buffer_.resize(total * acc_elem);
    buf = fusion_buffer_.data();
    size_t off = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const size_t n = static_cast<size_t>(resp.counts[i]);
      if (!reqs[i]) {
        std::memset(buf + off, 0, n * acc_elem);  // a joined rank contributes zeros
      } else if (widen) {
        ConvertInteger(buf + off, acc, reqs[i]->input, dtype, n);
        ScaleInPlace(buf + off, n, acc, prescale);
      } else {
        CopyScaled(buf + off, reqs[i]->input, n, dtype, prescale);
      }
      off += n * acc_elem;
    }
  }
  const int64_t t1 = NowMicros();
  RingTimes times;
  // The flat ring finishes (averages, postscales) each rank's own chunk
  // before it circulates; the other paths finish the whole buffer after.
  const bool ring = !adasum && !small && !local_;
  const RingFinish finish = [&](char* p, size_t n) {
    Finalize(p, n, acc, finalize_op, contributors, resp.postscale);
  };
  Status s = adasum ? AdasumAllreduce(transport_.get(), buf, resp.counts, acc,
                                      config_.collective, &scratch_, &times)
             : small ? SmallAllreduce(transport_.get(), buf, total, acc, resp.reduce_op,
                                  config_.collective, &scratch_, &times)
             : local_ ? HierarchicalAllreduce(local_.get(), cross_.get(), buf, total, acc,
                                            resp.reduce_op, config_.collective, &scratch_,
                                            &times)
                   : RingAllreduce(transport_.get(), buf, total, acc, resp.reduce_op,
                                   config_.collective, &scratch_, &times, ring_src,
                                   &finish);
  if (!s.ok()) return s;
  if (!ring) Finalize(buf, total, acc, finalize_op, contributors, resp.postscale);
  const int64_t t2 = NowMicros();
  if (!single) {
    size_t off = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const size_t n = static_cast<size_t>(resp.counts[i]);
      if (reqs[i] && widen) {
        ConvertInteger(reqs[i]->output, dtype, buf + off, acc, n);
      } else if (reqs[i]) {
        std::memcpy(reqs[i]->output, buf + off, n * elem);
      }
      off += n * acc_elem;
    }
  }
  if (timeline_.enabled()) {
    const std::string names = JoinNames(reqs);
    const int64_t t3 = NowMicros();
    timeline_.Event(single ? "copy_in" : "memcpy_in_fusion_buffer", kRowCopies, t0, t1, names);
    if (adasum) {
      timeline_.Event("adasum", kRowCollective, times.start, times.end, names);
    } else if (small) {
      timeline_.Event("small_allreduce", kRowCollective, times.start, times.end, names);
    } else {
      timeline_.Event("ring_reduce_scatter", kRowCollective, times.start,
                      times.reduce_scatter_end, names);
      timeline_.Event("ring_allgather", kRowCollective, times.reduce_scatter_end, times.end,
                      names);
    }
    if (!single) timeline_.Event("memcpy_out_fusion_buffer", kRowCopies, t2, t3, names);
  }
  return Status::OK();
}

Status Engine::RunAllgather(const Response& resp, Request* req) {
  const size_t row_bytes = static_cast<size_t>(resp.counts[0]) * DataTypeSize(resp.dtype);
  std::vector<size_t> offsets(size_), bytes(size_);
  int64_t rows = 0;
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[r] = total;
    bytes[r] = static_cast<size_t>(resp.rank_dim0[r]) * row_bytes;
    total += bytes[r];
    rows += resp.rank_dim0[r];
  }
  char* out;
  if (req) {
    std::vector<int64_t> shape = req->meta.shape;
    shape[0] = rows;
    void* data = nullptr;
    Status s = req->allocate(shape, &data);
    if (!s.ok()) return s;
    out = static_cast<char*>(data);
    if (bytes[rank_]) std::memcpy(out + offsets[rank_], req->input, bytes[rank_]);
  } else {
    if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
    out = fusion_buffer_.data();
  }
  RingTimes times;
  Status s = RingAllgather(transport_.get(), out, offsets, bytes, config_.collective,
                           &scratch_, &times);
  if (s.ok() && timeline_.enabled() && req)
    timeline_.Event("ring_allgather", kRowCollective, times.start, times.end, req->name);
  return s;
}

Status Engine::RunBroadcast(const Response& resp, Request* req) {
  const size_t bytes = static_cast<size_t>(resp.counts[0]) * DataTypeSize(resp.dtype);
  char* buf;
  if (req) {
    buf = static_cast<char*>(req->output);
    if (rank_ == resp.root && req->output != req->input && bytes)
      std::memcpy(buf, req->input, bytes);
  } else {
    if (fusion_buffer_.size() < bytes) fusion_buffer_.resize(bytes);
    buf = fusion_buffer_.data();
  }
  const int64_t t0 = NowMicros();
  Status s = ChainBroadcast(transport_.get(), buf, bytes, resp.root, config_.collective,
                            &scratch_);
  if (s.ok() && timeline_.enabled() && req)
    timeline_.Event("broadcast", kRowCollective, t0, NowMicros(), req->name);
  return s;
}

}  // namespace kerasdist
