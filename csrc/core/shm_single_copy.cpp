// [Note: single copy between a host's ranks]
// The staged collectives copy every byte twice: into the sender's slot, out of it into the receiver's
// buffer. An all-gather reduces nothing, so the slot buys it nothing; where the kernel lets a process
// read another's memory (cross-memory attach: process_vm_readv, Linux 3.2+, allowed between processes
// of one user unless a security policy such as Yama's ptrace_scope >= 2 or a container's seccomp
// profile refuses it), each rank reads each peer's block straight from the peer's input into its own
// output: one copy. The protocol, two synchronisations per call whatever the size:
//   1. each rank publishes its input's address (Control::xaddr) with its fingerprint and signals; all
//      wait, and check fingerprints;
//   2. each rank copies its own block, reads every peer's (peers in turn from its own rank up, so that
//      the ranks do not all start on one peer's pages), then signals again; no rank returns, so none
//      lets its caller change its input, before every peer has read it.
// A block of 8 MiB and more also publishes in step 1 whether the input lies on huge pages (below).
// Which blocks (select.h's kCpuThresholds): below single_copy_min_bytes (64 KiB) one staged slice is as fast and needs
// one synchronisation; from single_copy_end_bytes (8 MiB) on, two ranks' staged all-gather, whose output
// (twice the block, both ranks' together past a 32 MiB L3) it writes with streaming stores, beats the
// kernel's copy, which writes the output with plain stores and runs at about 60% of a memcpy here,
// unless the peers' inputs lie on huge pages: the kernel's copy pins every page it reads, and on 2 MiB
// pages it ran far faster than the staged form (benchmarks/all_gather_model.c; the numbers are in
// benchmarks/RESULTS.md, "Measurements moved out of code comments"). So a block of
// 8 MiB and more is read directly when every rank's input lies on huge pages (on_huge_pages: all but a
// third, an allocation's ragged ends; each rank asks the kernel's page tables of its own input, 10-40 us
// for 32 MiB, publishes the answer with its address, and all read all answers, so every rank takes the
// same path), with the own block copied with streaming stores (the output is past the cache); otherwise
// the call ends its first synchronisation and runs staged. Torch's CPU allocator puts tensors of 2 MiB
// and more on huge pages where THP_MEM_ALLOC_ENABLE=1; numpy does for arrays of 4 MiB and more. On the
// Intel 2-core VM the single copy beat the staged form from 256 KiB (1.8x) to 4 MiB (1.2-1.35x) per rank,
// was even at 16 MiB and lost at 64; on the AMD EPYC VM it lost from 8 MiB: so the boundary is 8 MiB per
// rank (the runs are in benchmarks/RESULTS.md, "Measurements moved out of code comments").
// The first call that qualifies decides, on every rank together: each rank votes (no at once where
// set_single_copy(false), RINGZERO_SINGLE_COPY=0, else yes if it could read a few bytes of every peer's
// input), publishes the vote, and all wait and read all votes. Single copy is on for good only if every
// vote is yes; otherwise it is off for good, and this call and all later ones run staged. The path taken
// depends only on the call's arguments and on votes every rank reads alike, so ranks never take
// different paths, even where their settings differ (a rank that stages while a peer reads directly
// would break the slot protocol: wrong data or a hang). Measurements: benchmarks/RESULTS.md, "Single copy and run-to-run spread (issue 47)".
#include "shm_single_copy.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "errors.h"
#include "shm_placement.h"
#include "shm_slots.h"

namespace ringzero {

namespace {

// PAGEMAP_SCAN's arguments, as the kernel's uapi header (linux/fs.h, Linux 6.7) defines them; spelled out
// here for older headers. The kernel checks `size`, so a layout it does not know is refused, not misread.
struct ScanRegion {
  uint64_t start, end, categories;
};
struct ScanArg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
      category_anymask, return_mask;
};
constexpr unsigned long kPagemapScan = _IOWR('f', 16, ScanArg);
constexpr uint64_t kPageIsHuge = 1 << 6;

}  // namespace

