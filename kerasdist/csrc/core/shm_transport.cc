#include "shm_transport.h"

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

#include "reduce.h"

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

// 64 random bits for segment names and tokens, so that neither can be
// guessed by another user of /dev/shm.
uint64_t RandomBits() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    std::random_device rd;
    v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowMicros());
  }
  return v;
}

std::unique_ptr<ShmTransport::Segment> MapSegment(const std::string& name,
                                                  bool create, std::string* why) {
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
    const int rc = ftruncate(fd, kSegmentBytes) == 0
                       ? posix_fallocate(fd, 0, kSegmentBytes)
                       : errno;
    if (rc != 0) {
      *why = std::string("cannot reserve ") + std::to_string(kSegmentBytes) +
             " bytes in /dev/shm: " + std::strerror(rc);
      ok = false;
    }
  } else {
    // Only a segment of our own user, private to it, of the expected size.
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0 ||
        static_cast<size_t>(st.st_size) != kSegmentBytes) {
      *why = "segment " + name + " has the wrong owner, mode or size";
      ok = false;
    }
  }
  void* addr = ok ? mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  if (ok && addr == MAP_FAILED) *why = std::string("mmap failed: ") + std::strerror(errno);
  close(fd);
  if (addr == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    return nullptr;
  }
  auto seg = std::make_unique<ShmTransport::Segment>();
  seg->addr = addr;
  seg->bytes = kSegmentBytes;
  return seg;
}

// What each rank tells the others at setup.
struct SetupRecord {
  char name[64];   // its outgoing segment, or empty
  uint64_t token;  // written into that segment, to recognise it
};

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
  const uint64_t fragments_;
  uint64_t moved_ = 0;  // fragments copied so far
  const char* src_ = nullptr;
  char* dst_ = nullptr;
  bool reduce_ = false;
  DataType dtype_ = DataType::kUInt8;
  ReduceOp op_ = ReduceOp::kSum;
  bool done_ = false;
  Status status_;
};

ShmTransport::Segment::~Segment() {
  if (addr) munmap(addr, bytes);
}

ShmTransport::ShmTransport(std::unique_ptr<MpiTransport> mpi) : mpi_(std::move(mpi)) {
  right_ = (rank() + 1) % size();
  left_ = (rank() + size() - 1) % size();
}

ShmTransport::~ShmTransport() {
  for (ShmTransfer* t : sends_) t->done_ = true;
  for (ShmTransfer* t : recvs_) t->done_ = true;
}

Status ShmTransport::Create(std::unique_ptr<MpiTransport> mpi, bool enabled,
                            int64_t timeout_ms, std::unique_ptr<Transport>* out) {
  if (mpi->size() == 1) {
    *out = std::move(mpi);
    return Status::OK();
  }
  // The exchange below is collective, so a rank with shared memory disabled
  // still takes part; it just offers and maps no segment, and its links fall
  // back to MPI on both ends.
  std::unique_ptr<ShmTransport> t(new ShmTransport(std::move(mpi)));
  const int n = t->size();

  // 1. Create the outgoing segment and tell everyone its name and token.
  SetupRecord mine{};
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(RandomBits()));
  const std::string name = std::string("/kerasdist-") + hex;
  std::string why;
  auto outgoing = enabled ? MapSegment(name, /*create=*/true, &why) : nullptr;
  if (enabled && !outgoing) {
    std::fprintf(stderr,
                 "[kerasdist] WARNING: rank %d: no shared-memory segment (%s); the link to "
                 "rank %d uses MPI instead.\n",
                 t->rank(), why.c_str(), t->right_);
  }
  if (outgoing) {
    mine.token = RandomBits();
    auto* h = new (outgoing->addr) ChannelHeader();
    h->magic = kMagic;
    h->token = mine.token;
    h->head.store(0);
    h->tail.store(0);
    std::strncpy(mine.name, name.c_str(), sizeof(mine.name) - 1);
  }
  std::vector<SetupRecord> all(n);
  Status s = t->mpi_->Allgather(&mine, sizeof(mine), all.data(), timeout_ms);
  if (!s.ok()) {
    if (outgoing) shm_unlink(name.c_str());
    return s;
  }

  // 2. Map the left neighbour's segment and check that it is really theirs
  //    (another container may have its own /dev/shm).
  const SetupRecord& lrec = all[t->left_];
  std::unique_ptr<Segment> in;
  if (enabled && lrec.name[0]) {
    in = MapSegment(std::string(lrec.name, strnlen(lrec.name, sizeof(lrec.name))),
                    /*create=*/false, &why);
    if (in && (Header(in.get())->magic != kMagic ||
               Header(in.get())->token != lrec.token)) {
      in.reset();
    }
  }

  // 3. Agree per link: the sender uses its segment only if the receiver
  //    mapped it. Once everyone has answered, the names can go.
  int32_t mapped = in ? 1 : 0;
  std::vector<int32_t> mapped_all(n);
  s = t->mpi_->Allgather(&mapped, sizeof(mapped), mapped_all.data(), timeout_ms);
  if (outgoing) shm_unlink(name.c_str());
  if (!s.ok()) {
    // A rank that died between the two exchanges left its segment behind:
    // remove every name we heard of (unlinking a removed name is harmless).
    for (const SetupRecord& rec : all)
      if (rec.name[0]) shm_unlink(std::string(rec.name, strnlen(rec.name, sizeof(rec.name))).c_str());
    return s;
  }
  if (outgoing && mapped_all[t->right_]) t->out_ = std::move(outgoing);
  t->in_ = std::move(in);
  if (!t->out_ && !t->in_) {
    *out = std::move(t->mpi_);  // no link uses shared memory
  } else {
    *out = std::move(t);
  }
  return Status::OK();
}

