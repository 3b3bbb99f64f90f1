// Test driver for kerasdist's C++ core alone (no TensorFlow, no Python),
// built with -fsanitize=address,undefined by tests/test_core_sanitizers.py
// and run under the environment's mpiexec.
//
//   core_driver fuzz [seed] [iterations]         decoder fuzzing, no MPI
//   core_driver collectives [seed] [--no-shm] [--small-rd]
//                                                sweep, then the soak
//   core_driver faults [--no-shm]                mismatch, duplicate, recreate
//   core_driver sigstop [--no-shm]               np=2: rank 1 freezes itself
//   core_driver overflow | overflow-prescale     integer overflow cases
//   core_driver capi                             the engine library's C API
//
// Each part prints "PASS <part> ..." lines; any failure prints
// "DRIVER FAIL" and aborts, which makes hydra stop the job.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "driver_util.h"

namespace kdt {
int g_rank = -1;
}  // namespace kdt

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool HasFlag(int argc, char** argv, const char* flag) {
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

// The i-th positional argument after the mode, or `fallback`.
unsigned long long Positional(int argc, char** argv, int i, unsigned long long fallback) {
  int seen = 0;
  for (int k = 2; k < argc; ++k) {
    if (argv[k][0] == '-') continue;
    if (seen++ == i) return std::strtoull(argv[k], nullptr, 10);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s fuzz|collectives|faults|sigstop|overflow ...\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "fuzz") {
    const double t0 = Now();
    kdt::RunFuzz(Positional(argc, argv, 0, 1), static_cast<int>(Positional(argc, argv, 1, 300)));
    std::printf("fuzz took %.1f s\n", Now() - t0);
    return 0;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  kdt::g_rank = rank;
  KDT_CHECK(provided == MPI_THREAD_MULTIPLE, "MPI gave thread level %d", provided);
  const bool shm = !HasFlag(argc, argv, "--no-shm");
  const double t0 = Now();
  if (mode == "collectives") {
    const uint64_t seed = Positional(argc, argv, 0, 1);
    kerasdist::EngineConfig config = kdt::DriverConfig(shm);
    // --small-rd: small allreduces by recursive doubling even on few ranks.
    if (HasFlag(argc, argv, "--small-rd")) config.collective.small_direct_max_ranks = 1;
    auto ctx = kdt::CreateContext(config);
    std::printf("rank %d/%d transport %s\n", rank, size, ctx->transport_name().c_str());
    int n = kdt::RunSweep(ctx->engine(), rank, size);
    std::printf("PASS sweep rank %d: %d collectives in %.1f s\n", rank, n, Now() - t0);
    const double t1 = Now();
    n = kdt::RunSoak(ctx->engine(), rank, size, seed, 15);
    std::printf("PASS soak rank %d: seed %llu, %d collectives in %.1f s\n", rank,
                static_cast<unsigned long long>(seed), n, Now() - t1);
    ctx.reset();
  } else if (mode == "faults") {
    kdt::RunFaults(shm, rank, size);
  } else if (mode == "capi") {
    kdt::RunCApi(rank, size);
  } else if (mode == "sigstop") {
    kdt::RunSigstop(shm, rank, size);  // exits
  } else if (mode == "overflow" || mode == "overflow-prescale") {
    auto ctx = kdt::CreateContext(kdt::DriverConfig(shm));
    kdt::RunOverflow(ctx->engine(), rank, size, mode == "overflow-prescale");
    ctx.reset();
  } else {
    kdt::Fail("unknown mode '%s'", mode.c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::printf("rank %d: %s done in %.1f s\n", rank, mode.c_str(), Now() - t0);
  MPI_Finalize();
  return 0;
}
