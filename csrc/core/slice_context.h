// The slice context (internal to csrc/core): what an algorithm written as a free function may use of its
// communicator, so that each algorithm is one file over run_slices (as csrc/cuda's are over their launch)
// rather than a private member of ShmComm. The slot protocol stays ShmComm's ([Note: the slot protocol],
// shm_slots.h); this only names the steps an algorithm takes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "select.h"
#include "shm_comm.h"
#include "shm_placement.h"
#include "shm_slots.h"

namespace ringzero {

class SliceContext {
 public:
  using Slice = ShmComm::Slice;
  using OpGuard = ShmComm::OpGuard;
  static constexpr int kWaitAll = ShmComm::kWaitAll;
  static constexpr int kWaitNone = ShmComm::kWaitNone;

  explicit SliceContext(ShmComm& comm) : c_(comm) {}

  ShmComm* comm() const { return &c_; }
  int rank() const { return c_.rank_; }
  int nranks() const { return c_.nranks_; }
  size_t slot_bytes() const { return c_.slot_bytes_; }
  // Local rank r's staging slot for slice counter k (parity k & 1).
  char* slot(int r, uint64_t k) const { return c_.slot(r, k); }
  // nranks source pointers for reduce_n (one collective runs at a time).
  const void** srcs() const { return c_.srcs_.data(); }
  // Phases this rank has signalled: wait_all() waits until every rank has signalled as many.
  uint64_t phase() const { return c_.phase_; }

  template <typename Stage, typename Meanwhile, typename Consume>
  void run_slices(size_t count, size_t slice_elems, int wait_on, Stage stage, Meanwhile meanwhile, Consume consume) {
    c_.run_slices(count, slice_elems, wait_on, stage, meanwhile, consume);
  }
  void signal() { c_.signal(); }
  void wait_all() { c_.wait_all(c_.phase_); }
  void wait_one(int r, uint64_t phase) { c_.wait_one(r, phase); }

  // This rank's slice of `in` into its slot, with the plan's copy.
  void stage_input(const void* in, const Slice& sl, size_t es, CopyMode copy) {
    (copy == CopyMode::Streaming ? copy_streaming : copy_cached)(
        slot(rank(), sl.k), static_cast<const char*>(in) + sl.offset * es, sl.count * es);
  }
  // At the first slice's consume step: the placement re-probe of a call that may stream its staging
  // (ShmComm::reprobe_staging); may change `copy` for this call's later slices.
  void reprobe_staging(const Slice& sl, size_t bytes, CopyMode& copy) {
    bool stream = copy == CopyMode::Streaming;
    c_.reprobe_staging(sl, bytes, stream);
    copy = stream ? CopyMode::Streaming : CopyMode::Cached;
  }

  // Registered memory ([Note: registered tensors], shm_window.cpp): the window of this communicator
  // holding [p, p + bytes) (nullptr if none; InvalidArgument for another group's), and the registered
  // collectives' first and last synchronisations.
  std::shared_ptr<ShmWindow> window(const void* p, size_t bytes, CollectiveKind kind) const {
    return c_.registered(p, bytes, kind);
  }
  void start_registered(const ShmWindow& w, const char* in) { c_.start_registered(w, in); }
  void finish_registered() { c_.finish_registered(); }
  // The placement probe ([Note: where the host runs the ranks' cores]): both ranks at the same point.
  bool peer_on_other_cache(int peer) { return c_.peer_on_other_cache(peer); }

  // An algorithm that runs its own slices rather than run_slices' (the all-to-all: its first slice carries
  // a header that decides how many follow): the slot protocol's steps ([Note: the slot protocol],
  // shm_slots.h), the call's fingerprint in slice k, and this call's sequence number and the group ranks
  // for its messages.
  uint64_t begin_slice() { return c_.begin_slice(); }
  void end_slice(uint64_t k) { c_.end_slice(k); }
  void publish_fingerprint(uint64_t k) { c_.publish_fingerprint(k); }
  void check_fingerprints(uint64_t k) { c_.check_fingerprints(k); }
  uint64_t seq() const { return c_.current_.seq; }
  int group_rank(int local) const { return c_.group_ranks_[local]; }
  // Single copy ([Note: single copy between a host's ranks], shm_single_copy.cpp): the vote so far (the same on every rank), the
  // vote itself at the first call that could use it (every rank together), a read of local rank q's
  // memory, and the count of calls that read directly.
  SingleCopyVote single_copy() const { return c_.single_copy_; }
  bool vote_single_copy(const std::vector<uint64_t>& peer_addr, size_t probe_bytes) {
    return c_.vote_single_copy(peer_addr, probe_bytes);
  }
  void read_peer(int q, void* dst, uint64_t src, size_t bytes) { c_.read_peer(q, dst, src, bytes); }
  void count_single_copy_call() { ++c_.single_copy_calls_; }

