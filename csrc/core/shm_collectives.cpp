// The shared-memory collectives. Each algorithm is one run_slices (shm_slots.h) whose steps read like
// the schedule: stage (copy in), work that needs no peer, wait, consume (reduce, copy out). The cost
// comments count bytes per rank per slice of B bytes and the synchronisations.
#include <algorithm>
#include <cstring>

#include "errors.h"
#include "reduce.h"
#include "shm_placement.h"
#include "shm_single_copy.h"
#include "shm_slots.h"
#include "shm_window.h"
#include "slice_context.h"

namespace ringzero {

namespace {
constexpr auto no_work = [](const auto&) {};
}  // namespace

AllReduceAlgo ShmComm::choose_all_reduce(size_t bytes) const { return ringzero::choose_all_reduce(bytes, slot_bytes_); }

CpuCall ShmComm::call_facts(CpuOp op, size_t bytes) const {
  CpuCall c{op, bytes, nranks_, slot_bytes_};
  c.stage_stream_mode = stage_stream_mode_;
  c.other_cache = stage_other_cache_;
  c.single_copy = single_copy_;
  return c;
}

CpuPlan ShmComm::plan_call(CpuCall call, const void* in, CollectiveKind kind, std::shared_ptr<ShmWindow>& w) const {
  w = window_wanted(call) ? registered(in, call.bytes, kind) : nullptr;
  call.registered = w != nullptr;
  return select_plan(call);
}

// The plan is the selector's (select.h): a tensor from ringzero.empty read where it lies ([Note:
// registered tensors], shm_window.cpp), else the staged schedule, one file each (allreduce_*.cpp).
void ShmComm::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, AllReduceAlgo algo) {
  CpuCall call = call_facts(CpuOp::AllReduce, count * dtype_size(dtype));
  call.in_place = in == out;
  call.requested = algo;
  SliceContext ctx(*this);
  std::shared_ptr<ShmWindow> w;
  const CpuPlan plan = plan_call(call, in, CollectiveKind::AllReduce, w);
  if (plan.path == CpuPath::Registered) return all_reduce_registered(ctx, *w, static_cast<char*>(out), count, dtype, op);
  OpGuard guard(this, CollectiveKind::AllReduce, dtype, op, -1, count);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, call.bytes);
    return;
  }
  const AllReduceArgs args{in, out, count, dtype, op, plan.stage, plan.reprobe};
  switch (plan.algo) {
#define RINGZERO_RUN_ALGO_(value, name, fn) \
  case AllReduceAlgo::value:                \
    return fn(ctx, args);
    RINGZERO_CPU_ALL_REDUCE_ALGOS(RINGZERO_RUN_ALGO_)
#undef RINGZERO_RUN_ALGO_
    default: return all_reduce_two_shot(ctx, args);
  }
}

void ShmComm::set_stage_streaming(int mode) {
  if (mode < 0 || mode > 2)
    throw InvalidArgument("set_stage_streaming: mode must be 0 (never), 1 (always) or 2 (by the placement probe), got " +
                          std::to_string(mode));
  stage_stream_mode_ = mode;
}

bool ShmComm::stage_streaming(size_t bytes) const {
  return stage_copy(nranks_, bytes, stage_stream_mode_, stage_other_cache_) == CopyMode::Streaming;
}

// At the first slice's consume step (both ranks past its wait): a call that may stream probes the
// placement again when it is the first, or stage_reprobe_calls such calls or stage_reprobe_bytes have run
// since the last probe; the verdict holds for this call's later slices and the next calls. The probe runs
// at the same call on both ranks: it depends on the calls and their sizes alone, which are the same on
// each, not on set_stage_streaming (a rank's own, like the store type, which never changes the protocol).
void ShmComm::reprobe_staging(const Slice& sl, size_t bytes, bool& stream) {
  if (sl.index != 0 || !stage_probe_applies(nranks_, bytes)) return;
  if (reprobe_due(staged_probed_, staged_calls_, staged_bytes_)) {
    stage_other_cache_ = peer_on_other_cache(1 - rank_);
    stream = stage_streaming(bytes);
    staged_probed_ = true;
    staged_calls_ = staged_bytes_ = 0;
  }
  staged_calls_ += 1;
  staged_bytes_ += bytes;
}

