#include "transport/mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

namespace kerasdist {

namespace {

// MPI counts are int; larger ranges travel as several messages.
constexpr size_t kMaxMessageBytes = size_t{1} << 30;

}  // namespace

// Bound on confirming that MPI has let go of a cancelled request's buffer.
static constexpr int64_t kCancelBoundUs = 500 * 1000;

static std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return std::to_string(code);
  return std::string(text, len);
}

class MpiTransfer : public Transfer {
 public:
  MpiTransfer(MpiTransport* owner, int peer, size_t bytes, bool is_send)
      : Transfer(peer, bytes, is_send), owner_(owner) {}
  ~MpiTransfer() override {
    if (!requests_.empty()) Cancel();
    owner_->Forget(this);
  }
  bool Test() override {
    if (requests_.empty()) return true;
    int flag = 0;
    statuses_.resize(requests_.size());
    const int rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(),
                               &flag, statuses_.data());
    if (rc != MPI_SUCCESS) {
      // MPI_ERR_IN_STATUS: the failed requests are complete, the others may
      // not be; they are cancelled so that nothing touches the buffer later.
      std::string why = MpiError(rc);
      if (rc == MPI_ERR_IN_STATUS) {
        for (const MPI_Status& st : statuses_)
          if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) {
            why = MpiError(st.MPI_ERROR);
            break;
          }
      }
      Fail("MPI reported an error " + Direction() + ": " + why);
      bool all_done = true;
      for (auto& r : requests_) all_done &= r == MPI_REQUEST_NULL;
      if (!all_done) Cancel();
      requests_.clear();
      owner_->Forget(this);
      return true;
    }
    if (!flag) return false;
    if (!is_send()) {
      // A shorter message than posted means the ranks are out of step.
      size_t got = 0;
      for (const MPI_Status& st : statuses_) {
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        got += static_cast<size_t>(count);
      }
      if (got != bytes())
        Fail("expected " + std::to_string(bytes()) + " bytes from rank " +
             std::to_string(peer()) + " but received " + std::to_string(got) +
             ": the ranks are out of step");
    }
    requests_.clear();
    owner_->Forget(this);
    return true;
  }
  bool Cancel() override {
    bool confirmed = true;
    const int64_t deadline = owner_->CancelDeadline();
    for (auto& r : requests_) {
      if (r == MPI_REQUEST_NULL) continue;
      // Sends are never cancelled (deprecated in MPI-4, and MPICH's UCX
      // path crashes on it): a send is given the same bounded chance to
      // finish, then left to MPI.
      if (!is_send()) MPI_Cancel(&r);
      int flag = 0;
      while (true) {
        if (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) break;
        if (NowMicros() > deadline) break;
        SleepMicros(50);
      }
      if (!flag && r != MPI_REQUEST_NULL) {
        owner_->zombies_.push_back(r);  // MPI may still use the buffer
        confirmed = false;
      }
      r = MPI_REQUEST_NULL;
    }
    requests_.clear();
    owner_->Forget(this);
    if (status_.ok()) status_ = Status(StatusCode::kAborted, "transfer cancelled");
    return confirmed;
  }
  Status status() const override { return status_; }
  void Fail(const std::string& why) {
    if (status_.ok()) status_ = Status(StatusCode::kAborted, why);
  }
  std::string Direction() const {
    return std::string(is_send() ? "sending " : "receiving ") +
           std::to_string(bytes()) + " bytes " + (is_send() ? "to" : "from") +
           " rank " + std::to_string(peer());
  }
  MpiTransport* owner_;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  Status status_;
};

Status WaitTransfers(std::vector<std::unique_ptr<Transfer>>* transfers, int64_t timeout_ms) {
  for (size_t i = 0; i < transfers->size(); ++i) {
    Status s = WaitTransfer((*transfers)[i].get(), timeout_ms);
    if (!s.ok()) {
      for (size_t j = i + 1; j < transfers->size(); ++j) (*transfers)[j]->Cancel();
      return s;
    }
  }
  transfers->clear();
  return Status::OK();
}

