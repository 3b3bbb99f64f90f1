// Chrome-trace ("Trace Event Format") writer for the engine's activity:
// negotiation per tensor, fusion-buffer copies and the ring's phases. The
// file opens in Perfetto or chrome://tracing. The engine thread writes, and
// so do kernels that finish an allreduce on the direct board: Event() and
// Close() are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace kerasdist {

enum TimelineRow : int {
  kRowNegotiation = 1,
  kRowCopies = 2,
  kRowCollective = 3,
};

class Timeline {
 public:
  ~Timeline() { Close(); }
  // Opens `path` for writing; returns false (and stays disabled) on failure.
  bool Open(const std::string& path, int rank);
  bool enabled() const { return file_.load(std::memory_order_relaxed) != nullptr; }
  // A complete event from start_us to end_us (NowMicros() clock), with one
  // string argument: `args.<key>` = value (by default the tensors' names).
  void Event(const std::string& name, int row, int64_t start_us,
             int64_t end_us, const std::string& value,
             const char* key = "tensors");
  void Close();

 private:
  std::mutex mu_;
  std::atomic<std::FILE*> file_{nullptr};
  int rank_ = 0;
  int64_t origin_us_ = 0;
};

}  // namespace kerasdist
