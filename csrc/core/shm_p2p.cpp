// Point-to-point channels over shared memory; see shm_p2p.h for the protocol.
#include "shm_p2p.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "chunks.h"
#include "errors.h"
#include "futex.h"
#include "shm_wait.h"

namespace ringzero {
namespace {

constexpr uint64_t kMagic = 0x727a703270000001ULL;  // "rzp2p", version 1
constexpr int kMaxRanks = 256;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kSliceHeaderBytes = 64;  // message byte count, then padding to a cache line
// Any-source polling: sleeps between looks start at 1 us (a message usually comes soon) and double
// up to this bound, which is the latency a receive from any source may add.
constexpr double kAnySourcePollMaxS = 0.001;

}  // namespace

struct ShmP2P::Header {
  SegmentTag tag;
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(sizeof(ShmP2P::Header) <= kHeaderBytes, "header must fit its page");

// A 32-bit counter that is also the futex word its waiters sleep on; counters wrap, and are only
// ever compared by difference.
struct alignas(128) ShmP2P::Counter {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> sleepers;

  void advance() {
    value.fetch_add(1);  // seq_cst, then the load: pairs with the sleeper's increment then load
    if (sleepers.load() != 0) futex_wake_all(&value);
  }
};

struct ShmP2P::Channel {
  Counter posted;    // slices src has written
  Counter consumed;  // slices dst has read
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "cross-process flags need lock-free atomics");

size_t ShmP2P::segment_bytes(int nranks, size_t slot_bytes) {
  const size_t pairs = static_cast<size_t>(nranks) * static_cast<size_t>(nranks);
  return kHeaderBytes + round_up(pairs * sizeof(Channel), 4096) + pairs * kSlots * slot_bytes;
}

ShmP2P::ShmP2P(const std::string& name, int rank, int nranks, size_t slot_bytes)
    : rank_(rank), nranks_(nranks), slot_bytes_(slot_bytes) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    throw InvalidArgument("ShmP2P: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " is invalid");
  if (slot_bytes % kChunkAlignBytes != 0 || slot_bytes < 2 * kSliceHeaderBytes)
    throw InvalidArgument("ShmP2P: slot_bytes must be a multiple of 64 and at least 128, got " +
                          std::to_string(slot_bytes));
  seg_ = ShmSegment::create_or_open(name, segment_bytes(nranks, slot_bytes),
                                    SegmentTag{kMagic, nranks, 0, slot_bytes}, "set of point-to-point channels");
  static_cast<Header*>(seg_.data())->pids[rank].store(static_cast<int32_t>(getpid()));
}

ShmP2P::Channel* ShmP2P::channel(int src, int dst) const {
  return reinterpret_cast<Channel*>(static_cast<char*>(seg_.data()) + kHeaderBytes) + src * nranks_ + dst;
}

char* ShmP2P::slot(int src, int dst, uint32_t index) const {
  const size_t pairs = static_cast<size_t>(nranks_) * static_cast<size_t>(nranks_);
  char* base = static_cast<char*>(seg_.data()) + kHeaderBytes + round_up(pairs * sizeof(Channel), 4096);
  const size_t ring = static_cast<size_t>(src * nranks_ + dst) * kSlots;
  return base + (ring + index % kSlots) * slot_bytes_;
}

size_t ShmP2P::payload_bytes() const { return slot_bytes_ - kSliceHeaderBytes; }

// The wait loop of ShmComm (wait_until, shm_wait.h) without spinning: the waiter sleeps on the counter's
// futex word from the start; every kCheckEveryS it checks the peer's liveness and the deadline.
template <typename Ready>
void ShmP2P::wait(Counter& word, Ready ready, int peer, const char* what, double timeout_s, size_t bytes) {
  const double deadline = now_s() + timeout_s;
  wait_until(/*spin=*/false, ready, [&] { return WaitWord{&word.value, &word.sleepers, nullptr}; }, [&](double t) {
    const int pid = static_cast<const Header*>(seg_.data())->pids[peer].load();
    const bool gone = pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
    if (gone || t > deadline)
      throw CommTimeoutError("ringzero " + std::string(what) + " of " + std::to_string(bytes) + " bytes on rank " +
                             std::to_string(rank_) + ": " + (gone ? "rank " + std::to_string(peer) + " exited" :
                             "Timed out waiting " + std::to_string(std::llround(timeout_s * 1000)) +
                             "ms for a matching call from rank " + std::to_string(peer)) + ". Every send needs a recv of the same size "
                             "on the peer, in the same order; raise RINGZERO_TIMEOUT_S if the peer is only slow.");
  });
}

// Per slice of up to slot_bytes - 64 payload bytes: one copy in by the sender, one copy out by the
// receiver; the ring of kSlots lets both copies run at once.
void ShmP2P::send(const void* buf, size_t bytes, int dst, double timeout_s) {
  if (dst < 0 || dst >= nranks_ || dst == rank_)
    throw InvalidArgument("send: dst " + std::to_string(dst) + " must be another rank in [0, " +
                          std::to_string(nranks_) + ")");
  Channel* ch = channel(rank_, dst);
  const size_t per = payload_bytes();
  for (size_t s = 0, n = std::max<size_t>(1, ceil_div(bytes, per)); s < n; ++s) {
    const uint32_t k = ch->posted.value.load();
    wait(ch->consumed, [&] { return k - ch->consumed.value.load() < static_cast<uint32_t>(kSlots); }, dst, "send",
         timeout_s, bytes);
    char* sl = slot(rank_, dst, k);
    const uint64_t total = bytes;
    std::memcpy(sl, &total, sizeof(total));
    const size_t off = s * per, len = std::min(per, bytes - std::min(bytes, off));
    if (len) std::memcpy(sl + kSliceHeaderBytes, static_cast<const char*>(buf) + off, len);
    ch->posted.advance();
  }
}

void ShmP2P::recv(void* buf, size_t bytes, int src, double timeout_s) {
  if (src < 0 || src >= nranks_ || src == rank_)
    throw InvalidArgument("recv: src " + std::to_string(src) + " must be another rank in [0, " +
                          std::to_string(nranks_) + ")");
  Channel* ch = channel(src, rank_);
  const size_t per = payload_bytes();
  for (size_t s = 0, n = std::max<size_t>(1, ceil_div(bytes, per)); s < n; ++s) {
    const uint32_t k = ch->consumed.value.load();
    wait(ch->posted, [&] { return ch->posted.value.load() != k; }, src, "recv", timeout_s, bytes);
    const char* sl = slot(src, rank_, k);
    uint64_t total = 0;
    std::memcpy(&total, sl, sizeof(total));
    if (total != bytes)
      // The channel is out of step from here on; the message says what to fix.
      throw CollectiveMismatchError("ringzero recv on rank " + std::to_string(rank_) + " expected " +
                                    std::to_string(bytes) + " bytes but rank " + std::to_string(src) + " sent " +
                                    std::to_string(total) + "; sends and recvs must pair in order with equal sizes");
    const size_t off = s * per, len = std::min(per, bytes - std::min(bytes, off));
    if (len) std::memcpy(static_cast<char*>(buf) + off, sl + kSliceHeaderBytes, len);
    ch->consumed.advance();
  }
}

bool ShmP2P::has_message(int src) const {
  Channel* ch = channel(src, rank_);
  return ch->posted.value.load() != ch->consumed.value.load();
}

int ShmP2P::wait_any_source(const std::function<bool(int)>& eligible, double timeout_s) {
  const double start = now_s();
  double sleep_s = 1e-6;
  for (;;) {
    bool anyone_eligible = false, anyone_alive = false;
    for (int i = 0; i < nranks_; ++i) {
      const int src = (next_any_source_ + i) % nranks_;
      if (src == rank_ || !eligible(src)) continue;
      if (has_message(src)) {
        next_any_source_ = (src + 1) % nranks_;
        return src;
      }
      const int pid = static_cast<const Header*>(seg_.data())->pids[src].load();
      anyone_eligible = true;
      anyone_alive = anyone_alive || !(pid > 0 && kill(pid, 0) != 0 && errno == ESRCH);
    }
    const double waited_s = now_s() - start;
    const bool all_exited = anyone_eligible && !anyone_alive;
    if (all_exited || waited_s > timeout_s)
      throw CommTimeoutError("ringzero recv from any source on rank " + std::to_string(rank_) + ": " +
                             (!all_exited ? "Timed out waiting " + std::to_string(std::llround(timeout_s * 1000)) +
                                                 "ms for a message from any rank"
                                           : std::string("every rank that could send has exited")) +
                             ". Some rank must send to this one; raise RINGZERO_TIMEOUT_S if it is only slow.");
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
    sleep_s = std::min(sleep_s * 2, kAnySourcePollMaxS);
  }
}

}  // namespace ringzero
