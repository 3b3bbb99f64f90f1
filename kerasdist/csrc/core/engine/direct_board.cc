#include "engine/direct_board.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

constexpr uint64_t kBoardMagic = 0x31306472626b646bULL;  // "kdkbrd01"
constexpr size_t kBoardHeaderBytes = 64;
constexpr int kMaxDims = 8;
// PostHeader::dtype of a grouped allreduce whose tensors have several dtypes.
constexpr int32_t kMixedDtypes = -1;

enum PostKind : uint32_t { kData = 1, kOversize = 2, kJoined = 3 };

struct BoardHeader {
  uint64_t magic;
  uint64_t token;
};

}  // namespace

// One cache line per rank, after the board's header (see RankState).
struct alignas(64) SharedState {
  std::atomic<int64_t> alive_us;
  std::atomic<int64_t> progress_us;
  std::atomic<int32_t> waiting;
};

namespace {

// One rank's post for one round of one slot; its data follows. Every field
// is written before the release store of `seq` that publishes the post.
struct alignas(64) PostHeader {
  std::atomic<uint64_t> seq;  // the round posted (0: none yet)
  uint32_t kind;
  uint32_t epoch;  // joins the poster had completed
  int32_t dtype, reduce_op, ndim;  // ndim: the full rank; dims hold 8
  int32_t parts;  // a grouped allreduce: its tensors (dims: their total)
  int64_t count;
  double prescale, postscale;
  int64_t dims[kMaxDims];
  uint64_t shape_hash;  // of every dimension
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "needs lock-free atomics");

constexpr size_t kPostHeaderBytes = (sizeof(PostHeader) + 63) / 64 * 64;

PostHeader* HeaderOf(char* post) { return reinterpret_cast<PostHeader*>(post); }
char* DataOf(char* post) { return post + kPostHeaderBytes; }

// Where a round's result goes: the output of a single allreduce, or each
// tensor of a group in turn.
struct Segment {
  char* out;
  size_t count;
};

std::vector<Segment> SegmentsOf(const Request& r) {
  std::vector<Segment> segs;
  if (r.parts.empty()) {
    size_t count = 1;
    for (int64_t d : r.meta.shape) count *= static_cast<size_t>(d);
    segs.push_back({static_cast<char*>(r.output), count});
  }
  for (const Request::Part& p : r.parts) segs.push_back({static_cast<char*>(p.output), p.count});
  return segs;
}

// Reduces the posts of one round, in rank order, into `segs` (the data of
// the posts, back to back), as the engine's allreduce does (engine_ops.cc):
// small integer averages accumulate in a wider type, float16 averages
// divide before summing, joined ranks contribute zeros. `posts[p]` is
// rank p's; at least one holds data.
void ReducePosts(const std::vector<PostHeader*>& posts, int contributors,
                 const std::vector<Segment>& segs) {
  const PostHeader* ref = nullptr;
  for (const PostHeader* h : posts)
    if (!ref && h->kind == kData) ref = h;
  auto data = [](const PostHeader* h) {
    return DataOf(reinterpret_cast<char*>(const_cast<PostHeader*>(h)));
  };
  const DataType dtype = static_cast<DataType>(ref->dtype);
  const ReduceOp reduce_op = static_cast<ReduceOp>(ref->reduce_op);
  const size_t count = static_cast<size_t>(ref->count), esize = DataTypeSize(dtype);
  const DataType acc = AccumulationType(dtype, reduce_op);
  double prescale = ref->prescale;
  ReduceOp finalize_op = reduce_op;
  if (dtype == DataType::kFloat16 && reduce_op == ReduceOp::kAverage) {
    prescale /= contributors;
    finalize_op = ReduceOp::kSum;
  }
  const size_t n = posts.size();
  if (acc == dtype && prescale == 1.0 && contributors == static_cast<int>(n) && n >= 2) {
    // Straight from the posts into the outputs, one pass per segment.
    size_t offset = 0;
    for (const Segment& seg : segs) {
      const size_t at = offset * esize;
      ReduceFrom(seg.out, data(posts[0]) + at, data(posts[1]) + at, seg.count, dtype, reduce_op);
      for (size_t p = 2; p < n; ++p)
        ReduceInto(seg.out, data(posts[p]) + at, seg.count, dtype, reduce_op);
      Finalize(seg.out, seg.count, dtype, finalize_op, contributors, ref->postscale);
      offset += seg.count;
    }
    return;
  }
  const size_t acc_bytes = count * DataTypeSize(acc);
  thread_local std::vector<char> sum, term;
  if (sum.size() < acc_bytes) sum.resize(acc_bytes);
  if (term.size() < acc_bytes) term.resize(acc_bytes);
  for (size_t p = 0; p < n; ++p) {
    char* dst = p == 0 ? sum.data() : term.data();
    if (posts[p]->kind == kJoined) {
      std::memset(dst, 0, acc_bytes);  // a joined rank contributes zeros
    } else if (acc != dtype) {
      ConvertInteger(dst, acc, data(posts[p]), dtype, count);
      ScaleInPlace(dst, count, acc, prescale);
    } else {
      CopyScaled(dst, data(posts[p]), count, dtype, prescale);
    }
    if (p > 0) ReduceInto(sum.data(), term.data(), count, acc, reduce_op);
  }
  Finalize(sum.data(), count, acc, finalize_op, contributors, ref->postscale);
  size_t offset = 0;
  for (const Segment& seg : segs) {
    const char* from = sum.data() + offset * DataTypeSize(acc);
    if (acc != dtype) {
      ConvertInteger(seg.out, dtype, from, acc, seg.count);
    } else if (seg.count) {
      std::memcpy(seg.out, from, seg.count * esize);
    }
    offset += seg.count;
  }
}

bool SameMeta(const PostHeader* a, const PostHeader* b) {
  return a->dtype == b->dtype && a->reduce_op == b->reduce_op && a->ndim == b->ndim &&
         a->parts == b->parts && a->count == b->count && a->shape_hash == b->shape_hash &&
         a->prescale == b->prescale && a->postscale == b->postscale;
}

std::string DescribePost(const PostHeader* h) {
  if (h->kind == kJoined) return "nothing (joined)";
  if (h->dtype == kMixedDtypes)
    return "a group of " + std::to_string(h->parts) + " tensors of several dtypes, " +
           std::to_string(h->count) + " elements in all";
  TensorMeta m;
  m.type = OpType::kAllreduce;
  m.dtype = static_cast<DataType>(h->dtype);
  m.reduce_op = static_cast<ReduceOp>(h->reduce_op);
  m.prescale = h->prescale;
  m.postscale = h->postscale;
  for (int i = 0; i < h->ndim && i < kMaxDims; ++i) m.shape.push_back(h->dims[i]);
  std::string s = m.Describe();
  if (h->parts > 0)
    return "a group of " + std::to_string(h->parts) + " tensors, " + s + " in all (their shapes hash to " +
           std::to_string(h->shape_hash % 100000) + ")";
  if (h->ndim > kMaxDims) s += " (first 8 of " + std::to_string(h->ndim) + " dimensions)";
  return s;
}

}  // namespace

