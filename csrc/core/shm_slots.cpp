// The slot protocol of ShmComm ([Note: the slot protocol], shm_slots.h): where each rank's control block
// and slots lie, the progress counters (signal, begin_slice, end_slice) and the fingerprints that catch
// ranks calling different collectives.
#include <sched.h>

#include <cstdio>
#include <cstring>
#include <sstream>

#include "errors.h"
#include "futex.h"
#include "shm_slots.h"
#include "shm_wait.h"

namespace ringzero {

size_t ShmComm::segment_bytes(int nranks, size_t slot_bytes) {
  const size_t controls = round_up(sizeof(Control) * static_cast<size_t>(nranks), kShmPageBytes);
  return kShmHeaderBytes + controls + 2 * static_cast<size_t>(nranks) * slot_bytes;
}

ShmComm::Control* ShmComm::control(int r) const {
  return reinterpret_cast<Control*>(static_cast<char*>(seg_.data()) + kShmHeaderBytes) + r;
}

char* ShmComm::slot(int r, uint64_t slice) const {
  const size_t controls = round_up(sizeof(Control) * static_cast<size_t>(nranks_), kShmPageBytes);
  char* base = static_cast<char*>(seg_.data()) + kShmHeaderBytes + controls;
  return base + (2 * static_cast<size_t>(r) + (slice & 1)) * slot_bytes_;
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

uint64_t ShmComm::begin_slice() {
  const uint64_t k = ++slice_;
  if (k <= 2) return k;
  // Slot parity k % 2 was last used by slice k - 2: every reader of it must be finished.
  for (int q = 0; q < nranks_; ++q) {
    if (seen_done_[q] >= k - 2) continue;  // a lower bound seen earlier (done only grows): no transfer
    Control* c = control(q);
    wait_until(spin_, [&] { return (seen_done_[q] = c->done.load(std::memory_order_acquire)) >= k - 2; },
               [&] { return wait_word(q, c->done_word); }, [&](double t) { check_peer(q, t); });
  }
  return k;
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
  bool registered = false;
  for (int q = 0; q < nranks_; ++q)
    registered = registered || std::strstr(collective_name(static_cast<CollectiveKind>(control(q)->fp[k & 1].kind)),
                                           "_registered") != nullptr;
  if (registered)
    s << "  (a *_registered op has a tensor from ringzero.empty, its root column the allocation's number; where a"
         " rank's op lacks _registered, it passed a plain tensor where a peer passed its ringzero.empty tensor)\n";
  end_slice(k);  // this rank is done reading slice k; keeps the slot protocol in step for later calls
  throw CollectiveMismatchError(s.str());
}

}  // namespace ringzero
