// The two-shot all-reduce over the slots (layer 1): copy in; barrier; rank r reduces chunk r of all slots
// into its own slot (reduce-scatter); barrier; every rank copies all reduced chunks out (all-gather).
// Per rank per slice of B bytes: reads 3B + writes 2B + B/n; two synchronisations. Bitwise identical
// on every rank (each chunk is reduced once). Staging only the peers' chunks and reducing the own one
// from `in` (as reduce_scatter does) was slower (the reduction then writes slot lines a peer read last).
// Past the L3 it runs at 70-86% of the memory floor; what is left is the exchange itself (each rank
// copies its peers' chunks out of another core's cache, which the copy in's memory reads do not
// overlap). Prefetching, streaming stores, a pipelined three-buffer order, a fused reduction and other
// slice sizes were measured and dropped: benchmarks/RESULTS.md, "The shared-memory collectives'
// measurements, moved out of the code".
#include <cstring>

#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

void all_reduce_two_shot(SliceContext& ctx, const AllReduceArgs& a) {
  const size_t es = dtype_size(a.dtype);
  const int n = ctx.nranks(), rank = ctx.rank();
  const Prepared p = prepare(a.op, n);
  run_staged_all_reduce(ctx, a, [&](const SliceContext::Slice& sl) {
    const uint64_t k = sl.k;
    const Range mine = chunk_range(sl.count, n, rank, es);
    const void** srcs = ctx.srcs();
    for (int q = 0; q < n; ++q) srcs[q] = ctx.slot(q, k) + mine.offset * es;
    reduce_n(ctx.slot(rank, k) + mine.offset * es, srcs, n, mine.count, a.dtype, p.op, p.divisor);
    ctx.signal();
    // This rank's own chunk first: it needs no peer, so it fills the time a late peer would cost.
    char* dst = static_cast<char*>(a.out) + sl.offset * es;
    std::memcpy(dst + mine.offset * es, ctx.slot(rank, k) + mine.offset * es, mine.count * es);
    ctx.wait_all();
    for (int q = 0; q < n; ++q) {
      if (q == rank) continue;
      const Range c = chunk_range(sl.count, n, q, es);
      std::memcpy(dst + c.offset * es, ctx.slot(q, k) + c.offset * es, c.count * es);
    }
  });
}

}  // namespace ringzero
