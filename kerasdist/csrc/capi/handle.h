// Internal to the engine library: the completion of one
// kerasdist_enqueue() batch (a callback or a handle) and the handle's state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capi/kerasdist.h"
#include "common/common.h"
#include "engine/inline_wait.h"

// What a handle holds for each request of its batch: the output shape once
// known and, for outputs sized by the negotiation that no `allocate`
// callback took, the output itself.
struct kerasdist_handle {
  struct Output {
    std::vector<int64_t> shape;
    bool has_shape = false;
    std::vector<char> data;
    std::vector<int32_t> received_splits;
    int32_t join_result = -1;
  };
  explicit kerasdist_handle(int32_t count) : outputs(count) {}

  // Completes the handle (once); frees it if it was already released.
  void Complete(int32_t code, const std::string& message);
  bool Done() const { return done.load(std::memory_order_acquire); }

  std::vector<Output> outputs;  // written by engine threads before Complete()
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  int32_t code = KERASDIST_OK;  // set before `done`
  std::string message;
  bool released = false;  // under mu
  int64_t spin_us = 0;    // how long kerasdist_handle_wait() polls first
};

namespace kerasdist {

// Counts a batch's requests down to its one completion: the first error
// wins; then `done` runs, or the handle completes. With an inline wait
// (KERASDIST_INLINE), the caller's thread may take the completion over.
class Batch {
 public:
  Batch(int32_t count, kerasdist_done_fn done, void* user, kerasdist_handle* handle)
      : remaining_(count), done_(done), user_(user), handle_(handle) {}

  // One request finished with `s`.
  void Complete(const Status& s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (code_ == KERASDIST_OK) {
        code_ = static_cast<int32_t>(s.code());
        message_ = s.message();
      }
    }
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) Finish();
  }
  // Fails the whole batch before any request was enqueued.
  void FailEarly(const Status& s) {
    code_ = static_cast<int32_t>(s.code());
    message_ = s.message();
    Deliver();
  }
  // Runs `done` or completes the handle, unless the caller's thread still
  // waits inline and so takes it over (inline_wait.h).
  void Finish() {
    if (wait_) {
      int running = 0;
      if (wait_->compare_exchange_strong(running, 1, std::memory_order_acq_rel)) return;
    }
    Deliver();
  }
  void Deliver() {
    if (done_) {
      done_(user_, code_, message_.c_str());
    } else {
      handle_->Complete(code_, message_);
    }
  }
  void set_wait(InlineWait wait) { wait_ = std::move(wait); }
  const InlineWait& wait() const { return wait_; }

 private:
  std::atomic<int32_t> remaining_;
  std::mutex mu_;
  int32_t code_ = KERASDIST_OK;
  std::string message_;
  kerasdist_done_fn done_;
  void* user_;
  kerasdist_handle* handle_;
  InlineWait wait_;
};

}  // namespace kerasdist
