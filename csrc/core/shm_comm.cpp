// ShmComm's lifetime and its record of operations: the constructor that makes or opens the segment,
// and each collective's start and finish (sequence number, fingerprint, deadline, flight-recorder
// history). The class is defined across files by job:
//   shm_slots.h/.cpp       segment layout, the slot protocol, fingerprints, run_slices (the skeleton)
//   shm_wait.h/.cpp        [Note: waiting in the shared-memory collectives]: the wait loop (shared with
//                          shm_p2p.cpp), the waits for peers, the culprit's diagnosis, the abort
//   shm_placement.h/.cpp   [Note: where the host runs the ranks' cores]: the probe, streaming copies
//   shm_collectives.cpp    the algorithms: all-reduce (one-shot, two-shot, ring), reduce-scatter,
//                          all-gather(-v), broadcast, reduce, barrier
#include "shm_comm.h"

#include <unistd.h>

#include "errors.h"
#include "shm_slots.h"
#include "shm_wait.h"

namespace ringzero {
namespace {
constexpr uint64_t kMagic = 0x72696e677a65726fULL;  // "ringzero"
}  // namespace

ShmComm::ShmComm(const std::string& name, int rank, int nranks, size_t slot_bytes, double timeout_s,
                 std::vector<int> group_ranks)
    : rank_(rank), nranks_(nranks), slot_bytes_(slot_bytes), timeout_s_(timeout_s),
      group_ranks_(std::move(group_ranks)) {
  if (nranks < 1 || nranks > kShmMaxRanks)
    throw InvalidArgument("nranks must be in [1, " + std::to_string(kShmMaxRanks) + "], got " +
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

}  // namespace ringzero
