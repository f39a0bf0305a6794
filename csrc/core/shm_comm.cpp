// Shared-memory collectives. Each algorithm is one function whose phases read like the schedule:
// copy in, signal, wait, reduce, copy out. See shm_comm.h for the slot and slice protocol.
#include "shm_comm.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "chunks.h"
#include "errors.h"
#include "futex.h"
#include "reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RZ_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RZ_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define RZ_CPU_RELAX() ((void)0)
#endif

namespace ringzero {
namespace {

constexpr uint64_t kMagic = 0x72696e677a65726fULL;  // "ringzero"
constexpr int kMaxRanks = 256;
constexpr const char* kTimedOut = "Timed out";  // fail_wait adds the timeout to this reason
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kPageBytes = 4096;
// [Note: waiting in the shared-memory collectives]
// A waiter spins (with pause) while its peer is expected soon, then sleeps in the kernel on the futex
// word of the peer it still waits for, which that peer wakes when it makes progress; every sleep is
// bounded by kCheckEveryS, after which it checks the abort flag, the peers' liveness and the deadline.
// It spins only when every rank of the host can have a core of its own (ranks <= the cpus the host's ranks
// may run on together: set_host_cpus, from the affinity sets the ranks exchange at setup) and the caller
// is blocked on the result (a synchronous call; an async call's worker thread, or the c10d backend's,
// shares its core with the rank's compute, so it sleeps at once: set_spin(false)). It spins for up to
// kSpinS, then sleeps. While spinning it calls sched_yield only when the peer it waits for last ran on
// this very core (each rank publishes the core it signalled from): other load has put both ranks on
// one core, and the peer needs it.
// It never yields otherwise. Yielding was the cause of the slow regime of issue 24 (every size at
// 1-2 GB/s, 4-64 KiB at ~40 us, from run to run, while MPI stayed fast): with any other runnable
// task on the core (a build, a test, a thread of another process), sched_yield hands it the core and
// the scheduler (EEVDF, Linux 6.6+) pushes the yielder's deadline back by a slice, so the waiter came
// back long after its peer had arrived. Sleeping early is no cure: a futex wake took 10-20 us on the
// idle 2-core VM and ~200 us with a niced busy loop beside the ranks, and once one rank's wake is
// late, its peer's next wait runs past a short spin too, so every call paid a sleep. Measured on the
// 2-core VM, 2026-11-25, with the loop of benchmarks/latency_under_load.py (2 ranks, one `nice -n 19`
// busy loop beside them, median us per 4 KiB / 64 KiB / 1 MiB / 16 MiB all-reduce): yield after 20 us
// (before): 18 / 45 / 147 / 3061; sleep after 200 us: 213 / 217 / 517 / 1493; sleep after 5 ms, no
// yield: 2.6 / 7.7 / 59 / 1167 (idle machine: 2.9 / 8.2 / 61 / 1300). With two busy loops (both cores
// shared) a 5 ms spin still fell into the sleep cascade at 1 MiB (6.7 ms), a 50 ms spin did not
// (58 us). MPI libraries poll without bound; 50 ms bounds what a rank waiting for a late peer (one
// still computing, or checkpointing) burns before it sleeps. The yield to a peer on the same core was
// added after those runs, for ranks that other load has put on one core: beside a busy loop at normal
// priority, a variant that yielded to such a peer at once (not after 20 us) ran 4 KiB in a median of
// 9-18 us and a mean of 13 us, the old policy in a median of 5-11 us and a mean of 30-740 us. The delay
// before that yield, measured later (benchmarks/latency_under_load.py --background 1, three runs each at
// nice 0 and nice 19, mean us per call): 20 us (kept) against 5 us gave 4 KiB 20-26 against 9-11, 64 KiB
// 22-29 against 13-14 beside a nice-0 loop but 7-9 against 12-14 beside a niced one, 1 MiB 44-131
// against 47-111; mixed, so unchanged. It is what a row costs when the guest scheduler packs both
// ranks on one vCPU (single 0.2 s benchmark rows at 16-29 us, 2026-11-25).
//
// [Note: where the host runs the ranks' cores]
// What remained of issue 24's two regimes after the wait fix (16/64 MiB all-reduce at 1.2/6.5 ms in some
// jobs, 2.8-3.2/12.2-13.6 ms in others, switching within minutes or inside a job) is where the VM's host
// runs the two vCPUs: on one last-level cache, or on two (another CCD). _C.core_round_trip_ns tells
// them apart (45-75 ns per cache-line round trip on one L3, 370-440 ns on two, on the 2-core VM,
// 2026-11-25), and on two L3s a plain copy of 16 MiB per rank ran 2x faster (each rank had an L3 to
// itself) while the collective ran 2x slower (every byte a rank reads from a peer crosses between the
// caches). The staging slots were 1 MiB then; with 256 KiB slots, whose two parities and the slice read
// from a peer stay in a 1 MiB L2, the same runs took 1.3/6.9 ms on two L3s and 1.0/5.5 ms on one (the
// measurements are in comm/config.py's shm_buffer_bytes). Small collectives pay the placement in
// serialised cross-core misses, so the control block keeps what a waiter needs on one line (Control).
// ringzero bench and benchmarks/mpi_anchor.py record the placement with every run.
// On two L3s a rank reads a line its peer just wrote at ~12 GB/s (each miss waits ~400 ns, and a core
// keeps only so many in flight), slower than from memory. So a two-rank all-gather of 16 MiB and more
// per rank probes the placement after its first slice (peer_on_other_cache: a ping-pong on line 3 of
// the two control blocks) and, on two L3s, stages the rest with streaming stores, which the peer then
// reads from memory: 64 MiB all-gather 4.1-4.6 ms against 4.5-5.0 without (8, 3 and 5 jobs per side in
// three A/B runs), the same on one L3 (4.93 against 4.91 ms, 10 jobs each), where the probe says so
// (benchmarks/results/ab-2026-11-25-gather-streaming-*.txt). Streaming the copy-in of the two-shot
// all-reduce was slower on both (its reduction then reads its own chunk back from memory), and
// streaming only the peer's chunk gained nothing on two L3s (16/64 MiB 1.26/6.49 ms against 1.16/6.36).
// The output of such an all-gather (32 MiB and more) outgrows the L3 anyway: written with streaming
// stores it skips the read of each line a plain store makes, 64 MiB in 5.05 against 5.37 ms on one L3
// (7 jobs each; ab-2026-11-25-gather-streaming-output-one-l3.txt); on two L3s it was the same within
// noise (3.83-3.97 against 4.01 ms, 2 jobs each). At 16 MiB (the output fits the L3) it was slower.
// Prefetching the next slice's input during the two-shot all-reduce's reduction (to L2, or
// non-temporal) made 16/64 MiB 15-25% slower on one L3.
// Inside the guest, the scheduler sometimes ran both ranks on one vCPU for a while (rows of 4 KiB
// collectives at 10-25 us instead of ~1, in about one job of ten); ringzero's launcher now binds each
// local rank to its own share of the cpus (launch.core_share, RINGZERO_BIND_CORES), as Open MPI does by
// default, and the spin decision counts the cpus of all the host's ranks (set_host_cpus), not one
// rank's own.
constexpr size_t kStreamGatherBytes = 16 << 20;  // per rank; see [Note: where the host runs the ranks' cores]
constexpr double kSpinS = 0.05;
constexpr double kYieldToPeerS = 20e-6;  // spin this long before handing the core to a peer on it
constexpr int kClockEvery = 64;  // spin iterations between clock reads
constexpr double kCheckEveryS = 0.02;  // abort flag, peer liveness and deadline

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// A peer is gone when its pid no longer exists or is a zombie (killed, not yet reaped by its parent:
// kill(pid, 0) still succeeds then, so /proc is consulted).
bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');  // the command name may contain spaces
  return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

// Copies with non-temporal stores where the CPU has them (x86-64: SSE2), then fences them: the lines
// go to memory, not into this core's cache ([Note: where the host runs the ranks' cores]).
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

std::string join(const std::vector<int>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

}  // namespace

struct ShmComm::Header {
  SegmentTag tag;
  std::atomic<int32_t> abort_rank;  // -1 while healthy; else the local rank that aborted first
  char abort_reason[1024];
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(sizeof(ShmComm::Header) <= kHeaderBytes, "header must fit its page");

// One per rank. The first line holds all that peers read on the fast path, and only this rank writes it:
// a peer waiting for our `arrive` gets `done` and the fingerprint's hash with the same transfer of the
// line. Each cross-core transfer is one serialised miss of a small collective (45-75 ns on one L3,
// ~400 ns across two on the 2-core VM): with `done` and the fingerprint on lines of their own, a
// 4 KiB all-reduce paid four of them, now two (the wait and the data).
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
  alignas(128) Fingerprint fp[2];     // by slice parity, like the slots; read when the hashes differ
  alignas(64) std::atomic<uint64_t> probe;  // line 3: peer_on_other_cache's ping-pong counter
};
static_assert(offsetof(ShmComm::Control, last_seq) == 64, "the hot fields must fill exactly line 0");
static_assert(offsetof(ShmComm::Control, probe) == 192, "the probe counter has line 3 to itself");
static_assert(sizeof(ShmComm::Control) == 256, "control blocks are 256 bytes");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cross-process flags need lock-free atomics");

size_t ShmComm::segment_bytes(int nranks, size_t slot_bytes) {
  const size_t controls = round_up(sizeof(Control) * static_cast<size_t>(nranks), kPageBytes);
  return kHeaderBytes + controls + 2 * static_cast<size_t>(nranks) * slot_bytes;
}

ShmComm::ShmComm(const std::string& name, int rank, int nranks, size_t slot_bytes, double timeout_s,
                 std::vector<int> group_ranks)
    : rank_(rank), nranks_(nranks), slot_bytes_(slot_bytes), timeout_s_(timeout_s),
      group_ranks_(std::move(group_ranks)) {
  if (nranks < 1 || nranks > kMaxRanks)
    throw InvalidArgument("nranks must be in [1, " + std::to_string(kMaxRanks) + "], got " +
                          std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    throw InvalidArgument("rank must be in [0, nranks), got " + std::to_string(rank));
  if (slot_bytes % kChunkAlignBytes != 0 || slot_bytes < kChunkAlignBytes * static_cast<size_t>(nranks))
    throw InvalidArgument("RINGZERO_SHM_BUFFER_BYTES must be a multiple of 64 and at least 64 * ranks per "
                          "host, got " + std::to_string(slot_bytes));
  if (group_ranks_.empty())
    for (int i = 0; i < nranks; ++i) group_ranks_.push_back(i);
  if (static_cast<int>(group_ranks_.size()) != nranks)
    throw InvalidArgument("group_ranks must have one entry per local rank");
  for (int i = 0; i < nranks; ++i) all_ranks_.push_back(i);
  seen_done_.assign(nranks, 0);
  srcs_.assign(nranks, nullptr);
  spin_allowed_ = spin_ = nranks <= usable_cpus();

  seg_ = ShmSegment::create_or_open(name, segment_bytes(nranks, slot_bytes),
                                    SegmentTag{kMagic, nranks, 0, slot_bytes}, "communicator");
  if (name.empty()) static_cast<Header*>(seg_.data())->abort_rank.store(-1);
  static_cast<Header*>(seg_.data())->pids[rank].store(static_cast<int32_t>(getpid()));
}

ShmComm::~ShmComm() = default;

ShmComm::Control* ShmComm::control(int r) const {
  return reinterpret_cast<Control*>(static_cast<char*>(seg_.data()) + kHeaderBytes) + r;
}

char* ShmComm::slot(int r, uint64_t slice) const {
  const size_t controls = round_up(sizeof(Control) * static_cast<size_t>(nranks_), kPageBytes);
  char* base = static_cast<char*>(seg_.data()) + kHeaderBytes + controls;
  return base + (2 * static_cast<size_t>(r) + (slice & 1)) * slot_bytes_;
}

// ---------------------------------------------------------------------------------------------------
// Synchronisation

void ShmComm::start_op(CollectiveKind kind, DType dtype, ReduceOp op, int root, uint64_t count) {
  ++seq_;
  current_ = Fingerprint{seq_, static_cast<int32_t>(kind), static_cast<int32_t>(dtype),
                         static_cast<int32_t>(op), root, count};
  op_start_ = now_s();
  op_deadline_ = op_start_ + timeout_s_;
  history_[seq_ % kHistory] = OpRecord{seq_, kind, dtype, count, op_start_, -1.0, OpRecord::Running};
  check_abort();
}

void ShmComm::finish_op(OpRecord::Status status) {
  const double seconds = now_s() - op_start_;
  busy_s_ += seconds;
  OpRecord& r = history_[seq_ % kHistory];
  r.seconds = seconds;
  r.status = status;
  if (status != OpRecord::Ok) return;
  control(rank_)->last_kind.store(current_.kind, std::memory_order_relaxed);
  control(rank_)->last_seq.store(current_.seq, std::memory_order_release);
}

std::vector<ShmComm::OpRecord> ShmComm::history() const {
  std::vector<OpRecord> out;
  for (uint64_t s = seq_ >= kHistory ? seq_ - kHistory + 1 : 1; s <= seq_; ++s) out.push_back(history_[s % kHistory]);
  return out;
}

std::string ShmComm::last_completed_table() const {
  std::ostringstream s;
  s << "last completed op per group rank:";
  for (int q = 0; q < nranks_; ++q) {
    const uint64_t seq = control(q)->last_seq.load(std::memory_order_acquire);
    s << (q ? ", " : " ") << group_ranks_[q] << ": ";
    if (seq == 0) s << "none";
    else s << collective_name(static_cast<CollectiveKind>(control(q)->last_kind.load())) << " #" << seq;
  }
  return s.str();
}

// Both progress counters are published the same way: the counter (release, for the data it guards),
// then its futex word, seq_cst, then a seq_cst load of `sleepers`, paired with the sleeper's increment
// of `sleepers` then load of the word in wait_until: either we see the sleeper and wake it, or it sees
// the new word and does not sleep.
void ShmComm::signal() {
  Control* c = control(rank_);
  c->cpu.store(sched_getcpu(), std::memory_order_relaxed);
  c->arrive.store(++phase_, std::memory_order_release);
  c->arrive_word.store(static_cast<uint32_t>(phase_));
  if (c->sleepers.load() != 0) futex_wake_all(&c->arrive_word);
}

void ShmComm::end_slice(uint64_t k) {
  Control* c = control(rank_);
  c->done.store(k, std::memory_order_release);
  c->done_word.store(static_cast<uint32_t>(k));
  if (c->sleepers.load() != 0) futex_wake_all(&c->done_word);
}

// The one wait of the collectives ([Note: waiting in the shared-memory collectives]): returns once
// ready() holds. blocker() names the local rank still waited for and the futex word it advances;
// check(t) runs every kCheckEveryS (abort flag, liveness, deadline) and throws to end the wait.
template <typename Ready, typename Blocker, typename Check>
void ShmComm::wait_until(Ready ready, Blocker blocker, Check check) {
  if (ready()) return;
  const double start = now_s();
  double next_check = start + kCheckEveryS;
  for (int iter = 1;; ++iter) {
    if (ready()) return;
    if (spin_ && iter % kClockEvery != 0) {
      RZ_CPU_RELAX();
      continue;
    }
    const double t = now_s();
    const auto [q, word] = blocker();
    Control* peer = control(q);
    if (spin_ && t - start < kSpinS) {
      // The peer last ran on this core, so it most likely waits in this core's run queue: hand it the
      // core (a yield to anything else is what made the slow regime).
      if (t - start >= kYieldToPeerS && peer->cpu.load(std::memory_order_relaxed) == sched_getcpu()) sched_yield();
    } else {
      peer->sleepers.fetch_add(1);
      const uint32_t seen = word->load();
      if (!ready()) futex_wait(word, seen, kCheckEveryS);
      peer->sleepers.fetch_sub(1);
    }
    if (t >= next_check) {
      next_check = t + kCheckEveryS;
      check(t);
    }
  }
}

uint64_t ShmComm::begin_slice() {
  const uint64_t k = ++slice_;
  if (k <= 2) return k;
  // Slot parity k % 2 was last used by slice k - 2: every reader of it must be finished.
  const Header* h = static_cast<const Header*>(seg_.data());
  for (int q = 0; q < nranks_; ++q) {
    if (seen_done_[q] >= k - 2) continue;  // a lower bound seen earlier (done only grows): no transfer
    Control* c = control(q);
    wait_until([&] { return (seen_done_[q] = c->done.load(std::memory_order_acquire)) >= k - 2; },
               [&] { return std::pair<int, std::atomic<uint32_t>*>(q, &c->done_word); },
               [&](double t) {
                 check_abort();
                 const bool gone = process_gone(h->pids[q].load());
                 if (gone || t > op_deadline_) fail_wait({q}, 0, gone ? "a peer exited" : kTimedOut);
               });
  }
  return k;
}

void ShmComm::wait_one(int r, uint64_t phase) { wait_for(std::vector<int>{r}, phase); }

void ShmComm::wait_all(uint64_t phase) { wait_for(all_ranks_, phase); }

void ShmComm::wait_for(const std::vector<int>& ranks, uint64_t phase) {
  size_t ready = 0;  // counters only grow, so ranks[0..ready) stay ready
  const Header* h = static_cast<const Header*>(seg_.data());
  wait_until(
      [&] {
        while (ready < ranks.size() && control(ranks[ready])->arrive.load(std::memory_order_acquire) >= phase) {
          // `done` shares the line just fetched, and the acquire above makes every earlier store of
          // that rank visible: keep it as the lower bound begin_slice checks first.
          seen_done_[ranks[ready]] = control(ranks[ready])->done.load(std::memory_order_relaxed);
          ++ready;
        }
        return ready == ranks.size();
      },
      [&] { return std::pair<int, std::atomic<uint32_t>*>(ranks[ready], &control(ranks[ready])->arrive_word); },
      [&](double t) {
        check_abort();
        for (size_t i = ready; i < ranks.size(); ++i) {
          const int q = ranks[i];
          if (control(q)->arrive.load(std::memory_order_acquire) < phase && process_gone(h->pids[q].load()))
            fail_wait(ranks, phase, "a peer exited");
        }
        if (t > op_deadline_) fail_wait(ranks, phase, kTimedOut);
      });
}

// Ping-pong on the two ranks' probe lines: the lower rank writes, the higher answers, kProbeTrips
// times; a round trip above kSplitCacheNs (tens of ns on one L3, hundreds across two on the 2-core VM)
// means the peer's cache is another one. Both ranks must call it at the same point of the same
// collective (a decision made from the op's arguments alone); it waits like any other wait.
bool ShmComm::peer_on_other_cache(int peer) {
  constexpr int kProbeTrips = 8;
  constexpr double kSplitCacheNs = 220;    // fastest trip: 60-150 ns on one L3, 300-500 on two (2-core VM)
  constexpr double kSharedCoreNs = 5000;   // slower still: both ranks on one core (or preempted), no verdict
  const uint64_t base = probes_++ * kProbeTrips;
  Control* mine = control(rank_);
  Control* theirs = control(peer);
  const Header* h = static_cast<const Header*>(seg_.data());
  auto await = [&](uint64_t value) {
    wait_until([&] { return theirs->probe.load(std::memory_order_acquire) >= value; },
               [&] { return std::pair<int, std::atomic<uint32_t>*>(peer, &theirs->arrive_word); },
               [&](double t) {
                 check_abort();
                 const bool gone = process_gone(h->pids[peer].load());
                 if (gone || t > op_deadline_) fail_wait({peer}, 0, gone ? "a peer exited" : kTimedOut);
               });
  };
  // Spin even where this caller sleeps at once (set_spin(false)): the peer is at the same point, so a
  // round trip is short; asleep, each would last a futex timeout.
  const bool spin = spin_;
  spin_ = true;
  struct Restore {
    bool& flag;
    bool value;
    ~Restore() { flag = value; }
  } restore{spin_, spin};
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
  return probe_ns_ > kSplitCacheNs && probe_ns_ < kSharedCoreNs;
}

void ShmComm::fail_wait(const std::vector<int>& ranks, uint64_t phase, const char* why) {
  const Header* h = static_cast<const Header*>(seg_.data());
  std::vector<int> missing, exited;
  std::ostringstream away;  // missing ranks that are alive but waiting on the network (set_away)
  for (int q : ranks) {
    const bool behind = phase == 0 || control(q)->arrive.load(std::memory_order_acquire) < phase;
    if (!behind) continue;
    missing.push_back(group_ranks_[q]);
    if (process_gone(h->pids[q].load())) {
      exited.push_back(group_ranks_[q]);
      continue;
    }
    // Alive, and maybe itself waiting in the cross-host step of the hierarchical all-reduce: the fault
    // is there, and this rank's clock can run out before that rank's does.
    std::vector<int> far;
    for (const auto& a : control(q)->away)
      if (const int v = a.load(std::memory_order_relaxed); v > 0 && std::find(far.begin(), far.end(), v - 1) == far.end())
        far.push_back(v - 1);
    if (far.empty()) continue;
    away << "; group rank " << group_ranks_[q]
         << " is alive and in its cross-host step, waiting on the network with group rank" << (far.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < far.size(); ++i) away << (i ? " and " : "") << far[i];
    away << " (look there first: that rank, its host, the link)";
  }
  std::ostringstream s;
  s << "ringzero " << collective_name(static_cast<CollectiveKind>(current_.kind)) << " (sequence number "
    << current_.seq << ") on group rank " << group_ranks_[rank_] << ": " << why;
  // "Timed out waiting <n>ms" is gloo's wording, which torch's tests and callers match.
  if (std::strcmp(why, kTimedOut) == 0) s << " waiting " << std::llround(timeout_s_ * 1000) << "ms (the op's timeout)";
  s << "; still waiting for group ranks " << join(missing);
  if (!exited.empty()) s << "; ranks " << join(exited) << " have exited";
  s << away.str() << ". " << last_completed_table()
    << ". Every rank must call the same collectives in the same order; raise RINGZERO_TIMEOUT_S if "
       "a rank is legitimately slow.";
  abort_all(s.str());
  throw CommTimeoutError(s.str());
}

void ShmComm::set_away(const std::vector<int>& peers) {
  if (peers.size() > 2) throw InvalidArgument("set_away takes at most 2 peers (a ring's two neighbours)");
  for (size_t i = 0; i < 2; ++i) {
    const int v = i < peers.size() ? peers[i] : -1;
    if (v < -1) throw InvalidArgument("set_away: peers are group ranks (>= 0), got " + std::to_string(v));
    control(rank_)->away[i].store(v + 1, std::memory_order_relaxed);
  }
}

void ShmComm::abort_all(const std::string& reason) {
  Header* h = static_cast<Header*>(seg_.data());
  int32_t expected = -1;
  if (h->abort_rank.compare_exchange_strong(expected, rank_)) {
    std::snprintf(h->abort_reason, sizeof(h->abort_reason), "%s", reason.c_str());
    // abort_rank is set before the text: a reader may see a partial reason, never a missing abort.
  }
}

void ShmComm::check_abort() const {
  const Header* h = static_cast<const Header*>(seg_.data());
  const int32_t who = h->abort_rank.load(std::memory_order_acquire);
  if (who < 0 || who == rank_) {
    if (who == rank_)
      throw CommTimeoutError("ringzero communicator on group rank " + std::to_string(group_ranks_[rank_]) +
                             " was aborted by an earlier error; create a new process group");
    return;
  }
  throw CommTimeoutError("ringzero " + std::string(collective_name(static_cast<CollectiveKind>(current_.kind))) +
                         " (sequence number " + std::to_string(current_.seq) + ") on group rank " +
                         std::to_string(group_ranks_[rank_]) + ": the communicator was aborted by group rank " +
                         std::to_string(group_ranks_[who]) + ": " + std::string(h->abort_reason));
}

namespace {
// 64-bit mix of every field (splitmix64's finaliser, chained): equal fingerprints give equal hashes;
// different ones collide with probability ~2^-64, the one case a mismatch would go unreported.
uint64_t fingerprint_hash(const Fingerprint& f) {
  auto mix = [](uint64_t h, uint64_t v) {
    uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(0, f.seq);
  for (uint64_t v : {static_cast<uint64_t>(static_cast<uint32_t>(f.kind)), static_cast<uint64_t>(static_cast<uint32_t>(f.dtype)),
                     static_cast<uint64_t>(static_cast<uint32_t>(f.op)), static_cast<uint64_t>(static_cast<uint32_t>(f.root)), f.count})
    h = mix(h, v);
  return h;
}
}  // namespace

// The full fingerprint goes to this rank's own line (read by peers only to print a mismatch), its hash
// to line 0, which peers fetch anyway when they see this rank arrive; signal() publishes both.
void ShmComm::publish_fingerprint(uint64_t k) {
  Control* c = control(rank_);
  c->fp[k & 1] = current_;
  c->fp_hash[k & 1].store(current_hash_ = fingerprint_hash(current_), std::memory_order_relaxed);
}

void ShmComm::check_fingerprints(uint64_t k) {
  bool same = true;
  for (int q = 0; q < nranks_ && same; ++q) same = control(q)->fp_hash[k & 1].load(std::memory_order_relaxed) == current_hash_;
  if (same) return;
  std::ostringstream s;
  s << "ringzero collective mismatch detected on group rank " << group_ranks_[rank_]
    << ": ranks called different collectives at the same point.\n"
    << "  rank | op             | seq  | dtype    | count      | reduce op | root\n";
  for (int q = 0; q < nranks_; ++q) {
    const Fingerprint& f = control(q)->fp[k & 1];
    char line[160];
    std::snprintf(line, sizeof(line), "  %4d | %-14s | %4llu | %-8s | %10llu | %-9s | %d\n", group_ranks_[q],
                  collective_name(static_cast<CollectiveKind>(f.kind)), static_cast<unsigned long long>(f.seq),
                  dtype_name(static_cast<DType>(f.dtype)), static_cast<unsigned long long>(f.count),
                  op_name(static_cast<ReduceOp>(f.op)), f.root);
    s << line;
  }
  end_slice(k);  // this rank is done reading slice k; keeps the slot protocol in step for later calls
  throw CollectiveMismatchError(s.str());
}

// ---------------------------------------------------------------------------------------------------
// Algorithms

namespace {
struct Prepared {
  ReduceOp op;  // Avg becomes Sum ...
  int divisor;  // ... divided once at the final write
};
Prepared prepare(ReduceOp op, int nranks) {
  if (op == ReduceOp::Avg) return {ReduceOp::Sum, nranks};
  return {op, 1};
}
}  // namespace

AllReduceAlgo ShmComm::choose_all_reduce(size_t bytes) const {
  // One-shot up to 64 KiB: one synchronisation, every rank reads all inputs; above that the two-shot's
  // 1/n share of the reduction wins (measured with benchmarks/collectives.py on the 2-core CI machine,
  // 2026-11-21; see benchmarks/RESULTS.md).
  constexpr size_t kOneShotMaxBytes = 64 * 1024;
  if (bytes <= kOneShotMaxBytes && bytes <= slot_bytes_) return AllReduceAlgo::OneShot;
  return AllReduceAlgo::TwoShot;
}

void ShmComm::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, AllReduceAlgo algo) {
  OpGuard guard(this, CollectiveKind::AllReduce, dtype, op, -1, count);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count * dtype_size(dtype));
    return;
  }
  if (algo == AllReduceAlgo::Auto) algo = choose_all_reduce(count * dtype_size(dtype));
  switch (algo) {
    case AllReduceAlgo::OneShot: return all_reduce_one_shot(in, out, count, dtype, op);
    case AllReduceAlgo::Ring: return all_reduce_ring(in, out, count, dtype, op);
    default: return all_reduce_two_shot(in, out, count, dtype, op);
  }
}

// One-shot: copy in, one barrier, every rank reduces all n slots in rank order.
// Per rank per slice of B bytes: writes B to shm, reads n*B, writes B out; one synchronisation.
// Invariant: the same accumulation order on every rank, so results are bitwise identical.
void ShmComm::all_reduce_one_shot(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = slot_bytes_ / es;
  const Prepared p = prepare(op, nranks_);
  std::vector<const void*>& srcs = srcs_;  // one per communicator: no allocation per call
  for (size_t s = 0, n = num_slices(count, slot_elems); s < n; ++s) {
    const Range sl = slice_range(count, slot_elems, s);
    const uint64_t k = begin_slice();
    std::memcpy(slot(rank_, k), static_cast<const char*>(in) + sl.offset * es, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    wait_all(phase_);
    if (s == 0) check_fingerprints(k);
    for (int q = 0; q < nranks_; ++q) srcs[q] = slot(q, k);
    reduce_n(static_cast<char*>(out) + sl.offset * es, srcs.data(), nranks_, sl.count, dtype, p.op, p.divisor);
    end_slice(k);
  }
}

// Two-shot: copy in; barrier; rank r reduces chunk r of all slots into its own slot (reduce-scatter);
// barrier; every rank copies all reduced chunks out (all-gather).
// Per rank per slice of B bytes: reads 3B + writes 2B + B/n; two synchronisations. Bitwise identical
// on every rank (each chunk is reduced once). Staging only the peers' chunks and reducing the own one
// from `in` (as reduce_scatter does) was measured and dropped: the reduction then writes slot lines a
// peer read last (not ones this rank just wrote), and 1/16/64 MiB took 1.5-2x longer (2-core VM,
// 2026-11-25).
// Past the L3 (64 MiB at 2 ranks) it runs at 70-86% (median 81%) of the memory floor, and the rest is not in waits:
// per 256 KiB slice (rdtsc, one L3) the copy in takes 68% (from memory), the reduction 13%, the two
// copies out 17%, waits 2%. The two vCPUs share one memory bandwidth (an in-place pass over 64 MiB
// alone 60-72 GB/s, both at once 33-41 GB/s each), so while both ranks work in their caches it is
// partly idle. Filling it was tried and dropped (all slower, 2026-11-26,
// benchmarks/results/ab-2026-11-26-all-reduce-64m-memory.txt): prefetching the next slice's input during
// the copies out (the memory time moved there, 5.5 against 5.1-5.3 ms), streaming stores for the copies
// out (7.4-7.9 ms), and a pipelined order I(k+1) R(k) C(k) D(k-1) over three buffers that lets the ranks
// drift apart by half a slice (5.0-5.3 against 4.5-5.0 ms), also with the ranks taking turns at the copy
// in (slower still: a lone copy in was only ~20% faster per byte). One-shot is slower here too (5.3 against 4.5 ms).
// Measured with the variants interleaved inside each job (this VM's memory speed drifts by up to 1.6x
// within minutes, which separate jobs confuse with the change): a reduction writing slot and output in
// one pass, equal (again on 2026-11-26 with its own AVX-512 loop: 1.4-1.8% faster, not worth a second
// kernel per type, op and instruction set); slices of 128-512 KiB, equal, 64 KiB and 1 MiB 10-17% slower; sending the cross-cache
// reads through memory (streaming stores for the peer's chunk and for the reduced chunk), slower on one
// L3 and on two (8.8-9.7 against 7.1-7.7 ms there). What is left is the exchange itself: each rank must
// receive N bytes from its peer, and a 256 KiB buffer copied out of the other core's cache takes 10.8
// kcycles (63 GB/s, one L3) against the slice's 34.7 of copy in, which its memory reads do not overlap.
// benchmarks/two_shot_model.c measures this without torch (two pinned threads, same schedule, floor on
// the same buffers, interleaved): one L3, the model's two-shot at 73-78% of the floor and a core's memory
// stream and exchange in one loop only 7-17% faster than one after the other; two L3s, the exchange alone
// takes longer than the floor's whole pass (benchmarks/RESULTS.md, 2026-11-26, second session).
void ShmComm::all_reduce_two_shot(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = slot_bytes_ / es;
  const Prepared p = prepare(op, nranks_);
  std::vector<const void*>& srcs = srcs_;  // one per communicator: no allocation per call
  for (size_t s = 0, n = num_slices(count, slot_elems); s < n; ++s) {
    const Range sl = slice_range(count, slot_elems, s);
    const uint64_t k = begin_slice();
    std::memcpy(slot(rank_, k), static_cast<const char*>(in) + sl.offset * es, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    wait_all(phase_);
    if (s == 0) check_fingerprints(k);

    const Range mine = chunk_range(sl.count, nranks_, rank_, es);
    for (int q = 0; q < nranks_; ++q) srcs[q] = slot(q, k) + mine.offset * es;
    reduce_n(slot(rank_, k) + mine.offset * es, srcs.data(), nranks_, mine.count, dtype, p.op, p.divisor);
    signal();
    // This rank's own chunk first: it needs no peer, so it fills the time a late peer would cost.
    char* dst = static_cast<char*>(out) + sl.offset * es;
    std::memcpy(dst + mine.offset * es, slot(rank_, k) + mine.offset * es, mine.count * es);
    wait_all(phase_);
    for (int q = 0; q < nranks_; ++q) {
      if (q == rank_) continue;
      const Range c = chunk_range(sl.count, nranks_, q, es);
      std::memcpy(dst + c.offset * es, slot(q, k) + c.offset * es, c.count * es);
    }
    end_slice(k);
  }
}

// Ring: copy in; barrier; n-1 reduce-scatter steps where rank r folds chunk (r - t) of its left
// neighbour into its own slot, waiting only on that neighbour (NCCL's recvReduceSend, through memory);
// barrier; every rank copies the final chunks out (chunk c is final in the slot of rank c - 1).
// Per rank per slice of B bytes: reads 3B + writes 2B + (n-2)B/n; n+1 synchronisations, n-1 of them
// with one neighbour only. Kept for comparison and for RINGZERO_ALLREDUCE_ALGO=ring.
void ShmComm::all_reduce_ring(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = slot_bytes_ / es;
  const Prepared p = prepare(op, nranks_);
  const int left = (rank_ + nranks_ - 1) % nranks_;
  for (size_t s = 0, n = num_slices(count, slot_elems); s < n; ++s) {
    const Range sl = slice_range(count, slot_elems, s);
    const uint64_t k = begin_slice();
    std::memcpy(slot(rank_, k), static_cast<const char*>(in) + sl.offset * es, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    wait_all(phase_);
    if (s == 0) check_fingerprints(k);

    const uint64_t base = phase_;  // every rank has completed this phase
    for (int t = 1; t < nranks_; ++t) {
      wait_one(left, base + t - 1);  // left has finished its step t - 1
      const int c = (rank_ - t + nranks_) % nranks_;
      const Range cr = chunk_range(sl.count, nranks_, c, es);
      char* mine = slot(rank_, k) + cr.offset * es;
      const void* srcs[2] = {mine, slot(left, k) + cr.offset * es};
      reduce_n(mine, srcs, 2, cr.count, dtype, p.op, t == nranks_ - 1 ? p.divisor : 1);
      signal();
    }
    signal();
    wait_all(phase_);

    char* dst = static_cast<char*>(out) + sl.offset * es;
    for (int c = 0; c < nranks_; ++c) {
      const Range cr = chunk_range(sl.count, nranks_, c, es);
      std::memcpy(dst + cr.offset * es, slot((c + nranks_ - 1) % nranks_, k) + cr.offset * es, cr.count * es);
    }
    end_slice(k);
  }
}

// Reduce-scatter: each rank stages the slice of every peer's destination block; rank r reduces block r
// from its own input and the peers' slots straight into its output. Per rank per slice of B bytes of
// output: writes (n-1)*B to shm, reads (2n-1)*B, writes B; one synchronisation.
void ShmComm::reduce_scatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
  OpGuard guard(this, CollectiveKind::ReduceScatter, dtype, op, -1, count_per_rank);
  const size_t es = dtype_size(dtype);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count_per_rank * es);
    return;
  }
  const size_t block_elems = slot_bytes_ / es / nranks_;
  const Prepared p = prepare(op, nranks_);
  std::vector<const void*>& srcs = srcs_;  // one per communicator: no allocation per call
  for (size_t s = 0, n = num_slices(count_per_rank, block_elems); s < n; ++s) {
    const Range sl = slice_range(count_per_rank, block_elems, s);
    const uint64_t k = begin_slice();
    const char* own = static_cast<const char*>(in) + (rank_ * count_per_rank + sl.offset) * es;
    for (int q = 0; q < nranks_; ++q)  // block q for rank q's reduction; this rank's own block stays in `in`
      if (q != rank_)
        std::memcpy(slot(rank_, k) + q * sl.count * es,
                    static_cast<const char*>(in) + (q * count_per_rank + sl.offset) * es, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    wait_all(phase_);
    if (s == 0) check_fingerprints(k);
    for (int q = 0; q < nranks_; ++q) srcs[q] = q == rank_ ? own : slot(q, k) + rank_ * sl.count * es;
    reduce_n(static_cast<char*>(out) + sl.offset * es, srcs.data(), nranks_, sl.count, dtype, p.op, p.divisor);
    end_slice(k);
  }
}

// Staged through the segment: per rank per slice of B bytes, writes B into its slot and copies the n
// slots out. A single-copy form (each rank reading its peers' buffers with process_vm_readv, as MPI
// libraries do where the kernel allows it) was written and measured on the 2-core VM (2026-11-25) and
// dropped: process_vm_readv moved 11.6 GB/s at 8 MiB and 6.5 GB/s at 32 MiB against memcpy's 57 and
// 23 GB/s, so its one kernel copy cost more than the staged path's two user copies (16 MiB all-gather
// at 2 ranks: 5.0-5.4 ms against 1.5-1.8 ms).
void ShmComm::all_gather(const void* in, void* out, size_t count, DType dtype) {
  OpGuard guard(this, CollectiveKind::AllGather, dtype, ReduceOp::Sum, -1, count);
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = slot_bytes_ / es;
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count * es);
    return;
  }
  // Two ranks, a block past kStreamGatherBytes ([Note: where the host runs the ranks' cores]): the output
  // (larger than a last-level cache) is written with streaming stores; on two last-level caches, the
  // slot too (decided after the first slice, from a probe). All from the op's arguments but the probe,
  // which both ranks run: the same on every rank.
  const bool big = nranks_ == 2 && count * es >= kStreamGatherBytes;
  auto copy_out = big ? copy_streaming : copy_cached;
  bool stream = false;
  for (size_t s = 0, n = num_slices(count, slot_elems); s < n; ++s) {
    const Range sl = slice_range(count, slot_elems, s);
    const uint64_t k = begin_slice();
    const char* src = static_cast<const char*>(in) + sl.offset * es;
    (stream ? copy_streaming : copy_cached)(slot(rank_, k), src, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    // The own block needs no peer: copied while they stage theirs (from the slot, in this core's cache,
    // unless streamed past it), unless `in` is this rank's block of `out` already. Before the first
    // slice's check: a mismatch raises with `out` holding this rank's block, and `in` untouched.
    char* own = static_cast<char*>(out) + (rank_ * count + sl.offset) * es;
    if (own != src) copy_out(own, stream ? src : slot(rank_, k), sl.count * es);
    wait_all(phase_);
    if (s == 0) check_fingerprints(k);
    if (s == 0 && big) stream = peer_on_other_cache(1 - rank_);
    for (int q = 0; q < nranks_; ++q)
      if (q != rank_) copy_out(static_cast<char*>(out) + (q * count + sl.offset) * es, slot(q, k), sl.count * es);
    end_slice(k);
  }
}

// Per rank per slice: writes its own piece to shm, reads everyone's; one synchronisation per slice of
// the largest count. The fingerprint carries the total and a hash of the counts, so ranks that
// disagree on `counts` raise CollectiveMismatchError.
void ShmComm::all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  if (static_cast<int>(counts.size()) != nranks_)
    throw InvalidArgument("counts must have one entry per rank");
  uint64_t total = 0, hash = 1469598103934665603ULL;  // FNV-1a over the counts
  std::vector<size_t> displ(nranks_);
  for (int q = 0; q < nranks_; ++q) {
    displ[q] = total;
    total += counts[q];
    hash = (hash ^ counts[q]) * 1099511628211ULL;
  }
  OpGuard guard(this, CollectiveKind::AllGatherV, dtype, ReduceOp::Sum, static_cast<int32_t>(hash & 0x7fffffff), total);
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = slot_bytes_ / es;
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, counts[0] * es);
    return;
  }
  const size_t max_count = *std::max_element(counts.begin(), counts.end());
  for (size_t s = 0, n = num_slices(max_count, slot_elems); s < n; ++s) {
    const uint64_t k = begin_slice();
    const Range my = slice_range(counts[rank_], slot_elems, s);
    std::memcpy(slot(rank_, k), static_cast<const char*>(in) + my.offset * es, my.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    wait_all(phase_);
    if (s == 0) check_fingerprints(k);
    for (int q = 0; q < nranks_; ++q) {
      const Range r = slice_range(counts[q], slot_elems, s);
      std::memcpy(static_cast<char*>(out) + (displ[q] + r.offset) * es, slot(q, k), r.count * es);
    }
    end_slice(k);
  }
}

