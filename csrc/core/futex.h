// Sleeping on a 32-bit word of shared memory until another process changes it (Linux futex, not
// process-private, so it works across the processes that map one segment). Waiters bound every
// sleep with a timeout so that they keep checking deadlines and peer liveness.
#pragma once
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace ringzero {

// Returns when *word != seen, when woken, or after timeout_s (spurious returns are allowed).
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, double timeout_s) {
  timespec ts{static_cast<time_t>(timeout_s), static_cast<long>((timeout_s - static_cast<time_t>(timeout_s)) * 1e9)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ringzero
