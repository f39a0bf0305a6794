// The shared-memory all-to-all (even and uneven, torch's all_to_all_single): the exchange as a free function over
// the slice context, and ShmComm's entry points of it and of gather and scatter (their algorithms: rooted_and_v.cpp). Same vocabulary as shm_collectives.cpp (stage,
// meanwhile, wait, consume); the cost comments count bytes per rank.
//
// [Note: the all-to-all's count table]
// Every rank of an all-to-all knows what it sends to each peer and what it expects from each, never the
// whole matrix. Its first slice carries, at the head of the rank's slot, a header: the input's address,
// a probe address for single copy, and the rank's send and receive counts (2n words). After that
// slice's one wait every rank reads every header, so every rank holds the same n x n matrix and reaches
// the same verdicts from it alone: whether the ranks agree (rank q's send[p] == rank p's recv[q] for all
// pairs; otherwise every rank raises the same CollectiveMismatchError naming the first pair), how many
// slices the exchange takes (the largest block over the slot's per-peer piece), and whether the blocks
// are read from the peers' inputs directly (single copy). The first slice also carries each block's
// first piece, so that an all-to-all of small blocks costs one synchronisation, like a one-shot.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <sys/uio.h>

#include "errors.h"
#include "shm_placement.h"
#include "shm_single_copy.h"
#include "shm_slots.h"
#include "slice_context.h"

