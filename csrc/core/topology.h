// Where the cores of one host sit relative to each other, measured rather than read from the OS: in a
// VM the guest's view of caches says nothing of where the host runs its vCPUs this minute.
#pragma once

namespace ringzero {

// Nanoseconds per round trip of one cache line between a thread on cpu_a and one on cpu_b (each pinned,
// ping-ponging a flag round_trips times; the best of three runs). About 20-80 ns when the two cores
// share a last-level cache, several hundred when they do not (another CCD or socket). Throws
// InvalidArgument when either cpu is not in this process's affinity set or the two are the same.
double core_round_trip_ns(int cpu_a, int cpu_b, int round_trips);

}  // namespace ringzero
