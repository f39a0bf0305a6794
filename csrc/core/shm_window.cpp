// [Note: registered tensors]
// The staged collectives copy every byte twice, into a slot and out of it, because a rank cannot read
// its peers' memory. A tensor from ringzero.empty (ShmComm::create_window) lives in memory that every
// local rank has mapped: one segment per allocation, a page-aligned region per rank, each rank's tensor
// its own region. A collective whose input is such a tensor reads the peers' copies where they are:
//   all_gather      one copy: every rank copies each block straight into its output;
//   reduce_scatter  one pass: every rank reduces its block of all inputs straight into its output;
//   all_reduce      in place, as the two-shot with the tensors as the slots: rank r reduces chunk r of
//                   every tensor into chunk r of its own (no peer reads that chunk of it); then copies
//                   every peer's chunk q out of that peer's tensor into its own (chunk q of a peer is
//                   final, and no one writes chunk q of it any more).
// Synchronisations: one to start (every input ready, fingerprints and offsets compared), one after the
// all-reduce's reduction, and one at the end: no rank returns, so none lets its caller write its tensor,
// before every peer has finished reading it. Every rank reduces each element from the same sources in
// rank order, once, so results are bitwise identical on every rank and equal to the staged two-shot's.
//
// Which path: the input must lie in a live window of this process whose ranks are this communicator's
// processes in its order (ShmWindow::pids: any door's communicator of the same group qualifies), the
// all-reduce must be in place, and the input must reach the selector's registered_min_bytes (select.h's
// window_wanted; the all-reduce only where Auto would take the two-shot). All of that is the same on
// every rank when every rank passes its tensor of one allocation, at the same offset; a rank that passes a
// plain tensor where a peer passes a registered one calls another kind of collective, and the fingerprint
// check raises CollectiveMismatchError on every rank (the message says what the _registered kinds are).
// A tensor of a window of other processes (another group's) is an InvalidArgument on the rank that passed
// it. Measurements: benchmarks/RESULTS.md, "Registered tensors (issue 47)".
#include "shm_window.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include "errors.h"
#include "reduce.h"
#include "shm_placement.h"
#include "shm_slots.h"

