// Finishing a collective on the caller's own thread (the C API's
// KERASDIST_INLINE flag, used by the TensorFlow kernels).
//
// When the engine has nothing else to do, a caller waits for its
// collective, polling for at most KERASDIST_SPIN_MICROSECONDS, and calls
// done() itself: TensorFlow, for one, then runs the next op on this thread
// instead of waking another for it. Otherwise, or once the wait runs out or other
// requests arrive, the engine's thread calls done() as usual.
//
// Use: `auto wait = Handoff(engine)`, give the requests `Finisher(wait,
// done)` in place of `done`, enqueue them, then `WaitInline(...)`. A kernel
// that returns before it enqueues calls its own `done` as before.
// State: 0 running; 1 finished, the kernel calls done(); 2 the kernel
// stopped waiting, the finisher calls done(). Exactly one of the two
// threads calls done().
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "engine/engine.h"

namespace kerasdist {

using InlineWait = std::shared_ptr<std::atomic<int>>;

inline InlineWait Handoff(const Engine& engine) {
  if (engine.spin_us() <= 0 || engine.open() > 0) return nullptr;
  return std::make_shared<std::atomic<int>>(0);
}

inline std::function<void()> Finisher(const InlineWait& wait,
                                      const std::function<void()>& done) {
  if (!wait) return done;
  return [wait, done] {
    int running = 0;
    if (!wait->compare_exchange_strong(running, 1, std::memory_order_acq_rel)) done();
  };
}

// `own`: the number of requests this kernel enqueued.
inline void WaitInline(const Engine& engine, const InlineWait& wait, int own,
                       const std::function<void()>& done) {
  if (!wait) return;
  const int64_t until = NowMicros() + engine.spin_us();
  while (wait->load(std::memory_order_acquire) == 0) {
    if (engine.open() > own || NowMicros() >= until) {
      int running = 0;
      if (wait->compare_exchange_strong(running, 2, std::memory_order_acq_rel)) return;
      break;
    }
    std::this_thread::yield();
  }
  done();
}

}  // namespace kerasdist
