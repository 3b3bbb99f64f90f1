#include "transport/shm_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

#include "algorithms/reduce.h"

namespace kerasdist {

namespace {

constexpr uint64_t kMagic = 0x31306d736473646bULL;  // "kdsdsm01"
constexpr size_t kSlotBytes = 64 * 1024;  // a multiple of every element size
constexpr uint64_t kSlots = 16;
constexpr size_t kDataOffset = 4096;
constexpr size_t kSegmentBytes = kDataOffset + kSlots * kSlotBytes;

// The head of a channel segment. The sender owns `head`, the receiver
// `tail`; they sit on separate cache lines. A slot is written before the
// release store of `head` that publishes it, and read before the release
// store of `tail` that frees it.
struct ChannelHeader {
  uint64_t magic;
  uint64_t token;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) uint64_t fragment_bytes[kSlots];
};
static_assert(sizeof(ChannelHeader) <= kDataOffset, "header too large");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory counters must be lock-free");

ChannelHeader* Header(ShmTransport::Segment* s) {
  return static_cast<ChannelHeader*>(s->addr);
}
char* Slot(ShmTransport::Segment* s, uint64_t i) {
  return static_cast<char*>(s->addr) + kDataOffset + (i % kSlots) * kSlotBytes;
}

// Fragments of a message: at least one, so that empty messages still match.
uint64_t FragmentCount(size_t bytes) {
  return std::max<uint64_t>(1, (bytes + kSlotBytes - 1) / kSlotBytes);
}

// Bytes in fragment `k` of a `bytes`-byte message (0 for an empty one).
size_t FragmentBytes(size_t bytes, uint64_t k) {
  const size_t off = std::min<size_t>(k * kSlotBytes, bytes);
  return std::min(kSlotBytes, bytes - off);
}

}  // namespace

uint64_t RandomBits() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    std::random_device rd;
    v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowMicros());
  }
  return v;
}

std::unique_ptr<ShmTransport::Segment> MapSharedSegment(const std::string& name, bool create,
                                                        size_t size, std::string* why) {
  const int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) {
    *why = std::string("shm_open failed: ") + std::strerror(errno);
    return nullptr;
  }
  bool ok = true;
  if (create) {
    // Reserve the pages now: with /dev/shm full, a lazily backed segment
    // would end in SIGBUS in the middle of training instead.
    const int rc = ftruncate(fd, size) == 0
                       ? posix_fallocate(fd, 0, size)
                       : errno;
    if (rc != 0) {
      *why = std::string("cannot reserve ") + std::to_string(size) +
             " bytes in /dev/shm: " + std::strerror(rc);
      ok = false;
    }
  } else {
    // Only a segment of our own user, private to it, of the expected size.
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0 ||
        static_cast<size_t>(st.st_size) != size) {
      *why = "segment " + name + " has the wrong owner, mode or size";
      ok = false;
    }
  }
  void* addr = ok ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  if (ok && addr == MAP_FAILED) *why = std::string("mmap failed: ") + std::strerror(errno);
  close(fd);
  if (addr == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    return nullptr;
  }
  auto seg = std::make_unique<ShmTransport::Segment>();
  seg->addr = addr;
  seg->bytes = size;
  return seg;
}

namespace {

// What each rank tells the others at setup: up to two outgoing segments.
struct SetupRecord {
  struct Offer {
    int32_t to;      // the receiving rank, or -1
    char name[64];   // the segment
    uint64_t token;  // written into that segment, to recognise it
  } offers[2];
};

std::string OfferName(const SetupRecord::Offer& o) {
  return std::string(o.name, strnlen(o.name, sizeof(o.name)));
}

}  // namespace

// An MPI transfer on a rank that also has shared-memory links: waiting on it
// keeps the shared-memory queues moving (and ShmTransfer::Test drives MPI),
// so that a ring mixing the two never waits on a link nobody drives.
class DrivenTransfer : public Transfer {
 public:
  DrivenTransfer(ShmTransport* owner, std::unique_ptr<Transfer> inner)
      : Transfer(inner->peer(), inner->bytes(), inner->is_send()),
        owner_(owner),
        inner_(std::move(inner)) {}
  bool Test() override {
    owner_->ProgressShm();
    return inner_->Test();
  }
  bool Cancel() override { return inner_->Cancel(); }
  Status status() const override { return inner_->status(); }

