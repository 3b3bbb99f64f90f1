// The engine's clock, apart from any transport: the coordinator uses it too,
// and benchmarks/coordinator_sim.cc links the coordinator without MPI.
#include <chrono>
#include <thread>

#include "transport/transport.h"

namespace kerasdist {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SleepMicros(int64_t us) {
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

}  // namespace kerasdist
