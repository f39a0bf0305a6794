// The segment's layout and the slot protocol of ShmComm (internal to csrc/core/shm_*.cpp): the header,
// one control block per rank, the staging slots, and run_slices, the per-slice skeleton that every
// collective runs.
//
// [Note: the slot protocol]
// Slice k of a rank's collectives uses its slot of parity k % 2. A rank writes that slot only after every
// rank has finished reading slice k - 2 (begin_slice waits on each rank's `done` >= k - 2), so one
// synchronisation per phase suffices and no collective needs a trailing barrier. Progress is two
// counters per rank that only grow: `arrive` (phases signalled) and `done` (last slice whose reads of
// peers' slots this rank has finished).
// Memory order: a counter is stored with release after the data it guards (the slot, the fingerprint)
// and read with acquire before that data is read; its 32-bit futex word follows it seq_cst, then a
// seq_cst load of `sleepers` decides the wake (pairing in wait_until, shm_wait.h). Everything a rank
// stores before a release of `arrive` is visible to a peer once that peer's acquire sees it, so the
// peer reads `done` and the fingerprint's hash, on the same line, relaxed after that acquire.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "chunks.h"
#include "shm_comm.h"
#include "shm_wait.h"

namespace ringzero {

constexpr int kShmMaxRanks = 256;
constexpr int32_t kAbortClaimed = -2;  // Header::abort_rank while the first aborter writes its reason
constexpr size_t kShmHeaderBytes = 4096;
constexpr size_t kShmPageBytes = 4096;

struct ShmComm::Header {
  SegmentTag tag;
  std::atomic<int32_t> abort_rank;  // -1 while healthy; else the local rank that aborted first (kAbortClaimed
                                    // while it writes abort_reason: ShmComm::abort_all)
  char abort_reason[1024];
  std::atomic<int32_t> pids[kShmMaxRanks];
  // ShmComm::create_window: the new window's segment name, or its creator's error (window_name empty),
  // written by local rank 0 before it signals; read by the others after they waited for it.
  char window_name[96];
  char window_error[512];
};
static_assert(sizeof(ShmComm::Header) <= kShmHeaderBytes, "header must fit its page");

// One per rank. The first line holds all that peers read on the fast path, and only this rank writes it:
// a peer waiting for our `arrive` gets `done` and the fingerprint's hash with the same transfer of the
// line. Each cross-core transfer is one serialised miss of a small collective (tens of ns on one L3,
// hundreds across two): with `done` and the fingerprint on lines of their own a 4 KiB all-reduce paid
// four of them, now two (the wait and the data; benchmarks/RESULTS.md, "The shared-memory collectives'
// measurements, moved out of the code").
struct alignas(128) ShmComm::Control {
  // line 0: hot, written only by this rank
  std::atomic<uint64_t> arrive;       // phases this rank has completed
  std::atomic<uint64_t> done;         // last slice whose peer reads this rank has finished
  std::atomic<uint64_t> fp_hash[2];   // fingerprint_hash(fp[k & 1]), published with the fingerprint
  std::atomic<uint32_t> arrive_word;  // low 32 bits of arrive: the futex word phase waiters sleep on
  std::atomic<uint32_t> done_word;    // low 32 bits of done: the futex word slot waiters sleep on
  std::atomic<int32_t> cpu;           // the core this rank last signalled from (a hint for waiters)
  alignas(64) std::atomic<uint64_t> last_seq;  // line 1: sequence number of the last collective completed
  std::atomic<int32_t> last_kind;     // and its kind (a CollectiveKind); both read only for messages
  std::atomic<uint32_t> sleepers;     // peers asleep (or about to be) on either word: they write this
  std::atomic<int32_t> away[2];       // 1 + the group ranks this rank waits on over the network (set_away), 0: none
  std::atomic<uint64_t> xaddr[2];     // by slice parity: this rank's input's address (single copy), offset (registered)
  std::atomic<int32_t> xverdict;      // single copy's first probe: 1 this rank read every peer, 2 refused
  std::atomic<int32_t> xhuge;         // single copy of a large block: 1 this rank's input is on huge pages
  alignas(128) Fingerprint fp[2];     // by slice parity, like the slots; read when the hashes differ
  alignas(64) std::atomic<uint64_t> probe;  // line 3: peer_on_other_cache's ping-pong counter
};
static_assert(offsetof(ShmComm::Control, last_seq) == 64, "the hot fields must fill exactly line 0");
static_assert(offsetof(ShmComm::Control, xhuge) + 4 <= 128, "line 1 holds the cold fields");
static_assert(offsetof(ShmComm::Control, probe) == 192, "the probe counter has line 3 to itself");
static_assert(sizeof(ShmComm::Control) == 256, "control blocks are 256 bytes");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cross-process flags need lock-free atomics");

inline const ShmComm::Header* ShmComm::header() const { return static_cast<const Header*>(seg_.data()); }

// A collective's reduction as reduce_n takes it: Avg becomes Sum, divided once at the final write.
struct Prepared {
  ReduceOp op;
  int divisor;
};
inline Prepared prepare(ReduceOp op, int nranks) {
  if (op == ReduceOp::Avg) return {ReduceOp::Sum, nranks};
  return {op, 1};
}

// What a waiter for rank q's `word` (its arrive_word or done_word) sleeps on.
inline WaitWord ShmComm::wait_word(int q, std::atomic<uint32_t>& word) const {
  Control* c = control(q);
  return WaitWord{&word, &c->sleepers, &c->cpu};
}

// The skeleton of every collective: per slice of `slice_elems` over `count` elements, wait for the slot
// to be free, stage this rank's part, publish (with the fingerprint on the first slice), do `meanwhile`
// (work that needs no peer: it fills the time a late peer would cost), wait, compare fingerprints on the
// first slice, consume, and mark the slice read. The first slice waits for every rank (the fingerprints
// must all be there); later slices wait as `wait_on` says: kWaitAll, kWaitNone (this rank reads no
// peer's slot: a broadcast's root, a reduce's non-roots), or one rank (a broadcast's root).
// Each of stage, meanwhile and consume takes the Slice; consume may run further phases of its own.
template <typename Stage, typename Meanwhile, typename Consume>
void ShmComm::run_slices(size_t count, size_t slice_elems, int wait_on, Stage stage, Meanwhile meanwhile,
                         Consume consume) {
  for (size_t s = 0, n = num_slices(count, slice_elems); s < n; ++s) {
    const Range r = slice_range(count, slice_elems, s);
    const Slice sl{s, r.offset, r.count, begin_slice()};
    stage(sl);
    if (s == 0) publish_fingerprint(sl.k);
    signal();
    meanwhile(sl);
    if (s == 0 || wait_on == kWaitAll) wait_all(phase_);
    else if (wait_on != kWaitNone) wait_one(wait_on, phase_);
    if (s == 0) check_fingerprints(sl.k);
    consume(sl);
    end_slice(sl.k);
  }
}

}  // namespace ringzero