Status DirectBoard::Create(MpiTransport* mpi, bool enabled, int64_t timeout_ms,
                           std::unique_ptr<DirectBoard>* out) {
  out->reset();
  const int n = mpi->size(), me = mpi->rank();
  const size_t bytes = kBoardHeaderBytes + n * sizeof(SharedState) + kArenaBytes;
  struct Offer {
    char name[64];
    uint64_t token;
    int32_t ok;
  };
  Offer mine{};
  mine.ok = enabled ? 1 : 0;
  std::unique_ptr<ShmTransport::Segment> seg;
  std::string name;
  if (me == 0 && enabled) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(RandomBits()));
    name = std::string("/kerasdist-board-") + hex;
    std::string why;
    seg = MapSharedSegment(name, /*create=*/true, bytes, &why);
    if (seg) {
      mine.token = RandomBits();
      auto* h = static_cast<BoardHeader*>(seg->addr);
      h->magic = kBoardMagic;
      h->token = mine.token;
      std::strncpy(mine.name, name.c_str(), sizeof(mine.name) - 1);
    } else {
      mine.ok = 0;
      std::fprintf(stderr,
                   "[kerasdist] WARNING: rank 0: no shared-memory board for small "
                   "allreduces (%s); they go through the coordinator.\n",
                   why.c_str());
    }
  }
  std::vector<Offer> all(n);
  Status s = mpi->Allgather(&mine, sizeof(mine), all.data(), timeout_ms);
  if (!s.ok()) {
    if (seg) shm_unlink(name.c_str());
    return s;
  }
  bool everyone = true;
  for (const Offer& o : all) everyone = everyone && o.ok;
  int32_t mapped = 0;
  if (everyone && me != 0) {
    std::string why;
    const std::string theirs(all[0].name, strnlen(all[0].name, sizeof(all[0].name)));
    seg = MapSharedSegment(theirs, /*create=*/false, bytes, &why);
    const auto* h = seg ? static_cast<const BoardHeader*>(seg->addr) : nullptr;
    if (h && (h->magic != kBoardMagic || h->token != all[0].token)) seg.reset();
  }
  mapped = everyone && seg ? 1 : 0;
  std::vector<int32_t> mapped_all(n);
  s = mpi->Allgather(&mapped, sizeof(mapped), mapped_all.data(), timeout_ms);
  // Everyone has answered (or failed): the name can go; the mappings stay.
  if (all[0].name[0]) shm_unlink(std::string(all[0].name, strnlen(all[0].name, 64)).c_str());
  if (!s.ok()) return s;
  for (int32_t m : mapped_all)
    if (!m) return Status::OK();  // off everywhere
  std::unique_ptr<DirectBoard> board(new DirectBoard());
  board->seg_ = std::move(seg);
  board->rank_ = me;
  board->size_ = n;
  board->Beat(NowMicros(), false);
  board->Progress(NowMicros());
  *out = std::move(board);
  return Status::OK();
}