 private:
  ShmTransport* owner_;
  std::unique_ptr<Transfer> inner_;
};

class ShmTransfer : public Transfer {
 public:
  ShmTransfer(ShmTransport* owner, int peer, size_t bytes, bool is_send)
      : Transfer(peer, bytes, is_send), owner_(owner), fragments_(FragmentCount(bytes)) {}
  ~ShmTransfer() override {
    if (!done_) owner_->Forget(this);
  }
  bool Test() override {
    if (!done_) owner_->Progress();
    return done_;
  }
  bool Cancel() override {
    if (!done_) owner_->Forget(this);
    done_ = true;
    status_ = Status(StatusCode::kAborted, "transfer cancelled");
    return true;  // only this thread ever touches the buffer
  }
  Status status() const override { return status_; }

  ShmTransport* owner_;
  ShmTransport::Channel* channel_ = nullptr;
  const uint64_t fragments_;
  uint64_t moved_ = 0;  // fragments copied so far
  const char* src_ = nullptr;
  char* dst_ = nullptr;
  const char* first_ = nullptr;  // reduce out of place: dst = op(first, incoming)
  bool reduce_ = false;
  DataType dtype_ = DataType::kUInt8;
  ReduceOp op_ = ReduceOp::kSum;
  bool done_ = false;
  Status status_;
};

ShmTransport::Segment::~Segment() {
  if (addr) munmap(addr, bytes);
}

ShmTransport::ShmTransport(std::unique_ptr<MpiTransport> mpi) : mpi_(std::move(mpi)) {}

ShmTransport::~ShmTransport() {
  for (auto* v : {&outs_, &ins_})
    for (auto& c : *v)
      for (ShmTransfer* t : c->queue) t->done_ = true;
}

ShmTransport::Channel* ShmTransport::Find(std::vector<std::unique_ptr<Channel>>& v,
                                          int peer) const {
  for (auto& c : v)
    if (c->peer == peer) return c.get();
  return nullptr;
}

