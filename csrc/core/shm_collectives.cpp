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

// The first step of the all-reduces: this rank's slice of `in` into its slot.
inline void ShmComm::stage_input(const void* in, const Slice& sl, size_t es, bool stream) {
  (stream ? copy_streaming : copy_cached)(slot(rank_, sl.k), static_cast<const char*>(in) + sl.offset * es,
                                          sl.count * es);
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
  // Slices of the largest count; each rank's piece of slice s is its own range of it.
  const size_t max_count = *std::max_element(counts.begin(), counts.end());
  run_slices(
      max_count, slot_elems, kWaitAll,
      [&](const Slice& sl) {
        const Range my = slice_range(counts[rank_], slot_elems, sl.index);
        std::memcpy(slot(rank_, sl.k), static_cast<const char*>(in) + my.offset * es, my.count * es);
      },
      no_work,
      [&](const Slice& sl) {
        for (int q = 0; q < nranks_; ++q) {
          const Range r = slice_range(counts[q], slot_elems, sl.index);
          std::memcpy(static_cast<char*>(out) + (displ[q] + r.offset) * es, slot(q, sl.k), r.count * es);
        }
      });
}

// Broadcast: root stages a slice, the others copy it out. After the first slice the non-roots wait
// for the root alone, and the root for no one. Per non-root per slice of B bytes: reads B, writes B.
void ShmComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Broadcast, dtype, ReduceOp::Sum, root, count);
  if (nranks_ == 1) return;
  const size_t es = dtype_size(dtype);
  char* data = static_cast<char*>(buf);
  run_slices(
      count, slot_bytes_ / es, rank_ == root ? kWaitNone : root,
      [&](const Slice& sl) {
        if (rank_ == root) std::memcpy(slot(root, sl.k), data + sl.offset * es, sl.count * es);
      },
      no_work,
      [&](const Slice& sl) {
        if (rank_ != root) std::memcpy(data + sl.offset * es, slot(root, sl.k), sl.count * es);
      });
}

// Reduce: every rank stages a slice, the root reduces them (its own input read in place) into out.
// After the first slice only the root waits. Per root per slice of B bytes: reads n*B, writes B;
// non-roots write B to shm.
void ShmComm::reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) {
  if (root < 0 || root >= nranks_) throw InvalidArgument("root out of range");
  OpGuard guard(this, CollectiveKind::Reduce, dtype, op, root, count);
  const size_t es = dtype_size(dtype);
  if (nranks_ == 1) {
    if (in != out) std::memcpy(out, in, count * es);
    return;
  }
  const Prepared p = prepare(op, nranks_);
  run_slices(
      count, slot_bytes_ / es, rank_ == root ? kWaitAll : kWaitNone,
      [&](const Slice& sl) {
        if (rank_ != root) stage_input(in, sl, es, false);
      },
      no_work,
      [&](const Slice& sl) {
        if (rank_ != root) return;
        for (int q = 0; q < nranks_; ++q)
          srcs_[q] = q == root ? static_cast<const char*>(in) + sl.offset * es : slot(q, sl.k);
        reduce_n(static_cast<char*>(out) + sl.offset * es, srcs_.data(), nranks_, sl.count, dtype, p.op, p.divisor);
      });
}

// One slice with nothing staged: the first slice's wait for every rank, with the fingerprint check.
void ShmComm::barrier() {
  OpGuard guard(this, CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, -1, 0);
  if (nranks_ == 1) return;
  run_slices(0, 1, kWaitAll, no_work, no_work, no_work);
}

}  // namespace ringzero