bool on_huge_pages(const void* p, size_t bytes) {
  static const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);  // kept for the process's life
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (fd < 0 || bytes == 0) return false;
  const uint64_t begin = reinterpret_cast<uint64_t>(p) & ~(page - 1);
  const uint64_t end = (reinterpret_cast<uint64_t>(p) + bytes + page - 1) & ~(page - 1);
  // Bytes on small pages tolerated: an allocation's ragged ends, where a 2 MiB page would reach past it
  // (up to 2 MiB of a block of 8 MiB, single_copy_end_bytes, that does not start on a 2 MiB boundary).
  const uint64_t allowed = (end - begin) / 3;
  // The ranges NOT on huge pages (the category inverted), the walk stopping once more than `allowed` is
  // found: for 32 MiB about 10 us on huge pages and 40 on small ones (AMD VM), against a call of ~8 ms.
  ScanRegion found[16];
  ScanArg a{};
  a.size = sizeof(a);
  a.start = begin;
  a.end = end;
  a.vec = reinterpret_cast<uint64_t>(found);
  a.vec_len = sizeof(found) / sizeof(found[0]);
  a.category_inverted = a.category_mask = a.return_mask = kPageIsHuge;
  uint64_t small = 0;
  while (a.start < end) {
    a.max_pages = (allowed - small) / page + 1;
    const int n = ioctl(fd, kPagemapScan, &a);
    if (n < 0) return false;  // ENOTTY before Linux 6.7
    for (int i = 0; i < n; ++i) small += found[i].end - found[i].start;
    if (small > allowed) return false;
    if (a.walk_end <= a.start) return false;  // no progress: do not loop
    a.start = a.walk_end;
  }
  return true;
}

void ShmComm::read_peer(int q, void* dst, uint64_t src, size_t bytes) {
  const int pid = header()->pids[q].load();
  char* d = static_cast<char*>(dst);
  while (bytes > 0) {
    iovec local{d, bytes};
    iovec remote{reinterpret_cast<void*>(src), bytes};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n > 0) {
      d += n;
      src += static_cast<uint64_t>(n);
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = n < 0 ? errno : EFAULT;
    if (process_gone(pid)) fail_wait({q}, 0, "a peer exited");
    const std::string why = "ringzero " + std::string(collective_name(static_cast<CollectiveKind>(current_.kind))) +
                            " (sequence number " + std::to_string(current_.seq) + ") on group rank " +
                            std::to_string(group_ranks_[rank_]) + ": reading group rank " +
                            std::to_string(group_ranks_[q]) + "'s input failed (" + std::strerror(err) +
                            "); set RINGZERO_SINGLE_COPY=0 to stage every copy through shared memory";
    abort_all(why);
    throw CommError(why);
  }
}

bool ShmComm::all_gather_single_copy(const char* in, char* out, size_t count, size_t es, bool huge_pages_only) {
  const size_t block = count * es;
  const bool large = huge_pages_only;  // the plan's: read directly only if on huge pages everywhere
  const uint64_t k = begin_slice();
  Control* me = control(rank_);
  me->xaddr[k & 1].store(reinterpret_cast<uint64_t>(in), std::memory_order_relaxed);
  if (large) me->xhuge.store(on_huge_pages(in, block) ? 1 : 0, std::memory_order_relaxed);
  publish_fingerprint(k);
  signal();
  // The own block needs no peer (before the fingerprint check, as in the staged all-gather: a mismatch
  // raises with `out` holding this rank's block and `in` untouched). A large block's waits until the
  // ranks know they read directly: the staged all-gather would copy it again.
  char* own = out + rank_ * block;
  if (!large && own != in) std::memcpy(own, in, block);
  wait_all(phase_);
  check_fingerprints(k);
  if (single_copy_ == SingleCopy::Untested) {
    std::vector<uint64_t> inputs(nranks_);
    for (int q = 0; q < nranks_; ++q) inputs[q] = control(q)->xaddr[k & 1].load(std::memory_order_relaxed);
    if (!vote_single_copy(inputs, block)) {
      end_slice(k);
      return false;
    }
  }
  if (large) {
    bool all = true;  // every rank reads every flag alike: the same path on every rank
    for (int q = 0; q < nranks_; ++q) all = all && control(q)->xhuge.load(std::memory_order_relaxed) == 1;
    if (!all) {
      end_slice(k);
      return false;
    }
    if (own != in) copy_streaming(own, in, block);  // the output is past a last-level cache
  }
  ++single_copy_calls_;
  for (int i = 1; i < nranks_; ++i) {
    const int q = (rank_ + i) % nranks_;
    read_peer(q, out + q * block, control(q)->xaddr[k & 1].load(std::memory_order_relaxed), block);
  }
  end_slice(k);
  signal();
  wait_all(phase_);
  return true;
}

}  // namespace ringzero