namespace ringzero {

namespace {
constexpr auto no_work = [](const auto&) {};

// The header of an all-to-all's first slice ([Note: the all-to-all's count table]), in 64-bit words.
constexpr size_t kA2AFixedWords = 3;  // the input's address, the probe address, 1 if the first pieces are staged
inline size_t a2a_header_bytes(int n) { return round_up((kA2AFixedWords + 2 * static_cast<size_t>(n)) * 8, 64); }

// A few bytes every rank's process holds for the whole run: what a single-copy vote reads of its peers
// when the all-to-all's own inputs may be empty.
alignas(64) char single_copy_probe[64];
}  // namespace

bool ShmComm::vote_single_copy(const std::vector<uint64_t>& peer_addr, size_t probe_bytes) {
  bool ok = single_copy_allowed_;  // a rank that does not allow it votes no without trying
  char probe[64];
  for (int q = 0; q < nranks_ && ok; ++q) {
    if (q == rank_) continue;
    iovec local{probe, std::min(probe_bytes, sizeof(probe))};
    iovec remote{reinterpret_cast<void*>(peer_addr[q]), local.iov_len};
    ok = process_vm_readv(header()->pids[q].load(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(local.iov_len);
  }
  control(rank_)->xverdict.store(ok ? 1 : 2, std::memory_order_relaxed);
  signal();
  wait_all(phase_);
  bool all = true;
  for (int q = 0; q < nranks_; ++q) all = all && control(q)->xverdict.load(std::memory_order_relaxed) == 1;
  single_copy_ = all ? SingleCopy::On : SingleCopy::Off;
  return all;
}

// All-to-all: the first slice exchanges the headers and each block's first piece; later slices stream
// the rest of every block through the slots, each rank's slot cut in one piece per destination.
// Staged, per rank: writes its input (less its own block) to shm once, reads every block it receives
// once; one synchronisation per slice, the first one included (the blocks' first pieces ride with the
// headers). Single copy (blocks of single_copy_min_bytes and more, where the ranks' vote allows it): the
// first piece as staged, the rest read from the peers' inputs (process_vm_readv), then one more
// synchronisation so that no rank returns while a peer still reads its input.
// Invariant: every choice (the slices, single copy) is a function of the count matrix and of votes
// that every rank reads alike, so the ranks never take different paths.
void all_to_all_v_exchange(SliceContext& ctx, const char* input, char* output, const std::vector<size_t>& send_counts,
                           const std::vector<size_t>& recv_counts, DType dtype) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  std::vector<size_t> sdispl(n + 1, 0), rdispl(n + 1, 0);
  for (int q = 0; q < n; ++q) {
    sdispl[q + 1] = sdispl[q] + send_counts[q];
    rdispl[q + 1] = rdispl[q] + recv_counts[q];
  }
  const size_t hdr = a2a_header_bytes(n);
  const size_t piece_elems = (ctx.slot_bytes() - hdr) / n / 64 * 64 / es;  // per destination, per slice
  auto piece = [&](int dst, uint64_t k) { return ctx.slot(rank, k) + hdr + static_cast<size_t>(dst) * piece_elems * es; };
  auto peer_piece = [&](int src, uint64_t k) {
    return static_cast<const char*>(ctx.slot(src, k)) + hdr + static_cast<size_t>(rank) * piece_elems * es;
  };
  // Rank q's header in slice k's slot: [input address, probe address, staged, send[0..n), recv[0..n)].
  auto header_of = [&](int q, uint64_t k) { return reinterpret_cast<const uint64_t*>(ctx.slot(q, k)); };

  // Where single copy is on for good and this rank holds a block that only single copy moves, every rank
  // reads the peers directly this call: staging the first pieces would copy them for nothing. The header
  // says so, and the readers take those blocks whole from the input.
  size_t own_largest = 0;
  for (int q = 0; q < n; ++q)
    if (q != rank) own_largest = std::max(own_largest, send_counts[q]);
  const bool stage_first = a2a_stage_first(ctx.single_copy(), own_largest > piece_elems, own_largest * es);
  std::vector<char> first_staged(n, 1);
  size_t slices = 1;
  bool direct = false;
  std::vector<uint64_t> peer_input(n);
  std::vector<size_t> peer_offset(n);  // where this rank's block lies in rank q's input (elements)
  for (size_t s = 0; s < slices; ++s) {
    const uint64_t k = ctx.begin_slice();
    if (s == 0) {
      auto* h = reinterpret_cast<uint64_t*>(ctx.slot(rank, k));
      h[0] = reinterpret_cast<uint64_t>(input);
      h[1] = reinterpret_cast<uint64_t>(single_copy_probe);
      h[2] = stage_first ? 1 : 0;
      for (int q = 0; q < n; ++q) {
        h[kA2AFixedWords + q] = send_counts[q];
        h[kA2AFixedWords + n + q] = recv_counts[q];
      }
    }
    if (s == 0 ? stage_first : !direct)
      for (int q = 0; q < n; ++q) {  // stage: this slice's piece of every peer's block
        if (q == rank) continue;
        const Range r = slice_range(send_counts[q], piece_elems, s);
        std::memcpy(piece(q, k), input + (sdispl[q] + r.offset) * es, r.count * es);
      }
    if (s == 0) ctx.publish_fingerprint(k);
    ctx.signal();
    // The own block needs no peer; a rank whose own counts disagree raises below, with every peer. A large
    // one is written with streaming stores (the output is past the caches, as the all-gather's large blocks).
    if (s == 0 && send_counts[rank] == recv_counts[rank] && output + rdispl[rank] * es != input + sdispl[rank] * es) {
      const size_t own = send_counts[rank] * es;
      (a2a_own_copy(own) == CopyMode::Streaming ? copy_streaming : copy_cached)(output + rdispl[rank] * es,
                                                                               input + sdispl[rank] * es, own);
    }
    ctx.wait_all();
    if (s == 0) {
      ctx.check_fingerprints(k);
      // [Note: the all-to-all's count table]: the same matrix, so the same verdicts, on every rank.
      size_t largest = 0;
      for (int q = 0; q < n; ++q) {
        const uint64_t* hq = header_of(q, k);
        for (int p = 0; p < n; ++p) {
          const uint64_t sent = hq[kA2AFixedWords + p], expected = header_of(p, k)[kA2AFixedWords + n + q];
          if (sent != expected) {
            std::ostringstream m;
            m << "ringzero all_to_all (sequence number " << ctx.seq() << ") on group rank " << ctx.group_rank(rank)
              << ": the ranks' split sizes disagree: group rank " << ctx.group_rank(q) << " sends " << sent
              << " elements to group rank " << ctx.group_rank(p) << ", which expects " << expected
              << " from it (rank q's input_split_sizes[p] must equal rank p's output_split_sizes[q])";
            ctx.end_slice(k);
            throw CollectiveMismatchError(m.str());
          }
          if (p != q) largest = std::max<size_t>(largest, sent);
        }
        peer_input[q] = hq[0];
        first_staged[q] = hq[2] != 0;
        size_t off = 0;
        for (int p = 0; p < rank; ++p) off += hq[kA2AFixedWords + p];
        peer_offset[q] = off;
      }
      slices = num_slices(largest, piece_elems);
      if (a2a_single_copy(ctx.single_copy(), slices, largest * es)) {
        if (ctx.single_copy() == SingleCopyVote::Untested) {
          std::vector<uint64_t> probes(n);
          for (int q = 0; q < n; ++q) probes[q] = header_of(q, k)[1];
          ctx.vote_single_copy(probes, sizeof(single_copy_probe));
        }
        direct = ctx.single_copy() == SingleCopyVote::On;
      }
    }
    for (int q = 0; q < n; ++q) {  // consume: this slice's piece of every block sent to this rank
      if (q == rank || !first_staged[q]) continue;  // (not staged: direct, which reads it whole below)
      const Range r = slice_range(recv_counts[q], piece_elems, s);
      std::memcpy(output + (rdispl[q] + r.offset) * es, peer_piece(q, k), r.count * es);
    }
    ctx.end_slice(k);
    if (direct) break;
  }
  if (!direct) return;
  ctx.count_single_copy_call();
  const uint64_t k = ctx.begin_slice();
  for (int i = 1; i < n; ++i) {  // peers in turn from this rank up: the ranks do not all start on one peer
    const int q = (rank + i) % n;
    const size_t skip = first_staged[q] ? std::min(piece_elems, recv_counts[q]) : 0;  // elements copied above
    if (recv_counts[q] > skip)
      ctx.read_peer(q, output + (rdispl[q] + skip) * es, peer_input[q] + (peer_offset[q] + skip) * es,
                (recv_counts[q] - skip) * es);
  }
  ctx.end_slice(k);
  ctx.signal();
  ctx.wait_all();
}

void ShmComm::all_to_all_v(const void* in, void* out, const std::vector<size_t>& send_counts,
                           const std::vector<size_t>& recv_counts, DType dtype) {
  const int n = nranks_;
  if (static_cast<int>(send_counts.size()) != n || static_cast<int>(recv_counts.size()) != n)
    throw InvalidArgument("all_to_all: send_counts and recv_counts must hold one entry per rank (" +
                          std::to_string(n) + ")");
  OpGuard guard(this, CollectiveKind::AllToAll, dtype, ReduceOp::Sum, -1, 0);
  if (n == 1) {
    if (send_counts[0] != recv_counts[0])
      throw CollectiveMismatchError("ringzero all_to_all on a group of one rank: it sends " +
                                    std::to_string(send_counts[0]) + " elements to itself but expects " +
                                    std::to_string(recv_counts[0]));
    if (in != out) std::memmove(out, in, send_counts[0] * dtype_size(dtype));
    return;
  }
  const size_t hdr = a2a_header_bytes(n);
  if (slot_bytes_ < hdr + static_cast<size_t>(n) * 64)
    throw InvalidArgument("all_to_all: the staging slot (" + std::to_string(slot_bytes_) + " bytes) is too small for " +
                          std::to_string(n) + " ranks; raise RINGZERO_SHM_BUFFER_BYTES to at least " +
                          std::to_string(hdr + n * 64));
  SliceContext ctx(*this);
  all_to_all_v_exchange(ctx, static_cast<const char*>(in), static_cast<char*>(out), send_counts, recv_counts, dtype);
}

// gather and scatter run rooted_and_v.cpp's algorithms; here the checks, the fingerprint and one rank's
// shortcut.
void ShmComm::gather(const void* in, void* out, size_t count, DType dtype, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Gather, dtype, ReduceOp::Sum, root, count);
  if (nranks_ == 1) {
    if (in != out) std::memmove(out, in, count * dtype_size(dtype));
    return;
  }
  SliceContext ctx(*this);
  gather_staged(ctx, static_cast<const char*>(in), static_cast<char*>(out), count, dtype, root);
}

void ShmComm::scatter(const void* in, void* out, size_t count, DType dtype, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Scatter, dtype, ReduceOp::Sum, root, count);
  if (nranks_ == 1) {
    if (in != out) std::memmove(out, in, count * dtype_size(dtype));
    return;
  }
  SliceContext ctx(*this);
  scatter_staged(ctx, static_cast<const char*>(in), static_cast<char*>(out), count, dtype, root);
}

}  // namespace ringzero