Status WaitTransfer(Transfer* t, int64_t timeout_ms) {
  const int64_t start = NowMicros();
  const int64_t deadline = start + timeout_ms * 1000;
  int64_t sleep_us = 0;
  while (!t->Test()) {
    const int64_t now = NowMicros();
    if (now > deadline) {
      t->Cancel();
      return Status(StatusCode::kTimeout,
                    "timed out after " + std::to_string(timeout_ms) + " ms " +
                        (t->is_send() ? "sending " : "receiving ") +
                        std::to_string(t->bytes()) + " bytes " +
                        (t->is_send() ? "to" : "from") + " rank " +
                        std::to_string(t->peer()))
          .set_peer(t->peer());
    }
    // Every Test() drives the MPI progress engine, and a transfer that MPI
    // moves through shared memory in small fragments advances only while we
    // poll: sleeping between polls once cost 30x at 16 MiB. Poll (yielding
    // the core to runnable threads) for the first kSpinUs, which covers any
    // healthy transfer, and only then back off with short sleeps.
    constexpr int64_t kSpinUs = 2000;
    if (now - start < kSpinUs) {
      std::this_thread::yield();
    } else {
      sleep_us = std::min<int64_t>(100, sleep_us ? sleep_us * 2 : 5);
      SleepMicros(sleep_us);
    }
  }
  return t->status();
}

// Polls a setup request (init time only, not the data path) until it
// completes or `timeout_ms` passes; returns whether it completed.
static bool WaitRequest(MPI_Request* req, int64_t timeout_ms) {
  const int64_t deadline = NowMicros() + timeout_ms * 1000;
  int flag = 0;
  while (true) {
    MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (flag) return true;
    if (NowMicros() > deadline) return false;
    SleepMicros(100);
  }
}

// After init()'s duplicate timed out: every rank whose own timed out says so
// to all the others on `comm` (empty messages, a tag of our own), and for a
// bounded window listens for theirs. The ranks not heard from are the ones
// that never reached init() or stopped in it. Returns the text naming them.
static std::string InitRollCall(MPI_Comm comm, int rank, int size) {
  constexpr int kInitRollTag = 32107;  // common/basics.py drops strays before MPI_Finalize
  static char none[1];
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    // Never waited for: a rank that never answers never receives it either.
    if (MPI_Isend(none, 0, MPI_BYTE, r, kInitRollTag, comm, &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
  std::vector<bool> heard(size, false);
  heard[rank] = true;
  int missing = size - 1;
  const int64_t start = NowMicros();
  while (missing > 0 && NowMicros() - start < 2000000) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kInitRollTag, comm, &flag, &status) != MPI_SUCCESS) break;
    if (!flag) {
      SleepMicros(1000);
      continue;
    }
    const int src = status.MPI_SOURCE;
    MPI_Recv(none, 0, MPI_BYTE, src, kInitRollTag, comm, MPI_STATUS_IGNORE);
    if (src >= 0 && src < size && !heard[src]) {
      heard[src] = true;
      --missing;
    }
  }
  std::string lost, alive;
  int n_lost = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::string& list = heard[r] ? alive : lost;
    list += (list.empty() ? "" : ", ") + std::to_string(r);
    n_lost += heard[r] ? 0 : 1;
  }
  if (n_lost == 0) return "; every rank answered a roll call, so all of them are in init()";
  return std::string("; ") + (n_lost == 1 ? "rank " : "ranks ") + lost +
         " did not answer a roll call within 2 s (never reached init(), or stopped)" +
         (alive.empty() ? "" : "; the others did");
}

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status MpiTransport::Create(MPI_Comm comm, int64_t timeout_ms,
                            std::unique_ptr<MpiTransport>* out) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return Status(StatusCode::kInvalidArgument,
                  "MPI is not initialized; import mpi4py.MPI first");
  }
  // Python threads may call MPI (mpi4py) while the engine thread does.
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    return Status(StatusCode::kInvalidArgument,
                  "MPI was initialized without MPI_THREAD_MULTIPLE (thread level " +
                      std::to_string(provided) +
                      "), but kerasdist's engine thread calls MPI while Python "
                      "threads may too. Let mpi4py initialize MPI with its default "
                      "thread level (do not set mpi4py.rc.thread_level), or use an "
                      "MPI built with thread support.");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Comm_idup(comm, &dup, &req) != MPI_SUCCESS) {
    return Status(StatusCode::kInternal, "MPI_Comm_idup failed");
  }
  if (!WaitRequest(&req, timeout_ms)) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    return Status(StatusCode::kTimeout,
                  "rank " + std::to_string(rank) + "/" + std::to_string(size) +
                      ": timed out after " + std::to_string(timeout_ms) +
                      " ms waiting for all ranks to call init()" +
                      InitRollCall(comm, rank, size));
  }
  // Errors come back as return codes on this communicator, whatever the
  // application chose for its own: every call's code is checked.
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  out->reset(new MpiTransport(dup));
  return Status::OK();
}

