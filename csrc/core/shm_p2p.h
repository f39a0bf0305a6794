// Point-to-point messages among the ranks of one host over one shared-memory segment (layer 1).
//
// One channel per ordered pair (src, dst): a ring of kSlots slots of slot_bytes and two counters,
// `posted` (written by src only) and `consumed` (written by dst only). A message streams through
// the ring in slices; every slice carries the message's byte count so that a recv that expects a
// different size fails on both sides with a clear error instead of delivering garbage. Messages on
// one channel are matched in order (FIFO, like NCCL; no tags). A sender blocks only while its ring
// is full, a receiver only while it is empty, so one thread per peer and direction never deadlocks.
// Waiters sleep on the counter's futex word; every wait ends in CommTimeoutError after timeout_s.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "shm_segment.h"

namespace ringzero {

class ShmP2P {
 public:
  static constexpr int kSlots = 4;  // slices in flight per channel: enough to overlap both copies
  static size_t segment_bytes(int nranks, size_t slot_bytes);

  // As ShmComm: the creator passes an empty name and shares name(); it unlinks once all opened.
  ShmP2P(const std::string& name, int rank, int nranks, size_t slot_bytes);
  ShmP2P(const ShmP2P&) = delete;
  ShmP2P& operator=(const ShmP2P&) = delete;

  const std::string& name() const { return seg_.name(); }
  void unlink() { seg_.unlink(); }
  int rank() const { return rank_; }

  // Blocking. Calls for different peers (or directions) may run on different threads at once;
  // calls on one channel must come from one thread at a time.
  void send(const void* buf, size_t bytes, int dst, double timeout_s);
  void recv(void* buf, size_t bytes, int src, double timeout_s);

  // Receive from any source, in two steps (the caller serialises the read with its recvs from that
  // rank): has_message(src) says whether a message from src waits unread; wait_any_source waits
  // until some rank r with eligible(r) has one and returns r, trying ranks round-robin so that no
  // sender is starved. It polls (no single futex word covers every channel), sleeping up to
  // kAnySourcePollMaxS between looks, and throws CommTimeoutError after timeout_s or once every
  // eligible sender has exited.
  bool has_message(int src) const;
  int wait_any_source(const std::function<bool(int)>& eligible, double timeout_s);

  struct Header;
  struct Counter;
  struct Channel;

 private:
  Channel* channel(int src, int dst) const;
  char* slot(int src, int dst, uint32_t index) const;
  size_t payload_bytes() const;
  // Waits until ready() holds, sleeping on `word`; `peer` is named in the timeout message.
  template <typename Ready>
  void wait(Counter& word, Ready ready, int peer, const char* what, double timeout_s, size_t bytes);

  ShmSegment seg_;
  int rank_;
  int nranks_;
  size_t slot_bytes_;
  int next_any_source_ = 0;  // where the next round-robin look starts
};

}  // namespace ringzero
