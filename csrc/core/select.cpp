// The CPU selector: [Note: the CPU selector] in select.h. Each rule reads like the chain of checks it
// is; the thresholds are kCpuThresholds'.
#include "select.h"

namespace ringzero {

namespace {
constexpr const CpuThresholds& T = kCpuThresholds;
}  // namespace

AllReduceAlgo choose_all_reduce(size_t bytes, size_t slot_bytes) {
  if (bytes <= T.one_shot_max_bytes && bytes <= slot_bytes) return AllReduceAlgo::OneShot;
  return AllReduceAlgo::TwoShot;
}

bool window_wanted(const CpuCall& c) {
  if (c.nranks == 1 || c.bytes < T.registered_min_bytes) return false;
  switch (c.op) {
    // In place, where Auto takes the two-shot: the one-shot's single synchronisation beats the direct
    // path's three below that.
    case CpuOp::AllReduce:
      return c.in_place && c.requested == AllReduceAlgo::Auto &&
             choose_all_reduce(c.bytes, c.slot_bytes) == AllReduceAlgo::TwoShot;
    case CpuOp::ReduceScatter:
    case CpuOp::AllGather:
      return true;
  }
  return false;
}

CopyMode stage_copy(int nranks, size_t bytes, int stage_stream_mode, bool other_cache) {
  const bool stream = nranks == 2 && bytes >= T.stage_stream_min_bytes &&
                      (stage_stream_mode == 1 || (stage_stream_mode == 2 && other_cache));
  return stream ? CopyMode::Streaming : CopyMode::Cached;
}

bool stage_probe_applies(int nranks, size_t bytes) { return nranks == 2 && bytes >= T.stage_stream_min_bytes; }

bool reprobe_due(bool probed_before, uint64_t calls_since, uint64_t bytes_since) {
  return !probed_before || calls_since >= T.stage_reprobe_calls || bytes_since >= T.stage_reprobe_bytes;
}

namespace {

// The registered path, whose output of `out_bytes` per rank streams past the last-level cache when large.
CpuPlan registered_plan(size_t out_bytes) {
  CpuPlan p;
  p.path = CpuPath::Registered;
  p.out = out_bytes >= T.registered_stream_bytes ? CopyMode::Streaming : CopyMode::Cached;
  return p;
}

CpuPlan plan_all_reduce(const CpuCall& c) {
  if (c.registered && window_wanted(c)) {
    CpuPlan p;
    p.path = CpuPath::Registered;  // in place: no separate output to stream
    return p;
  }
  CpuPlan p;
  p.algo = c.requested == AllReduceAlgo::Auto ? choose_all_reduce(c.bytes, c.slot_bytes) : c.requested;
  // The ring stages through the cache and never probes (kept for comparison); the others follow the
  // placement.
  if (p.algo != AllReduceAlgo::Ring) {
    p.stage = stage_copy(c.nranks, c.bytes, c.stage_stream_mode, c.other_cache);
    p.reprobe = true;
  }
  return p;
}

CpuPlan plan_reduce_scatter(const CpuCall& c) {
  // An output past the last-level cache is reduced in pieces that stay in this core's cache, each written
  // out with streaming stores.
  if (c.registered && window_wanted(c)) return registered_plan(c.bytes / static_cast<size_t>(c.nranks));
  CpuPlan p;
  p.stage = stage_copy(c.nranks, c.bytes, c.stage_stream_mode, c.other_cache);
  p.reprobe = true;
  return p;
}

CpuPlan plan_all_gather(const CpuCall& c) {
  if (c.registered && window_wanted(c)) return registered_plan(c.bytes);
  CpuPlan p;
  if (c.nranks > 1 && c.single_copy != SingleCopyVote::Off && c.bytes >= T.single_copy_min_bytes) {
    p.path = CpuPath::SingleCopy;
    p.huge_pages_only = c.bytes >= T.single_copy_end_bytes;
  }
  // The staged form (or single copy's fallback). Two ranks, a large block: the output (both ranks'
  // together past a last-level cache) with streaming stores, the slots as the first slice's probe says;
  // otherwise the slots follow the placement like the all-reduce's.
  const bool big = c.nranks == 2 && c.bytes >= T.single_copy_end_bytes;
  if (big) {
    p.out = CopyMode::Streaming;
    p.probe_first_slice = true;
  } else {
    p.stage = stage_copy(c.nranks, static_cast<size_t>(c.nranks) * c.bytes, c.stage_stream_mode, c.other_cache);
    p.reprobe = true;
  }
  return p;
}

}  // namespace

CpuPlan select_plan(const CpuCall& c) {
  switch (c.op) {
    case CpuOp::AllReduce: return plan_all_reduce(c);
    case CpuOp::ReduceScatter: return plan_reduce_scatter(c);
    case CpuOp::AllGather: return plan_all_gather(c);
  }
  return CpuPlan{};
}

bool a2a_stage_first(SingleCopyVote vote, bool own_largest_spans_slices, size_t own_largest_bytes) {
  return !(vote == SingleCopyVote::On && own_largest_spans_slices && own_largest_bytes >= T.single_copy_min_bytes);
}

bool a2a_single_copy(SingleCopyVote vote, size_t slices, size_t largest_bytes) {
  return slices > 1 && largest_bytes >= T.single_copy_min_bytes && vote != SingleCopyVote::Off;
}

CopyMode a2a_own_copy(size_t own_bytes) {
  return own_bytes >= T.a2a_stream_own_bytes ? CopyMode::Streaming : CopyMode::Cached;
}

}  // namespace ringzero