 private:
  ShmComm& c_;
};

// The CPU all-reduce algorithms, one file each (allreduce_*.cpp), as RINGZERO_CPU_ALL_REDUCE_ALGOS lists
// them: `in` may equal `out`; the stage copy and the re-probe as select_plan made them.
struct AllReduceArgs {
  const void* in;
  void* out;
  size_t count;
  DType dtype;
  ReduceOp op;
  CopyMode stage;  // how the slots are filled (the re-probe may change it for later slices)
  bool reprobe;    // the first slice's consume step re-probes the placement (every rank alike)
};
// The staged all-reduces' skeleton: every rank stages its slice of `in` (the plan's copy), then at the
// first slice's consume step re-probes where the plan says, then runs `consume(slice)`.
template <typename Consume>
void run_staged_all_reduce(SliceContext& ctx, const AllReduceArgs& a, Consume consume) {
  const size_t es = dtype_size(a.dtype);
  CopyMode stage = a.stage;
  ctx.run_slices(
      a.count, ctx.slot_bytes() / es, SliceContext::kWaitAll,
      [&](const SliceContext::Slice& sl) { ctx.stage_input(a.in, sl, es, stage); },
      [](const SliceContext::Slice&) {},
      [&](const SliceContext::Slice& sl) {
        if (a.reprobe) ctx.reprobe_staging(sl, a.count * es, stage);
        consume(sl);
      });
}

#define RINGZERO_DECLARE_ALGO_(value, name, fn) void fn(SliceContext& ctx, const AllReduceArgs& a);
RINGZERO_CPU_ALL_REDUCE_ALGOS(RINGZERO_DECLARE_ALGO_)
#undef RINGZERO_DECLARE_ALGO_

// The registered all-reduce (in place, straight from the peers' regions of `w`).
void all_reduce_registered(SliceContext& ctx, const ShmWindow& w, char* x, size_t count, DType dtype, ReduceOp op);

// The reduce-scatter's (reduce_scatter.cpp) and the all-gather's (all_gather.cpp): staged, and registered.
void reduce_scatter_staged(SliceContext& ctx, const char* input, char* out, size_t count_per_rank, DType dtype,
                           ReduceOp op, CopyMode stage);
void reduce_scatter_registered(SliceContext& ctx, const ShmWindow& w, const char* in, char* out, size_t count,
                               DType dtype, ReduceOp op, CopyMode out_copy);
void all_gather_staged(SliceContext& ctx, const char* input, char* output, size_t count, DType dtype,
                       const CpuPlan& plan);
void all_gather_registered(SliceContext& ctx, const ShmWindow& w, const char* in, char* out, size_t count, DType dtype,
                           CopyMode out_copy);

// rooted_and_v.cpp's, staged: the all-gather of uneven blocks and the collectives with a root.
void all_gather_v_staged(SliceContext& ctx, const char* in, char* out, const std::vector<size_t>& counts, DType dtype);
void broadcast_staged(SliceContext& ctx, char* data, size_t count, DType dtype, int root);
void reduce_staged(SliceContext& ctx, const char* in, char* out, size_t count, DType dtype, ReduceOp op, int root);
void gather_staged(SliceContext& ctx, const char* in, char* out, size_t count, DType dtype, int root);
void scatter_staged(SliceContext& ctx, const char* in, char* out, size_t count, DType dtype, int root);

// shm_alltoall.cpp's: the all-to-all of uneven blocks on two or more ranks, staged or single copy
// ([Note: the all-to-all's count table]); ShmComm::all_to_all_v checks the arguments first.
void all_to_all_v_exchange(SliceContext& ctx, const char* in, char* out, const std::vector<size_t>& send_counts,
                           const std::vector<size_t>& recv_counts, DType dtype);

}  // namespace ringzero