// Broadcast: root stages a slice, the others copy it out. After the first slice the non-roots wait
// for the root alone. Per non-root per slice of B bytes: reads B, writes B.
void ShmComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Broadcast, dtype, ReduceOp::Sum, root, count);
  if (nranks_ == 1) return;
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = slot_bytes_ / es;
  for (size_t s = 0, n = num_slices(count, slot_elems); s < n; ++s) {
    const Range sl = slice_range(count, slot_elems, s);
    const uint64_t k = begin_slice();
    if (rank_ == root) std::memcpy(slot(root, k), static_cast<char*>(buf) + sl.offset * es, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    if (s == 0) {
      wait_all(phase_);
      check_fingerprints(k);
    } else if (rank_ != root) {
      wait_one(root, phase_);
    }
    if (rank_ != root) std::memcpy(static_cast<char*>(buf) + sl.offset * es, slot(root, k), sl.count * es);
    end_slice(k);
  }
}

// Reduce: every rank stages a slice, the root reduces them (its own input read in place) into out.
// Per root per slice of B bytes: reads n*B, writes B; non-roots write B to shm.
void ShmComm::reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Reduce, dtype, op, root, count);
  const size_t es = dtype_size(dtype);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count * es);
    return;
  }
  const size_t slot_elems = slot_bytes_ / es;
  const Prepared p = prepare(op, nranks_);
  std::vector<const void*>& srcs = srcs_;  // one per communicator: no allocation per call
  for (size_t s = 0, n = num_slices(count, slot_elems); s < n; ++s) {
    const Range sl = slice_range(count, slot_elems, s);
    const uint64_t k = begin_slice();
    if (rank_ != root)
      std::memcpy(slot(rank_, k), static_cast<const char*>(in) + sl.offset * es, sl.count * es);
    if (s == 0) publish_fingerprint(k);
    signal();
    if (s == 0 || rank_ == root) wait_all(phase_);
    if (s == 0) check_fingerprints(k);
    if (rank_ == root) {
      for (int q = 0; q < nranks_; ++q)
        srcs[q] = q == root ? static_cast<const char*>(in) + sl.offset * es : slot(q, k);
      reduce_n(static_cast<char*>(out) + sl.offset * es, srcs.data(), nranks_, sl.count, dtype, p.op, p.divisor);
    }
    end_slice(k);
  }
}

void ShmComm::barrier() {
  OpGuard guard(this, CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, -1, 0);
  if (nranks_ == 1) return;
  const uint64_t k = begin_slice();
  publish_fingerprint(k);
  signal();
  wait_all(phase_);
  check_fingerprints(k);
  end_slice(k);
}

}  // namespace ringzero
