#include "topology.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RZ_PAUSE() _mm_pause()
#else
#define RZ_PAUSE() ((void)0)
#endif

namespace ringzero {
namespace {

bool pin_self(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Ping-pong through one line; a side that waits past the deadline (its partner never ran) gives up.
double one_run(int cpu_a, int cpu_b, int round_trips) {
  alignas(128) std::atomic<long> flag{0};
  std::atomic<bool> ready{false}, failed{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto wait_for = [&](long v) {
    for (int i = 0; flag.load(std::memory_order_acquire) != v; ++i) {
      RZ_PAUSE();
      if ((i & 0xffff) == 0 && (failed.load() || std::chrono::steady_clock::now() > deadline)) {
        failed.store(true);
        return false;
      }
    }
    return true;
  };
  double ns = -1.0;
  std::thread a([&] {
    if (!pin_self(cpu_a)) {
      failed.store(true);
      return;
    }
    while (!ready.load() && !failed.load()) RZ_PAUSE();
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < round_trips; ++i) {
      flag.store(2 * i + 1, std::memory_order_release);
      if (!wait_for(2 * i + 2)) return;
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / round_trips;
  });
  std::thread b([&] {
    if (!pin_self(cpu_b)) {
      failed.store(true);
      return;
    }
    ready.store(true);
    for (long i = 0; i < round_trips; ++i) {
      if (!wait_for(2 * i + 1)) return;
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  a.join();
  b.join();
  return failed.load() ? -1.0 : ns;
}

}  // namespace

double core_round_trip_ns(int cpu_a, int cpu_b, int round_trips) {
  cpu_set_t mine;
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) CPU_ZERO(&mine);
  for (int cpu : {cpu_a, cpu_b})
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &mine))
      throw InvalidArgument("cpu " + std::to_string(cpu) + " is not one this process may run on (see "
                            "os.sched_getaffinity(0)); pass two of those");
  if (cpu_a == cpu_b) throw InvalidArgument("cpu_a and cpu_b must differ, got " + std::to_string(cpu_a) + " twice");
  if (round_trips < 1) throw InvalidArgument("round_trips must be at least 1, got " + std::to_string(round_trips));
  double best = -1.0;
  for (int run = 0; run < 3; ++run) {
    const double ns = one_run(cpu_a, cpu_b, round_trips);
    if (ns < 0) throw CommError("core_round_trip_ns: the probe threads on cpus " + std::to_string(cpu_a) + " and " +
                                std::to_string(cpu_b) + " did not both run within 5 s");
    best = best < 0 ? ns : std::min(best, ns);
  }
  return best;
}

}  // namespace ringzero