namespace ringzero {
namespace {
std::mutex g_windows_mutex;
std::vector<std::weak_ptr<ShmWindow>> g_windows;  // every window made in this process, pruned as they go
std::atomic<int> g_live{0};

}  // namespace

ShmWindow::ShmWindow(ShmSegment seg, int rank, std::vector<int32_t> pids, size_t region_bytes, size_t stride,
                     uint64_t id)
    : seg_(std::move(seg)), rank_(rank), pids_(std::move(pids)), region_bytes_(region_bytes), stride_(stride),
      id_(id) {
  g_live.fetch_add(1);
}

ShmWindow::~ShmWindow() { g_live.fetch_sub(1); }

void ShmWindow::add(const std::shared_ptr<ShmWindow>& w) {
  std::lock_guard<std::mutex> lock(g_windows_mutex);
  g_windows.erase(std::remove_if(g_windows.begin(), g_windows.end(), [](const auto& p) { return p.expired(); }),
                  g_windows.end());
  g_windows.push_back(w);
}

std::shared_ptr<ShmWindow> ShmWindow::find(const void* p, size_t bytes) {
  if (g_live.load(std::memory_order_relaxed) == 0) return nullptr;
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(g_windows_mutex);
  for (const auto& weak : g_windows) {
    std::shared_ptr<ShmWindow> w = weak.lock();
    if (!w) continue;
    const char* own = w->region(w->rank());
    if (c >= own && c + bytes <= own + w->region_bytes()) return w;
  }
  return nullptr;
}

std::shared_ptr<ShmWindow> ShmComm::create_window(size_t bytes) {
  OpGuard guard(this, CollectiveKind::CreateWindow, DType::U8, ReduceOp::Sum, -1, bytes);
  const size_t stride = round_up(std::max<size_t>(bytes, 1), kShmPageBytes);
  const size_t total = stride * static_cast<size_t>(nranks_);
  Header* h = static_cast<Header*>(seg_.data());
  std::vector<int32_t> pids(nranks_);
  for (int q = 0; q < nranks_; ++q) pids[q] = header()->pids[q].load();
  const uint64_t id = ++windows_made_;
  if (nranks_ == 1) {  // no peer: a private mapping would do, but one kind of window keeps one code path
    ShmSegment seg = ShmSegment::create(total);
    seg.unlink();
    return std::make_shared<ShmWindow>(std::move(seg), 0, pids, bytes, stride, id);
  }

  const uint64_t k = begin_slice();
  ShmSegment seg;
  if (rank_ == 0) {  // makes it and says its name (or why it failed) before anyone may read the header
    h->window_name[0] = h->window_error[0] = '\0';
    try {
      seg = ShmSegment::create(total);
      std::snprintf(h->window_name, sizeof(h->window_name), "%s", seg.name().c_str());
    } catch (const std::exception& e) {
      std::snprintf(h->window_error, sizeof(h->window_error), "%s", e.what());
    }
  }
  publish_fingerprint(k);
  signal();
  wait_all(phase_);
  check_fingerprints(k);  // every rank asked for the same bytes
  std::string failed = h->window_error;
  if (failed.empty() && rank_ != 0) {
    try {
      seg = ShmSegment::open(h->window_name, total);
    } catch (const std::exception& e) {
      failed = e.what();
    }
  }
  // Everyone has opened it (or failed, and says so) before rank 0 unlinks the name; every rank reads every
  // verdict before the last synchronisation, after which a peer may go on and reuse xaddr or the header.
  control(rank_)->xaddr[k & 1].store(failed.empty() ? 0 : 1, std::memory_order_relaxed);
  signal();
  wait_all(phase_);
  if (rank_ == 0 && seg.data()) seg.unlink();
  int culprit = -1;
  for (int q = 0; q < nranks_ && culprit < 0; ++q)
    if (control(q)->xaddr[k & 1].load(std::memory_order_relaxed) != 0) culprit = q;
  end_slice(k);
  signal();
  wait_all(phase_);
  if (culprit >= 0)
    throw CommError("ringzero.empty: " + std::to_string(bytes) + " bytes per rank of memory shared by the " +
                    std::to_string(nranks_) + " ranks of this host failed on group rank " +
                    std::to_string(group_ranks_[culprit]) + (failed.empty() ? "" : ": " + failed) +
                    " (is /dev/shm large enough? `df -h /dev/shm`)");
  auto w = std::make_shared<ShmWindow>(std::move(seg), rank_, pids, bytes, stride, id);
  ShmWindow::add(w);
  return w;
}

std::shared_ptr<ShmWindow> ShmComm::registered(const void* p, size_t bytes, CollectiveKind kind) const {
  if (nranks_ == 1) return nullptr;
  std::shared_ptr<ShmWindow> w = ShmWindow::find(p, bytes);
  if (!w) return nullptr;
  bool ours = w->nranks() == nranks_ && w->rank() == rank_;
  for (int q = 0; q < nranks_ && ours; ++q) ours = w->pids()[q] == header()->pids[q].load();
  if (!ours) {
    std::ostringstream s;
    s << "ringzero " << collective_name(kind) << " on group rank "
      << group_ranks_[rank_] << ": the tensor was allocated by ringzero.empty for another group (its "
      << w->nranks() << " ranks on this host are other processes, or in another order, than this group's "
      << nranks_ << "); allocate it with ringzero.empty(..., group=<this group>) or pass a plain tensor";
    throw InvalidArgument(s.str());
  }
  return w;
}

void ShmComm::start_registered(const ShmWindow& w, const char* in) {
  const uint64_t offset = static_cast<uint64_t>(in - w.region(rank_));
  const uint64_t k = begin_slice();
  // By slice parity, like the fingerprints: a rank that finds the mismatch first throws and may start its
  // next collective (slice k + 1) while a slower peer still reads slice k's offsets. With one field it
  // overwrote its offset, the peer saw equal offsets, ran the registered all-reduce alone and the group
  // failed with a timeout instead of a CollectiveMismatch on every rank.
  control(rank_)->xaddr[k & 1].store(offset, std::memory_order_relaxed);
  publish_fingerprint(k);
  signal();
  wait_all(phase_);
  check_fingerprints(k);
  for (int q = 0; q < nranks_; ++q) {
    const uint64_t theirs = control(q)->xaddr[k & 1].load(std::memory_order_relaxed);
    if (theirs == offset) continue;
    end_slice(k);
    throw CollectiveMismatchError(
        "ringzero collective mismatch detected on group rank " + std::to_string(group_ranks_[rank_]) + ": in " +
        collective_name(static_cast<CollectiveKind>(current_.kind)) + " (sequence number " +
        std::to_string(current_.seq) + ") group rank " + std::to_string(group_ranks_[q]) +
        " passed its tensor from byte " + std::to_string(theirs) + " of the allocation, this rank from byte " +
        std::to_string(offset) + ": every rank must pass the same part of its tensor from one ringzero.empty");
  }
  current_slice_ = k;
}

void ShmComm::finish_registered() {
  end_slice(current_slice_);
  signal();
  wait_all(phase_);  // no rank returns while a peer may still read its tensor
}

}  // namespace ringzero
