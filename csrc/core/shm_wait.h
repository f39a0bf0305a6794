// How a rank waits for its peers in shared memory (layer 1): spin, yield to a peer on this core, sleep
// on a futex, check liveness and the deadline. The one wait loop of ShmComm and ShmP2P.
//
// [Note: waiting in the shared-memory collectives]
// A waiter spins (with pause) while its peer is expected soon, then sleeps in the kernel on the futex
// word of the peer it still waits for, which that peer wakes when it makes progress; every sleep is
// bounded by kCheckEveryS, after which it checks the abort flag, the peers' liveness and the deadline.
// It spins only when every rank of the host can have a core of its own (ranks <= the cpus the host's
// ranks may run on together: set_host_cpus) and the caller is blocked on the result (a synchronous call;
// an async call's worker thread, or the c10d backend's, shares its core with the rank's compute, so it
// sleeps at once: set_spin(false), unless someone is blocked on its result: [Note: the caller runs its
// own collective] in csrc/torch/backend_work.h). It spins for up to kSpinS, then sleeps. While spinning it calls
// sched_yield only when the peer it waits for last ran on this very core (each rank publishes the core
// it signalled from), after kYieldToPeerS: other load has put both ranks on one core, and the peer
// needs it. It never yields otherwise. Why:
// - yielding to any runnable task was the slow regime of issue 24: the scheduler (EEVDF, Linux 6.6+)
//   pushes the yielder's deadline back by a slice, so the waiter came back long after its peer arrived;
// - sleeping early is no cure: a futex wake takes tens to hundreds of us, and once one rank's wake is
//   late its peer's next wait outlasts a short spin too, so every call pays a sleep;
// - kSpinS (50 ms) is the shortest spin that stayed out of that cascade with both cores shared; MPI
//   libraries poll without bound, and 50 ms bounds what a rank burns waiting for a late peer;
// - kYieldToPeerS (20 us) against 5 us measured mixed (faster beside a busy loop, slower beside a
//   niced one), so it stayed.
// The measurements (2-core VM, benchmarks/latency_under_load.py) are in
// benchmarks/RESULTS.md, "The shared-memory collectives' measurements, moved out of the code".
#pragma once
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "futex.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RZ_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RZ_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define RZ_CPU_RELAX() ((void)0)
#endif

namespace ringzero {

constexpr double kSpinS = 0.05;
constexpr double kYieldToPeerS = 20e-6;  // spin this long before handing the core to a peer on it
constexpr int kClockEvery = 64;          // spin iterations between clock reads
constexpr double kCheckEveryS = 0.02;    // abort flag, peer liveness and deadline

inline double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// The cpus this process may run on.
int usable_cpus();

// A peer is gone when its pid no longer exists or is a zombie (killed, not yet reaped by its parent:
// kill(pid, 0) still succeeds then, so /proc is consulted).
bool process_gone(int pid);

// What a waiter sleeps on: the futex word its peer advances, the peer's count of sleepers (which it
// reads after advancing the word, to wake them) and the core the peer last signalled from (read only
// when spinning; may be null where the caller never spins).
struct WaitWord {
  std::atomic<uint32_t>* word;
  std::atomic<uint32_t>* sleepers;
  const std::atomic<int32_t>* cpu;
};

// Returns once ready() holds ([Note: waiting in the shared-memory collectives]). blocker() returns the
// WaitWord of the peer still waited for; check(t) runs every kCheckEveryS (abort flag, liveness,
// deadline) and throws to end the wait. `spin`: whether this caller may spin before it sleeps.
//
// Memory order: the sleeper increments `sleepers`, then loads the word (both seq_cst), then sleeps only
// if ready() still fails; the peer stores the word, then loads `sleepers` (both seq_cst) and wakes when
// it is non-zero. Either the peer sees the sleeper and wakes it, or the sleeper sees the new word and
// does not sleep. ready() makes its own acquire loads of the counters that guard the data.
template <typename Ready, typename Blocker, typename Check>
void wait_until(bool spin, Ready ready, Blocker blocker, Check check) {
  if (ready()) return;
  const double start = now_s();
  double next_check = start + kCheckEveryS;
  for (int iter = 1;; ++iter) {
    if (ready()) return;
    if (spin && iter % kClockEvery != 0) {
      RZ_CPU_RELAX();
      continue;
    }
    const double t = now_s();
    const WaitWord w = blocker();
    if (spin && t - start < kSpinS) {
      // The peer last ran on this core, so it most likely waits in this core's run queue: hand it the
      // core (a yield to anything else is what made the slow regime).
      if (t - start >= kYieldToPeerS && w.cpu->load(std::memory_order_relaxed) == sched_getcpu()) sched_yield();
    } else {
      w.sleepers->fetch_add(1);
      const uint32_t seen = w.word->load();
      if (!ready()) futex_wait(w.word, seen, kCheckEveryS);
      w.sleepers->fetch_sub(1);
    }
    if (t >= next_check) {
      next_check = t + kCheckEveryS;
      check(t);
    }
  }
}

}  // namespace ringzero
