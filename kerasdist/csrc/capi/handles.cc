// The C API's handles (kerasdist.h): poll, a bounded wait, the status, the
// outputs the negotiation sized, and release.
#include <chrono>
#include <cstring>
#include <thread>

#include "capi/current.h"
#include "capi/handle.h"
#include "capi/kerasdist.h"
#include "transport/transport.h"

extern "C" {

int32_t kerasdist_handle_poll(kerasdist_handle* h) { return h->Done() ? 1 : 0; }

int32_t kerasdist_handle_wait(kerasdist_handle* h, int64_t timeout_ms) {
  // A small collective often finishes within the engine's spin: poll that
  // long before sleeping on the condition variable, as the engine does.
  if (!h->Done() && h->spin_us > 0) {
    const int64_t until = kerasdist::NowMicros() + h->spin_us;
    while (!h->Done() && kerasdist::NowMicros() < until) std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lock(h->mu);
  if (timeout_ms < 0) {
    h->cv.wait(lock, [h] { return h->Done(); });
  } else if (!h->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                             [h] { return h->Done(); })) {
    return KERASDIST_PENDING;
  }
  return h->code;
}

int32_t kerasdist_handle_status(kerasdist_handle* h, char* buf, int32_t len) {
  if (!h->Done()) {
    kerasdist::CopyMessage("", buf, len);
    return KERASDIST_PENDING;
  }
  kerasdist::CopyMessage(h->message, buf, len);
  return h->code;
}

int32_t kerasdist_handle_shape(kerasdist_handle* h, int32_t index, int64_t* dims,
                               int32_t max) {
  if (!h->Done() || index < 0 || index >= static_cast<int32_t>(h->outputs.size())) return -1;
  const auto& out = h->outputs[index];
  if (!out.has_shape) return -1;
  const int32_t ndim = static_cast<int32_t>(out.shape.size());
  for (int32_t d = 0; d < ndim && d < max; ++d) dims[d] = out.shape[d];
  return ndim;
}

int32_t kerasdist_handle_copy_output(kerasdist_handle* h, int32_t index, void* dst,
                                     int64_t bytes) {
  if (!h->Done() || index < 0 || index >= static_cast<int32_t>(h->outputs.size())) return -1;
  const auto& data = h->outputs[index].data;
  if (static_cast<int64_t>(data.size()) != bytes) return -1;
  if (bytes) std::memcpy(dst, data.data(), data.size());
  return 0;
}

int32_t kerasdist_handle_received_splits(kerasdist_handle* h, int32_t index, int32_t* out,
                                         int32_t max) {
  if (!h->Done() || index < 0 || index >= static_cast<int32_t>(h->outputs.size())) return -1;
  const auto& splits = h->outputs[index].received_splits;
  const int32_t n = static_cast<int32_t>(splits.size());
  for (int32_t i = 0; i < n && i < max; ++i) out[i] = splits[i];
  return n;
}

int32_t kerasdist_handle_join_result(kerasdist_handle* h) {
  if (!h->Done() || h->outputs.empty()) return -1;
  return h->outputs[0].join_result;
}

void kerasdist_handle_release(kerasdist_handle* h) {
  if (!h) return;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    if (!h->Done()) {
      h->released = true;  // Complete() frees it
      return;
    }
  }
  delete h;
}

}  // extern "C"