SharedState* DirectBoard::StateOf(int rank) const {
  return reinterpret_cast<SharedState*>(static_cast<char*>(seg_->addr) + kBoardHeaderBytes) +
         rank;
}

size_t DirectBoard::SlotBytes(size_t capacity) const {
  return 2 * static_cast<size_t>(size_) * (kPostHeaderBytes + (capacity + 63) / 64 * 64);
}

char* DirectBoard::Post(size_t offset, size_t capacity, uint64_t round, int rank) const {
  const size_t stride = kPostHeaderBytes + (capacity + 63) / 64 * 64;
  const size_t index = (round & 1) * size_ + rank;
  return static_cast<char*>(seg_->addr) + kBoardHeaderBytes + size_ * sizeof(SharedState) +
         offset + index * stride;
}

void DirectBoard::Beat(int64_t now_us, bool waiting) {
  if (now_us - beat_us_ < 1000 && waiting == beat_waiting_) return;
  SharedState* me = StateOf(rank_);
  me->alive_us.store(now_us, std::memory_order_relaxed);
  me->waiting.store(waiting ? 1 : 0, std::memory_order_relaxed);
  beat_us_ = now_us;
  beat_waiting_ = waiting;
}

void DirectBoard::Progress(int64_t now_us) {
  StateOf(rank_)->progress_us.store(now_us, std::memory_order_relaxed);
}

DirectBoard::RankState DirectBoard::State(int rank) const {
  const SharedState* st = StateOf(rank);
  RankState out;
  out.alive_us = st->alive_us.load(std::memory_order_relaxed);
  out.progress_us = st->progress_us.load(std::memory_order_relaxed);
  out.waiting = st->waiting.load(std::memory_order_relaxed) != 0;
  return out;
}

std::string DirectBoard::GroupName(const std::string& first) {
  const size_t n = first.size();
  return n >= 2 && first.compare(n - 2, 2, ".0") == 0 ? first.substr(0, n - 2) : "";
}

bool DirectBoard::Has(const std::string& name, bool group) {
  std::lock_guard<std::mutex> lock(mu_);
  return group ? by_group_.count(GroupName(name)) != 0 : by_name_.count(name) != 0;
}

bool DirectBoard::Assign(int slot, const std::string& first, size_t capacity, bool group) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& names = group ? by_group_ : by_name_;
  const std::string name = group ? GroupName(first) : first;
  if (group && name.empty()) return false;
  const size_t need = SlotBytes(capacity);
  if (slot != static_cast<int>(slots_.size()) || slot >= kMaxSlots ||
      capacity > kArenaBytes || arena_used_ + need > kArenaBytes)
    return false;
  auto old = names.find(name);
  if (old != names.end() && slots_[old->second].busy) return false;
  Slot s;
  s.name = name;
  s.offset = arena_used_;
  s.capacity = capacity;
  // slots_ may reallocate: kernels reach a slot only under mu_, by index.
  slots_.push_back(std::move(s));
  arena_used_ += need;
  names[name] = slot;
  return true;
}

