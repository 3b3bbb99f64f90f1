#include "mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

namespace kerasdist {

namespace {

// MPI counts are int; larger ranges travel as several messages.
constexpr size_t kMaxMessageBytes = size_t{1} << 30;

class MpiTransfer : public Transfer {
 public:
  MpiTransfer(int peer, size_t bytes, bool is_send)
      : Transfer(peer, bytes, is_send) {}
  bool Test() override {
    if (requests_.empty()) return true;
    int flag = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                MPI_STATUSES_IGNORE);
    if (flag) requests_.clear();
    return flag != 0;
  }
  void Cancel() override {
    for (auto& r : requests_) {
      if (r != MPI_REQUEST_NULL && !is_send()) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    }
    requests_.clear();
  }
  std::vector<MPI_Request> requests_;
};

}  // namespace

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SleepMicros(int64_t us) {
  std::this_thread::sleep_for(std::chrono::microseconds(us));
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
                        std::to_string(t->peer()));
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
                      " ms waiting for all ranks to call init()");
  }
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

std::unique_ptr<Transfer> MpiTransport::Isend(int peer, int tag,
                                              const void* buf, size_t bytes) {
  auto t = std::make_unique<MpiTransfer>(peer, bytes, true);
  const char* p = static_cast<const char*>(buf);
  size_t offset = 0;
  do {
    const size_t n = std::min(kMaxMessageBytes, bytes - offset);
    MPI_Request r;
    MPI_Isend(p + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r);
    t->requests_.push_back(r);
    offset += n;
  } while (offset < bytes);
  return t;
}

std::unique_ptr<Transfer> MpiTransport::Irecv(int peer, int tag, void* buf,
                                              size_t bytes) {
  auto t = std::make_unique<MpiTransfer>(peer, bytes, false);
  char* p = static_cast<char*>(buf);
  size_t offset = 0;
  do {
    const size_t n = std::min(kMaxMessageBytes, bytes - offset);
    MPI_Request r;
    MPI_Irecv(p + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r);
    t->requests_.push_back(r);
    offset += n;
  } while (offset < bytes);
  return t;
}

bool MpiTransport::Probe(int tag, int* peer, size_t* bytes) {
  int flag = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &status);
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
  int rc = MPI_Recv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_,
                    MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    return Status(StatusCode::kInternal,
                  "MPI_Recv of a control message from rank " +
                      std::to_string(peer) + " failed");
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