// The plan is the selector's: registered or staged (reduce_scatter.cpp).
void ShmComm::reduce_scatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
  CpuCall call = call_facts(CpuOp::ReduceScatter, nranks_ * count_per_rank * dtype_size(dtype));
  std::shared_ptr<ShmWindow> w;
  const CpuPlan plan = plan_call(call, in, CollectiveKind::ReduceScatter, w);
  SliceContext ctx(*this);
  if (plan.path == CpuPath::Registered)
    return reduce_scatter_registered(ctx, *w, static_cast<const char*>(in), static_cast<char*>(out), count_per_rank,
                                     dtype, op, plan.out);
  OpGuard guard(this, CollectiveKind::ReduceScatter, dtype, op, -1, count_per_rank);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count_per_rank * dtype_size(dtype));
    return;
  }
  reduce_scatter_staged(ctx, static_cast<const char*>(in), static_cast<char*>(out), count_per_rank, dtype, op,
                        plan.stage);
}

// The plan is the selector's: registered, single copy (shm_single_copy.cpp; it may decline, and the call
// runs staged) or staged (all_gather.cpp).
void ShmComm::all_gather(const void* in, void* out, size_t count, DType dtype) {
  CpuCall call = call_facts(CpuOp::AllGather, count * dtype_size(dtype));
  std::shared_ptr<ShmWindow> w;
  const CpuPlan plan = plan_call(call, in, CollectiveKind::AllGather, w);
  SliceContext ctx(*this);
  if (plan.path == CpuPath::Registered)
    return all_gather_registered(ctx, *w, static_cast<const char*>(in), static_cast<char*>(out), count, dtype, plan.out);
  OpGuard guard(this, CollectiveKind::AllGather, dtype, ReduceOp::Sum, -1, count);
  const size_t es = dtype_size(dtype);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count * es);
    return;
  }
  if (plan.path == CpuPath::SingleCopy &&
      all_gather_single_copy(static_cast<const char*>(in), static_cast<char*>(out), count, es, plan.huge_pages_only))
    return;
  all_gather_staged(ctx, static_cast<const char*>(in), static_cast<char*>(out), count, dtype, plan);
}

// all_gather_v, broadcast and reduce run rooted_and_v.cpp's algorithms; here the arguments' checks, the
// fingerprint (OpGuard) and one rank's shortcut.
void ShmComm::all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  if (static_cast<int>(counts.size()) != nranks_)
    throw InvalidArgument("counts must have one entry per rank");
  uint64_t total = 0, hash = 1469598103934665603ULL;  // FNV-1a over the counts
  for (int q = 0; q < nranks_; ++q) {
    total += counts[q];
    hash = (hash ^ counts[q]) * 1099511628211ULL;
  }
  // The fingerprint carries the total and a hash of the counts: ranks that disagree on `counts` raise
  // CollectiveMismatchError.
  OpGuard guard(this, CollectiveKind::AllGatherV, dtype, ReduceOp::Sum, static_cast<int32_t>(hash & 0x7fffffff), total);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, counts[0] * dtype_size(dtype));
    return;
  }
  SliceContext ctx(*this);
  all_gather_v_staged(ctx, static_cast<const char*>(in), static_cast<char*>(out), counts, dtype);
}

void ShmComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Broadcast, dtype, ReduceOp::Sum, root, count);
  if (nranks_ == 1) return;
  SliceContext ctx(*this);
  broadcast_staged(ctx, static_cast<char*>(buf), count, dtype, root);
}

void ShmComm::reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Reduce, dtype, op, root, count);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count * dtype_size(dtype));
    return;
  }
  SliceContext ctx(*this);
  reduce_staged(ctx, static_cast<const char*>(in), static_cast<char*>(out), count, dtype, op, root);
}

// One slice with nothing staged: the first slice's wait for every rank, with the fingerprint check.
void ShmComm::barrier() {
  OpGuard guard(this, CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, -1, 0);
  if (nranks_ == 1) return;
  run_slices(0, 1, kWaitAll, no_work, no_work, no_work);
}

}  // namespace ringzero