std::unique_ptr<Transfer> ShmTransport::Isend(int peer, int tag, const void* buf,
                                              size_t bytes) {
  if (tag != kTagData || peer != right_ || !out_)
    return std::make_unique<DrivenTransfer>(this, mpi_->Isend(peer, tag, buf, bytes));
  auto t = std::make_unique<ShmTransfer>(this, peer, bytes, true);
  t->src_ = static_cast<const char*>(buf);
  sends_.push_back(t.get());
  PushSends();
  return t;
}

std::unique_ptr<Transfer> ShmTransport::Irecv(int peer, int tag, void* buf,
                                              size_t bytes) {
  if (tag != kTagData || peer != left_ || !in_)
    return std::make_unique<DrivenTransfer>(this, mpi_->Irecv(peer, tag, buf, bytes));
  auto t = std::make_unique<ShmTransfer>(this, peer, bytes, false);
  t->dst_ = static_cast<char*>(buf);
  recvs_.push_back(t.get());
  return t;
}

bool ShmTransport::CanRecvReduce(int peer) const { return peer == left_ && in_ != nullptr; }

std::unique_ptr<Transfer> ShmTransport::IrecvReduce(int peer, int tag, void* dest,
                                                    size_t bytes, DataType dtype,
                                                    ReduceOp op) {
  if (tag != kTagData || !CanRecvReduce(peer)) return nullptr;
  auto t = std::make_unique<ShmTransfer>(this, peer, bytes, false);
  t->dst_ = static_cast<char*>(dest);
  t->reduce_ = true;
  t->dtype_ = dtype;
  t->op_ = op;
  recvs_.push_back(t.get());
  return t;
}

void ShmTransport::ProgressShm() {
  if (!sends_.empty()) PushSends();
  if (!recvs_.empty()) PullRecvs();
}

void ShmTransport::Progress() {
  ProgressShm();
  mpi_->Progress();
}

void ShmTransport::PushSends() {
  ChannelHeader* h = Header(out_.get());
  uint64_t tail = h->tail.load(std::memory_order_acquire);
  while (!sends_.empty()) {
    ShmTransfer* t = sends_.front();
    while (t->moved_ < t->fragments_) {
      if (out_head_ - tail >= kSlots) {
        tail = h->tail.load(std::memory_order_acquire);
        if (out_head_ - tail >= kSlots) return;  // full: the receiver is behind
      }
      const size_t off = t->moved_ * kSlotBytes;
      const size_t n = FragmentBytes(t->bytes(), t->moved_);
      if (n) std::memcpy(Slot(out_.get(), out_head_), t->src_ + off, n);
      h->fragment_bytes[out_head_ % kSlots] = n;
      ++out_head_;
      h->head.store(out_head_, std::memory_order_release);
      ++t->moved_;
    }
    t->done_ = true;
    sends_.pop_front();
  }
}

void ShmTransport::PullRecvs() {
  ChannelHeader* h = Header(in_.get());
  uint64_t head = h->head.load(std::memory_order_acquire);
  while (!recvs_.empty()) {
    ShmTransfer* t = recvs_.front();
    while (t->moved_ < t->fragments_ && broken_.ok()) {
      if (in_tail_ == head) {
        head = h->head.load(std::memory_order_acquire);
        if (in_tail_ == head) return;  // nothing new from the sender
      }
      const size_t off = t->moved_ * kSlotBytes;
      const size_t want = FragmentBytes(t->bytes(), t->moved_);
      const size_t got = h->fragment_bytes[in_tail_ % kSlots];
      if (got != want) {
        // Both ends post the same sizes in the same order; anything else
        // means the stream is out of step and nothing after it can be used.
        broken_ = Status(StatusCode::kInternal,
                         "shared-memory stream from rank " + std::to_string(left_) +
                             " is out of step: expected a fragment of " +
                             std::to_string(want) + " bytes, received " +
                             std::to_string(got));
        break;
      }
      const char* src = Slot(in_.get(), in_tail_);
      if (got && t->reduce_) {
        const size_t elem = DataTypeSize(t->dtype_);
        ReduceInto(t->dst_ + off, src, got / elem, t->dtype_, t->op_);
      } else if (got) {
        std::memcpy(t->dst_ + off, src, got);
      }
      ++in_tail_;
      h->tail.store(in_tail_, std::memory_order_release);
      ++t->moved_;
    }
    if (!broken_.ok()) t->status_ = broken_;
    t->done_ = true;
    recvs_.pop_front();
  }
}

void ShmTransport::Forget(ShmTransfer* t) {
  auto& q = t->is_send() ? sends_ : recvs_;
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
  if (out_) links += " to rank " + std::to_string(right_);
  if (in_) links += std::string(out_ ? "," : "") + " from rank " + std::to_string(left_);
  return mpi_->Name() + (links.empty() ? "" : "; shared memory" + links);
}

}  // namespace kerasdist