Status MpiTransport::Allgather(const void* mine, size_t bytes, void* all,
                               int64_t timeout_ms) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Iallgather(mine, static_cast<int>(bytes), MPI_BYTE, all,
                     static_cast<int>(bytes), MPI_BYTE, comm_, &req) != MPI_SUCCESS) {
    return Status(StatusCode::kInternal, "MPI_Iallgather failed");
  }
  if (WaitRequest(&req, timeout_ms)) return Status::OK();
  return Status(StatusCode::kTimeout,
                "rank " + std::to_string(rank_) + "/" + std::to_string(size_) +
                    ": timed out after " + std::to_string(timeout_ms) +
                    " ms exchanging transport setup with the other ranks");
}

MpiTransport::~MpiTransport() {
  // The communicator is deliberately not freed. At shutdown a rank may have
  // sent a control message that its peer, already stopped, never receives.
  // MPI would recycle the freed context id for the next init()'s duplicate
  // and deliver that stale message to the new engine. One communicator per
  // init()/shutdown() cycle is a small price for never crossing the streams.
}

std::unique_ptr<Transfer> MpiTransport::Post(int peer, int tag, char* buf,
                                             size_t bytes, bool is_send) {
  auto t = std::make_unique<MpiTransfer>(this, peer, bytes, is_send);
  size_t offset = 0;
  do {
    const size_t n = std::min(kMaxMessageBytes, bytes - offset);
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc =
        is_send ? MPI_Isend(buf + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r)
                : MPI_Irecv(buf + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r);
    if (rc != MPI_SUCCESS) {
      t->Fail(std::string(is_send ? "MPI_Isend" : "MPI_Irecv") + " failed " +
              t->Direction() + ": " + MpiError(rc));
      break;
    }
    t->requests_.push_back(r);
    offset += n;
  } while (offset < bytes);
  if (!t->status().ok() && !t->requests_.empty()) t->Cancel();
  if (!t->requests_.empty()) live_.push_back(t.get());
  return t;
}

std::unique_ptr<Transfer> MpiTransport::Isend(int peer, int tag,
                                              const void* buf, size_t bytes) {
  // MPI_Isend takes a const buffer; the cast only shares Post() with Irecv.
  return Post(peer, tag, const_cast<char*>(static_cast<const char*>(buf)), bytes, true);
}

std::unique_ptr<Transfer> MpiTransport::Irecv(int peer, int tag, void* buf,
                                              size_t bytes) {
  return Post(peer, tag, static_cast<char*>(buf), bytes, false);
}

int64_t MpiTransport::CancelDeadline() {
  // One budget for a burst of cancellations (a failed ring cancels hundreds
  // of segments at once), so that a failure costs kCancelBoundUs, not that
  // per segment.
  const int64_t now = NowMicros();
  if (now > cancel_deadline_us_ + 5 * kCancelBoundUs) cancel_deadline_us_ = now + kCancelBoundUs;
  return cancel_deadline_us_;
}

void MpiTransport::Forget(MpiTransfer* t) {
  live_.erase(std::remove(live_.begin(), live_.end(), t), live_.end());
}

void MpiTransport::Progress() {
  // Testing any request drives MPI's progress engine for all of them.
  if (!live_.empty()) live_.front()->Test();
  // A cancellation that MPI confirms late makes its buffer safe again.
  for (size_t i = 0; i < zombies_.size();) {
    int flag = 0;
    MPI_Test(&zombies_[i], &flag, MPI_STATUS_IGNORE);
    if (flag || zombies_[i] == MPI_REQUEST_NULL) {
      zombies_.erase(zombies_.begin() + i);
    } else {
      ++i;
    }
  }
}

bool MpiTransport::Probe(int tag, int* peer, size_t* bytes) {
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &status) != MPI_SUCCESS) return false;
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  *peer = status.MPI_SOURCE;
  *bytes = static_cast<size_t>(count);
  return true;
}

Status MpiTransport::RecvProbed(int peer, int tag, void* buf, size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    return Status(StatusCode::kInternal, "control message too large");
  }
  MPI_Status status;
  int rc = MPI_Recv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &status);
  int count = 0;
  if (rc == MPI_SUCCESS) MPI_Get_count(&status, MPI_BYTE, &count);
  if (rc != MPI_SUCCESS || static_cast<size_t>(count) != bytes) {
    return Status(StatusCode::kInternal,
                  "MPI_Recv of a control message from rank " + std::to_string(peer) +
                      " failed: " + (rc != MPI_SUCCESS ? MpiError(rc)
                                                       : "truncated to " +
                                                             std::to_string(count) + " bytes"));
  }
  return Status::OK();
}

std::string MpiTransport::Name() const {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, len);
  auto nl = v.find('\n');
  if (nl != std::string::npos) v = v.substr(0, nl);
  return "mpi(" + v + ")";
}

}  // namespace kerasdist
