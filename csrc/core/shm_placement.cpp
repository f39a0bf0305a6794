// The placement probe: whether a peer runs on another last-level cache than this rank, and the
// streaming copy that large all-gathers and two ranks' staged reductions switch to when it does.
//
// [Note: where the host runs the ranks' cores]
// A VM's host may run two vCPUs on one last-level cache or on two (another CCD), and move them between
// the two. On two L3s every byte a rank reads from a peer crosses between the caches: a line the peer
// just wrote comes at ~12 GB/s (each miss waits ~400 ns), slower than from memory, and a small
// collective pays its serialised cross-core misses at ~400 ns instead of tens of ns. Hence:
// - staging slots of 256 KiB (comm/config.py's shm_buffer_bytes): both parities and the slice read from
//   a peer stay in a 1 MiB L2;
// - the control block keeps what a waiter needs on one line (ShmComm::Control, shm_slots.h);
// - a two-rank staged all-gather of single_copy_end_bytes (8 MiB) and more per rank probes the placement
//   after its first slice (peer_on_other_cache) and, on two L3s, stages the rest with streaming stores,
//   which the peer then reads from memory; its output (16 MiB and more per rank, both ranks' past a 32 MiB
//   L3) is always written with streaming stores, which skip the read of each line a plain store makes;
// - two ranks' staged all-reduces (one-shot and two-shot), reduce-scatters and all-gathers (below
//   single_copy_end_bytes per rank) of stage_stream_min_bytes and more stage with streaming stores while the
//   probe's verdict is two L3s (it moves when two probes in a row agree), probing again at the first slice of such
//   a call once stage_reprobe_calls of them or stage_reprobe_bytes have run since the last probe (the host moves the
//   vCPUs within seconds). On two L3s a peer's
//   read of a line still dirty in the writer's cache crawled at ~2 GB/s: on the AMD EPYC VM this was
//   the slow mode of whole runs, 1 MiB all-reduce ~700 us against ~120 on one L3; streamed, 170 us. On one
//   L3 the streamed staging is slower (1 MiB 178 against 120 us), hence the probe. Streaming the
//   two-shot's reduced chunk as well, or flushing it, was slower on both placements, and outputs that fit
//   the L3 and prefetching were slower or no faster;
// - the launcher binds each local rank to its own share of the cpus (launch.core_share,
//   RINGZERO_BIND_CORES), as Open MPI does, and the spin decision counts the cpus of all the host's ranks
//   (set_host_cpus), not one rank's own: the guest scheduler otherwise sometimes ran both on one vCPU.
// _C.core_round_trip_ns tells the placements apart; ringzero bench and benchmarks/mpi_anchor.py record it
// with every run. The measurements are in benchmarks/RESULTS.md, "The shared-memory collectives'
// measurements, moved out of the code"; the staging's in "The slow mode was the host's placement (issue 47)".
#include "shm_placement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "shm_slots.h"
#include "shm_wait.h"

namespace ringzero {

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  size_t i = 0;
  if ((reinterpret_cast<uintptr_t>(d) & 15) == 0) {
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
  }
  std::memcpy(d + i, s + i, bytes - i);
  _mm_sfence();  // non-temporal stores are weakly ordered: visible before the signal that follows
#else
  std::memcpy(dst, src, bytes);
#endif
}

void copy_cached(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

// Ping-pong on the two ranks' probe lines: the lower rank writes, the higher answers, kProbeTrips
// times; a fastest round trip above kSplitCacheNs means the peer's cache is another one. Both ranks must
// call it at the same point of the same collective (a decision made from the op's arguments alone); it
// waits like any other wait.
//
// The fastest of many trips, because the placements differ in their floors: on the AMD EPYC VM the
// fastest trip was 60-150 ns on one L3 and 300-500 on two; on the Intel Xeon VM (one L3, where streamed
// staging is slower) the fastest of 8 trips read up to 271 ns, so the first threshold, 220 ns, called one
// probe in five "two L3s" and its calls streamed. More trips bring each placement's fastest trip nearer
// its floor, and the threshold sits between the floors; on that VM the fastest of 16 still read over
// 280 ns in a few probes of a hundred, so the verdict (this rank's own) changes only when two probes in a
// row agree: a misread probe changes nothing, and a real move of the vCPUs is followed one probe later
// (benchmarks/RESULTS.md, "the placement probe misread the Intel VM").
bool ShmComm::peer_on_other_cache(int peer) {
  constexpr int kProbeTrips = 16;
  constexpr double kSplitCacheNs = 280;    // fastest trip: see above
  constexpr double kSharedCoreNs = 5000;   // slower still: both ranks on one core (or preempted), no verdict
  const uint64_t base = probes_++ * kProbeTrips;
  Control* mine = control(rank_);
  Control* theirs = control(peer);
  // Spin even where this caller sleeps at once (set_spin(false)): the peer is at the same point, so a
  // round trip is short; asleep, each would last a futex timeout.
  auto await = [&](uint64_t value) {
    wait_until(/*spin=*/true, [&] { return theirs->probe.load(std::memory_order_acquire) >= value; },
               [&] { return wait_word(peer, theirs->arrive_word); }, [&](double t) { check_peer(peer, t); });
  };
  // The fastest trip: the first also absorbs how far apart the two ranks reached the probe.
  double fastest = 1e30, last = now_s();
  for (int i = 1; i <= kProbeTrips; ++i) {
    if (rank_ < peer) {
      mine->probe.store(base + i, std::memory_order_release);
      await(base + i);
    } else {
      await(base + i);
      mine->probe.store(base + i, std::memory_order_release);
    }
    const double t = now_s();
    fastest = std::min(fastest, t - last);
    last = t;
  }
  probe_ns_ = fastest * 1e9;
  const bool split = probe_ns_ > kSplitCacheNs && probe_ns_ < kSharedCoreNs;
  if (split == probe_split_) placement_split_ = split;
  probe_split_ = split;
  return placement_split_;
}

}  // namespace ringzero