Status ShmTransport::Create(std::unique_ptr<MpiTransport> mpi, bool enabled,
                            int also_right, int64_t timeout_ms,
                            std::unique_ptr<Transport>* out) {
  if (mpi->size() == 1) {
    *out = std::move(mpi);
    return Status::OK();
  }
  // The exchanges below are collective, so a rank with shared memory
  // disabled still takes part; it just offers and maps no segment, and its
  // links fall back to MPI on both ends.
  std::unique_ptr<ShmTransport> t(new ShmTransport(std::move(mpi)));
  const int n = t->size(), me = t->rank();
  std::vector<int> targets = {(me + 1) % n};
  if (also_right >= 0 && also_right != me && also_right != targets[0])
    targets.push_back(also_right);

  // 1. Create the outgoing segments and tell everyone their names and tokens.
  SetupRecord mine{};
  for (auto& o : mine.offers) o.to = -1;
  std::vector<std::unique_ptr<Segment>> outgoing(targets.size());
  std::vector<std::string> names(targets.size());
  for (size_t i = 0; i < targets.size() && enabled; ++i) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(RandomBits()));
    names[i] = std::string("/kerasdist-") + hex;
    std::string why;
    outgoing[i] = MapSharedSegment(names[i], /*create=*/true, kSegmentBytes, &why);
    if (!outgoing[i]) {
      std::fprintf(stderr,
                   "[kerasdist] WARNING: rank %d: no shared-memory segment (%s); the link to "
                   "rank %d uses MPI instead.\n",
                   me, why.c_str(), targets[i]);
      continue;
    }
    SetupRecord::Offer& o = mine.offers[i];
    o.to = targets[i];
    o.token = RandomBits();
    auto* h = new (outgoing[i]->addr) ChannelHeader();
    h->magic = kMagic;
    h->token = o.token;
    h->head.store(0);
    h->tail.store(0);
    std::strncpy(o.name, names[i].c_str(), sizeof(o.name) - 1);
  }
  auto unlink_mine = [&] {
    for (size_t i = 0; i < targets.size(); ++i)
      if (outgoing[i]) shm_unlink(names[i].c_str());
  };
  std::vector<SetupRecord> all(n);
  Status s = t->mpi_->Allgather(&mine, sizeof(mine), all.data(), timeout_ms);
  if (!s.ok()) {
    unlink_mine();
    return s;
  }

  // 2. Map every segment offered to this rank and check that it is really
  //    the sender's (another container may have its own /dev/shm).
  struct Mapped {
    int32_t from[2];
  } mapped{{-1, -1}};
  std::vector<std::unique_ptr<Channel>> ins;
  for (int r = 0; r < n && enabled; ++r) {
    for (const auto& o : all[r].offers) {
      if (o.to != me || r == me || ins.size() == 2) continue;
      std::string why;
      auto seg = MapSharedSegment(OfferName(o), /*create=*/false, kSegmentBytes, &why);
      if (!seg || Header(seg.get())->magic != kMagic || Header(seg.get())->token != o.token)
        continue;
      auto c = std::make_unique<Channel>();
      c->peer = r;
      c->seg = std::move(seg);
      mapped.from[ins.size()] = r;
      ins.push_back(std::move(c));
    }
  }

  // 3. Agree per link: the sender uses a segment only if the receiver mapped
  //    it. Once everyone has answered, the names can go.
  std::vector<Mapped> mapped_all(n);
  s = t->mpi_->Allgather(&mapped, sizeof(mapped), mapped_all.data(), timeout_ms);
  unlink_mine();
  if (!s.ok()) {
    // A rank that died between the two exchanges left its segments behind:
    // remove every name we heard of (unlinking a removed name is harmless).
    for (const SetupRecord& rec : all)
      for (const auto& o : rec.offers)
        if (o.name[0]) shm_unlink(OfferName(o).c_str());
    return s;
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const Mapped& m = mapped_all[targets[i]];
    if (outgoing[i] && (m.from[0] == me || m.from[1] == me)) {
      auto c = std::make_unique<Channel>();
      c->peer = targets[i];
      c->seg = std::move(outgoing[i]);
      t->outs_.push_back(std::move(c));
    }
  }
  t->ins_ = std::move(ins);
  if (t->outs_.empty() && t->ins_.empty()) {
    *out = std::move(t->mpi_);  // no link uses shared memory
  } else {
    *out = std::move(t);
  }
  return Status::OK();
}

std::unique_ptr<Transfer> ShmTransport::Isend(int peer, int tag, const void* buf,
                                              size_t bytes) {
  Channel* c = tag == kTagData ? Find(outs_, peer) : nullptr;
  if (!c) return std::make_unique<DrivenTransfer>(this, mpi_->Isend(peer, tag, buf, bytes));
  auto t = std::make_unique<ShmTransfer>(this, peer, bytes, true);
  t->channel_ = c;
  t->src_ = static_cast<const char*>(buf);
  c->queue.push_back(t.get());
  PushSends(c);
  return t;
}

std::unique_ptr<Transfer> ShmTransport::Irecv(int peer, int tag, void* buf,
                                              size_t bytes) {
  Channel* c = tag == kTagData ? Find(ins_, peer) : nullptr;
  if (!c) return std::make_unique<DrivenTransfer>(this, mpi_->Irecv(peer, tag, buf, bytes));
  auto t = std::make_unique<ShmTransfer>(this, peer, bytes, false);
  t->channel_ = c;
  t->dst_ = static_cast<char*>(buf);
  c->queue.push_back(t.get());
  return t;
}

bool ShmTransport::CanRecvReduce(int peer) const {
  for (const auto& c : ins_)
    if (c->peer == peer) return true;
  return false;
}

std::unique_ptr<Transfer> ShmTransport::IrecvReduce(int peer, int tag, void* dest,
                                                    size_t bytes, DataType dtype,
                                                    ReduceOp op, const void* first) {
  Channel* c = tag == kTagData ? Find(ins_, peer) : nullptr;
  if (!c) return nullptr;
  auto t = std::make_unique<ShmTransfer>(this, peer, bytes, false);
  t->channel_ = c;
  t->dst_ = static_cast<char*>(dest);
  t->reduce_ = true;
  t->first_ = first == dest ? nullptr : static_cast<const char*>(first);
  t->dtype_ = dtype;
  t->op_ = op;
  c->queue.push_back(t.get());
  return t;
}

