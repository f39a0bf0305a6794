// The reduce-scatter's algorithms (layer 1), as free functions over the slice context; the plan is the
// selector's (select.h), ShmComm::reduce_scatter runs it.
#include <algorithm>

#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

namespace {
// The registered reduce-scatter's piece when it streams its output: small enough to stay in L1/L2.
constexpr size_t kReducePieceBytes = 32 << 10;
}  // namespace

// Staged: each rank stages the slice of every peer's destination block; rank r reduces block r from its
// own input and the peers' slots straight into its output. Per rank per slice of B bytes of output: writes
// (n-1)*B to shm, reads (2n-1)*B, writes B; one synchronisation.
void reduce_scatter_staged(SliceContext& ctx, const char* input, char* out, size_t count_per_rank, DType dtype,
                           ReduceOp op, CopyMode stage) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  const Prepared p = prepare(op, n);
  const size_t bytes = n * count_per_rank * es;
  ctx.run_slices(
      count_per_rank, ctx.slot_bytes() / es / n, SliceContext::kWaitAll,
      [&](const auto& sl) {
        for (int q = 0; q < n; ++q)  // block q for rank q's reduction; this rank's own block stays in `in`
          if (q != rank)
            (stage == CopyMode::Streaming ? copy_streaming : copy_cached)(
                ctx.slot(rank, sl.k) + q * sl.count * es, input + (q * count_per_rank + sl.offset) * es, sl.count * es);
      },
      [](const auto&) {},
      [&](const auto& sl) {
        ctx.reprobe_staging(sl, bytes, stage);
        const char* own = input + (rank * count_per_rank + sl.offset) * es;
        const void** srcs = ctx.srcs();
        for (int q = 0; q < n; ++q) srcs[q] = q == rank ? own : ctx.slot(q, sl.k) + rank * sl.count * es;
        reduce_n(out + sl.offset * es, srcs, n, sl.count, dtype, p.op, p.divisor);
      });
}

// Registered ([Note: registered tensors], shm_window.cpp): reads block `rank` of every input (nranks * count
// elements) and writes count; two synchronisations. `out` may be this rank's own block of its input.
void reduce_scatter_registered(SliceContext& ctx, const ShmWindow& w, const char* in, char* out, size_t count,
                               DType dtype, ReduceOp op, CopyMode out_copy) {
  const int n = ctx.nranks(), rank = ctx.rank();
  SliceContext::OpGuard guard(ctx.comm(), CollectiveKind::ReduceScatterRegistered, dtype, op,
                              static_cast<int>(w.id()), count);
  const size_t es = dtype_size(dtype);
  const Prepared p = prepare(op, n);
  ctx.start_registered(w, in);
  const size_t offset = static_cast<size_t>(in - w.region(rank)) + rank * count * es;
  const void** srcs = ctx.srcs();
  if (out_copy == CopyMode::Cached) {
    for (int q = 0; q < n; ++q) srcs[q] = w.region(q) + offset;
    reduce_n(out, srcs, n, count, dtype, p.op, p.divisor);
  } else {  // an output past the last-level cache: reduced in pieces that stay in this core's cache, each
            // then written out with streaming stores (no read of the output's lines before they are written)
    alignas(64) static thread_local char piece[kReducePieceBytes];
    const size_t per = kReducePieceBytes / es;
    for (size_t at = 0; at < count; at += per) {
      const size_t m = std::min(per, count - at);
      for (int q = 0; q < n; ++q) srcs[q] = w.region(q) + offset + at * es;
      reduce_n(piece, srcs, n, m, dtype, p.op, p.divisor);
      copy_streaming(out + at * es, piece, m * es);
    }
  }
  ctx.finish_registered();
}

}  // namespace ringzero
