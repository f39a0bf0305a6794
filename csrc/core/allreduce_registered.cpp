// The registered all-reduce (layer 1): in place, on a tensor from ringzero.empty, as the two-shot with the
// tensors as the slots ([Note: registered tensors], shm_window.cpp). select_plan takes it for an in-place
// Auto call that would run the two-shot, when the tensor lies in a window of this communicator.
// Per rank: reads chunk `rank` of every tensor and writes it (count / nranks each), then copies the other
// chunks from their owners; three synchronisations. Bitwise identical to the staged two-shot.
#include <cstring>

#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

void all_reduce_registered(SliceContext& ctx, const ShmWindow& w, char* x, size_t count, DType dtype, ReduceOp op) {
  const int n = ctx.nranks(), rank = ctx.rank();
  SliceContext::OpGuard guard(ctx.comm(), CollectiveKind::AllReduceRegistered, dtype, op, static_cast<int>(w.id()),
                              count);
  const size_t es = dtype_size(dtype);
  const Prepared p = prepare(op, n);
  ctx.start_registered(w, x);
  const size_t offset = static_cast<size_t>(x - w.region(rank));
  const Range mine = chunk_range(count, n, rank, es);
  const void** srcs = ctx.srcs();
  for (int q = 0; q < n; ++q) srcs[q] = w.region(q) + offset + mine.offset * es;
  reduce_n(x + mine.offset * es, srcs, n, mine.count, dtype, p.op, p.divisor);
  ctx.signal();
  ctx.wait_all();
  for (int i = 1; i < n; ++i) {
    const int q = (rank + i) % n;
    const Range c = chunk_range(count, n, q, es);
    std::memcpy(x + c.offset * es, w.region(q) + offset + c.offset * es, c.count * es);
  }
  ctx.finish_registered();
}

}  // namespace ringzero