void DirectBoard::Publish(size_t offset, size_t capacity, uint64_t round,
                          const Request* request) {
  char* post = Post(offset, capacity, round, rank_);
  PostHeader* h = HeaderOf(post);
  h->epoch = epoch_.load(std::memory_order_relaxed);
  if (!request) {
    h->kind = kJoined;
  } else {
    // A group's request describes all its tensors as one vector of their
    // total size (capi/enqueue.cc); the hash covers each tensor's own shape.
    const TensorMeta& m = request->meta;
    int64_t count = 1;
    for (int64_t d : m.shape) count *= d;
    h->dtype = static_cast<int32_t>(m.dtype);
    h->reduce_op = static_cast<int32_t>(m.reduce_op);
    h->ndim = static_cast<int32_t>(m.shape.size());
    h->parts = static_cast<int32_t>(request->parts.size());
    for (size_t i = 0; i < m.shape.size() && i < kMaxDims; ++i) h->dims[i] = m.shape[i];
    h->shape_hash = request->parts.empty()
                        ? MixShape(kShapeHashSeed, m.shape.data(), m.shape.size())
                        : request->shapes_hash;
    h->count = count;
    h->prescale = m.prescale;
    h->postscale = m.postscale;
    if (request->mixed_dtypes) {
      // No data: such a group never reduces on the board (Request::mixed_dtypes).
      h->dtype = kMixedDtypes;
      h->kind = kOversize;
      h->seq.store(round, std::memory_order_release);
      return;
    }
    const size_t esize = DataTypeSize(m.dtype);
    const size_t bytes = static_cast<size_t>(count) * esize;
    if (bytes <= capacity) {
      char* data = DataOf(post);
      if (request->parts.empty() && bytes) std::memcpy(data, request->input, bytes);
      for (const Request::Part& part : request->parts) {
        const size_t n = part.count * esize;
        if (n) std::memcpy(data, part.input, n);
        data += n;
      }
      h->kind = kData;
    } else {
      h->kind = kOversize;
    }
  }
  h->seq.store(round, std::memory_order_release);
}

DirectBoard::Begun DirectBoard::Begin(Request* request, Op* op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto& names = request->parts.empty() ? by_name_ : by_group_;
    auto it = names.find(request->name);
    if (it == names.end()) return Begun::kNotDirect;
    Slot& s = slots_[it->second];
    if (s.busy) return Begun::kInFlight;
    s.busy = true;
    op->slot = it->second;
    op->offset = s.offset;
    op->capacity = s.capacity;
    op->round = ++s.round;
  }
  Publish(op->offset, op->capacity, op->round, request);
  op->request = std::move(*request);
  op->start_us = NowMicros();
  return Begun::kPosted;
}

bool DirectBoard::Poll(Op* op, Status* status, bool* fallback) {
  thread_local std::vector<PostHeader*> posts;
  posts.resize(size_);
  for (int p = 0; p < size_; ++p) {
    posts[p] = HeaderOf(Post(op->offset, op->capacity, op->round, p));
    if (posts[p]->seq.load(std::memory_order_acquire) != op->round) return false;
  }
  *fallback = false;
  *status = Status::OK();
  const PostHeader* ref = posts[rank_];
  bool same = true;
  int contributors = 0;
  for (const PostHeader* h : posts) {
    if (h->kind == kJoined) continue;
    ++contributors;
    same = same && SameMeta(h, ref);
  }
  if (!same) {
    std::string msg = "Mismatched allreduce for tensor '" + op->request.name + "' across ranks:";
    for (int r = 0; r < size_; ++r)
      msg += (r ? "; rank " : " rank ") + std::to_string(r) + " sent " + DescribePost(posts[r]);
    *status = Status(StatusCode::kMismatch,
                     msg + ". Every rank must call the same collective with the same dtype, "
                           "op and shape.");
  } else if (ref->kind == kOversize) {
    *fallback = true;
  } else {
    ReducePosts(posts, contributors, SegmentsOf(op->request));
  }
  std::lock_guard<std::mutex> lock(mu_);
  slots_[op->slot].busy = false;
  return true;
}

std::vector<int> DirectBoard::Missing(const Op& op) const {
  std::vector<int> missing;
  for (int p = 0; p < size_; ++p)
    if (HeaderOf(Post(op.offset, op.capacity, op.round, p))
            ->seq.load(std::memory_order_acquire) != op.round)
      missing.push_back(p);
  return missing;
}

void DirectBoard::Abandon(Op* op, std::vector<int>* missing) {
  *missing = Missing(*op);
  std::lock_guard<std::mutex> lock(mu_);
  slots_[op->slot].busy = false;
}

bool DirectBoard::ServeJoined() {
  bool posted = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    Slot& s = slots_[i];
    if (s.name.empty() || s.busy) continue;
    const uint64_t next = s.round + 1;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      // Only rounds of this join: a rank that has already returned from it
      // (the join's response reached it first) posts in the next epoch.
      const PostHeader* h = HeaderOf(Post(s.offset, s.capacity, next, p));
      if (h->seq.load(std::memory_order_acquire) == next && h->kind != kJoined &&
          h->epoch == epoch_.load(std::memory_order_relaxed)) {
        Publish(s.offset, s.capacity, next, nullptr);
        s.round = next;
        posted = true;
        break;
      }
    }
  }
  return posted;
}

}  // namespace kerasdist
