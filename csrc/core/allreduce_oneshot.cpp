// The one-shot all-reduce over the slots (layer 1): copy in, one barrier, every rank reduces all n slots
// in rank order.
// Per rank per slice of B bytes: writes B to shm, reads n*B, writes B out; one synchronisation.
// Invariant: the same accumulation order on every rank, so results are bitwise identical.
#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

void all_reduce_one_shot(SliceContext& ctx, const AllReduceArgs& a) {
  const size_t es = dtype_size(a.dtype);
  const int n = ctx.nranks();
  const Prepared p = prepare(a.op, n);
  run_staged_all_reduce(ctx, a, [&](const SliceContext::Slice& sl) {
    const void** srcs = ctx.srcs();
    for (int q = 0; q < n; ++q) srcs[q] = ctx.slot(q, sl.k);
    reduce_n(static_cast<char*>(a.out) + sl.offset * es, srcs, n, sl.count, a.dtype, p.op, p.divisor);
  });
}

}  // namespace ringzero
