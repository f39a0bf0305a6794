// The ring all-reduce over the slots (layer 1): copy in; barrier; n-1 reduce-scatter steps where rank r
// folds chunk (r - t) of its left neighbour into its own slot, waiting only on that neighbour (NCCL's
// recvReduceSend, through memory); barrier; every rank copies the final chunks out (chunk c is final in
// the slot of rank c - 1).
// Per rank per slice of B bytes: reads 3B + writes 2B + (n-2)B/n; n+1 synchronisations, n-1 of them
// with one neighbour only. Kept for comparison and for RINGZERO_ALLREDUCE_ALGO=ring: it stages through
// the cache and never re-probes (its plan says so).
#include <cstring>

#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

void all_reduce_ring(SliceContext& ctx, const AllReduceArgs& a) {
  const size_t es = dtype_size(a.dtype);
  const int n = ctx.nranks(), rank = ctx.rank();
  const Prepared p = prepare(a.op, n);
  const int left = (rank + n - 1) % n;
  run_staged_all_reduce(ctx, a, [&](const SliceContext::Slice& sl) {
    const uint64_t k = sl.k;
    const uint64_t base = ctx.phase();  // every rank has completed this phase
    for (int t = 1; t < n; ++t) {
      ctx.wait_one(left, base + t - 1);  // left has finished its step t - 1
      const int c = (rank - t + n) % n;
      const Range cr = chunk_range(sl.count, n, c, es);
      char* mine = ctx.slot(rank, k) + cr.offset * es;
      const void* pair[2] = {mine, ctx.slot(left, k) + cr.offset * es};
      reduce_n(mine, pair, 2, cr.count, a.dtype, p.op, t == n - 1 ? p.divisor : 1);
      ctx.signal();
    }
    ctx.signal();
    ctx.wait_all();

    char* dst = static_cast<char*>(a.out) + sl.offset * es;
    for (int c = 0; c < n; ++c) {
      const Range cr = chunk_range(sl.count, n, c, es);
      std::memcpy(dst + cr.offset * es, ctx.slot((c + n - 1) % n, k) + cr.offset * es, cr.count * es);
    }
  });
}

}  // namespace ringzero
