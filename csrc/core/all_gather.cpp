// The all-gather's staged and registered algorithms (layer 1), as free functions over the slice context;
// the plan is the selector's (select.h), ShmComm::all_gather runs it (the single copy is
// shm_single_copy.cpp's).
#include "slice_context.h"

namespace ringzero {

// Staged through the segment: per rank per slice of B bytes, writes B into its slot and copies the n
// slots out. A single-copy form (process_vm_readv from the peers' buffers, as MPI libraries do) was
// slower on the 2-core VM: its one kernel copy cost more than these two user copies (benchmarks/
// RESULTS.md, "The shared-memory collectives' measurements, moved out of the code").
// The plan's output copy (two ranks, a large block: streaming, the output past a last-level cache), and its
// slots as the first slice's probe says (probe_first_slice) or as the placement verdict says, re-probed
// (reprobe). All from the op's arguments but the probe, which both ranks run: the same on every rank.
void all_gather_staged(SliceContext& ctx, const char* input, char* output, size_t count, DType dtype,
                       const CpuPlan& plan) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  auto copy_out = plan.out == CopyMode::Streaming ? copy_streaming : copy_cached;
  CopyMode stage = plan.stage;
  ctx.run_slices(
      count, ctx.slot_bytes() / es, SliceContext::kWaitAll,
      [&](const auto& sl) { ctx.stage_input(input, sl, es, stage); },
      [&](const auto& sl) {
        // The own block needs no peer: copied while they stage theirs (from the slot, in this core's
        // cache, unless streamed past it), unless `in` is this rank's block of `out` already. Before the
        // first slice's check: a mismatch raises with `out` holding this rank's block, and `in` untouched.
        const char* src = input + sl.offset * es;
        char* own = output + (rank * count + sl.offset) * es;
        if (own != src) copy_out(own, stage == CopyMode::Streaming ? src : ctx.slot(rank, sl.k), sl.count * es);
      },
      [&](const auto& sl) {
        if (sl.index == 0 && plan.probe_first_slice)
          stage = ctx.peer_on_other_cache(1 - rank) ? CopyMode::Streaming : CopyMode::Cached;
        if (plan.reprobe) ctx.reprobe_staging(sl, n * count * es, stage);
        for (int q = 0; q < n; ++q)
          if (q != rank) copy_out(output + (q * count + sl.offset) * es, ctx.slot(q, sl.k), sl.count * es);
      });
}

// Registered ([Note: registered tensors], shm_window.cpp): copies nranks blocks (its own and each peer's,
// straight from the peer's region); two synchronisations.
void all_gather_registered(SliceContext& ctx, const ShmWindow& w, const char* in, char* out, size_t count, DType dtype,
                           CopyMode out_copy) {
  const int n = ctx.nranks(), rank = ctx.rank();
  SliceContext::OpGuard guard(ctx.comm(), CollectiveKind::AllGatherRegistered, dtype, ReduceOp::Sum,
                              static_cast<int>(w.id()), count);
  const size_t es = dtype_size(dtype), block = count * es;
  auto copy = out_copy == CopyMode::Streaming ? copy_streaming : copy_cached;
  ctx.start_registered(w, in);
  const size_t offset = static_cast<size_t>(in - w.region(rank));
  for (int i = 0; i < n; ++i) {  // from its own block up, so that the ranks start on different peers
    const int q = (rank + i) % n;
    char* dst = out + q * block;
    const char* src = w.region(q) + offset;
    if (dst != src) copy(dst, src, block);
  }
  ctx.finish_registered();
}

}  // namespace ringzero