void ShmTransport::ProgressShm() {
  for (auto& c : outs_)
    if (!c->queue.empty()) PushSends(c.get());
  for (auto& c : ins_)
    if (!c->queue.empty()) PullRecvs(c.get());
}

void ShmTransport::Progress() {
  ProgressShm();
  mpi_->Progress();
}

void ShmTransport::PushSends(Channel* c) {
  ChannelHeader* h = Header(c->seg.get());
  uint64_t tail = h->tail.load(std::memory_order_acquire);
  while (!c->queue.empty()) {
    ShmTransfer* t = c->queue.front();
    while (t->moved_ < t->fragments_) {
      if (c->pos - tail >= kSlots) {
        tail = h->tail.load(std::memory_order_acquire);
        if (c->pos - tail >= kSlots) return;  // full: the receiver is behind
      }
      const size_t off = t->moved_ * kSlotBytes;
      const size_t n = FragmentBytes(t->bytes(), t->moved_);
      if (n) std::memcpy(Slot(c->seg.get(), c->pos), t->src_ + off, n);
      h->fragment_bytes[c->pos % kSlots] = n;
      ++c->pos;
      h->head.store(c->pos, std::memory_order_release);
      ++t->moved_;
    }
    t->done_ = true;
    c->queue.pop_front();
  }
}

void ShmTransport::PullRecvs(Channel* c) {
  ChannelHeader* h = Header(c->seg.get());
  uint64_t head = h->head.load(std::memory_order_acquire);
  while (!c->queue.empty()) {
    ShmTransfer* t = c->queue.front();
    while (t->moved_ < t->fragments_ && c->broken.ok()) {
      if (c->pos == head) {
        head = h->head.load(std::memory_order_acquire);
        if (c->pos == head) return;  // nothing new from the sender
      }
      const size_t off = t->moved_ * kSlotBytes;
      const size_t want = FragmentBytes(t->bytes(), t->moved_);
      const size_t got = h->fragment_bytes[c->pos % kSlots];
      if (got != want) {
        // Both ends post the same sizes in the same order; anything else
        // means the stream is out of step and nothing after it can be used.
        c->broken = Status(StatusCode::kInternal,
                           "shared-memory stream from rank " + std::to_string(c->peer) +
                               " is out of step: expected a fragment of " +
                               std::to_string(want) + " bytes, received " +
                               std::to_string(got));
        break;
      }
      const char* src = Slot(c->seg.get(), c->pos);
      if (got && t->reduce_) {
        const size_t elem = DataTypeSize(t->dtype_);
        if (t->first_) {
          ReduceFrom(t->dst_ + off, t->first_ + off, src, got / elem, t->dtype_, t->op_);
        } else {
          ReduceInto(t->dst_ + off, src, got / elem, t->dtype_, t->op_);
        }
      } else if (got) {
        std::memcpy(t->dst_ + off, src, got);
      }
      ++c->pos;
      h->tail.store(c->pos, std::memory_order_release);
      ++t->moved_;
    }
    if (!c->broken.ok()) t->status_ = c->broken;
    t->done_ = true;
    c->queue.pop_front();
  }
}

void ShmTransport::Forget(ShmTransfer* t) {
  if (!t->channel_) return;
  auto& q = t->channel_->queue;
  q.erase(std::remove(q.begin(), q.end(), t), q.end());
}

bool ShmTransport::Probe(int tag, int* peer, size_t* bytes) {
  return mpi_->Probe(tag, peer, bytes);
}

Status ShmTransport::RecvProbed(int peer, int tag, void* buf, size_t bytes) {
  return mpi_->RecvProbed(peer, tag, buf, bytes);
}

std::string ShmTransport::Name() const {
  std::string links;
  for (const auto& c : outs_) links += (links.empty() ? " to rank " : ", to rank ") + std::to_string(c->peer);
  for (const auto& c : ins_) links += (links.empty() ? " from rank " : ", from rank ") + std::to_string(c->peer);
  return mpi_->Name() + (links.empty() ? "" : "; shared memory" + links);
}

}  // namespace kerasdist
