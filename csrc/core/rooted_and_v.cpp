// The all-gather of uneven blocks and the collectives with a root (broadcast, reduce, gather, scatter),
// staged, as free functions over the slice context (layer 1); ShmComm's members of the same names check
// their arguments, fingerprint the call and run them (shm_collectives.cpp, shm_alltoall.cpp). Costs per
// rank per slice of B bytes.
#include <algorithm>
#include <cstring>

#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

namespace {
constexpr auto no_work = [](const SliceContext::Slice&) {};
}  // namespace

// Writes its own piece to shm, reads everyone's; one synchronisation per slice of the largest count,
// each rank's piece of slice s its own range of it.
void all_gather_v_staged(SliceContext& ctx, const char* in, char* out, const std::vector<size_t>& counts, DType dtype) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  const size_t slot_elems = ctx.slot_bytes() / es;
  std::vector<size_t> displ(n);
  for (int q = 1; q < n; ++q) displ[q] = displ[q - 1] + counts[q - 1];
  const size_t max_count = *std::max_element(counts.begin(), counts.end());
  ctx.run_slices(
      max_count, slot_elems, SliceContext::kWaitAll,
      [&](const SliceContext::Slice& sl) {
        const Range my = slice_range(counts[rank], slot_elems, sl.index);
        std::memcpy(ctx.slot(rank, sl.k), in + my.offset * es, my.count * es);
      },
      no_work,
      [&](const SliceContext::Slice& sl) {
        for (int q = 0; q < n; ++q) {
          const Range r = slice_range(counts[q], slot_elems, sl.index);
          std::memcpy(out + (displ[q] + r.offset) * es, ctx.slot(q, sl.k), r.count * es);
        }
      });
}

// The root stages a slice, the others copy it out. After the first slice the non-roots wait for the root
// alone, and the root for no one. Per non-root: reads B, writes B.
void broadcast_staged(SliceContext& ctx, char* data, size_t count, DType dtype, int root) {
  const int rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  ctx.run_slices(
      count, ctx.slot_bytes() / es, rank == root ? SliceContext::kWaitNone : root,
      [&](const SliceContext::Slice& sl) {
        if (rank == root) std::memcpy(ctx.slot(root, sl.k), data + sl.offset * es, sl.count * es);
      },
      no_work,
      [&](const SliceContext::Slice& sl) {
        if (rank != root) std::memcpy(data + sl.offset * es, ctx.slot(root, sl.k), sl.count * es);
      });
}

// Every non-root stages a slice, the root reduces them (its own input read in place) into out. After the
// first slice only the root waits. Per root: reads n*B, writes B; non-roots write B to shm.
void reduce_staged(SliceContext& ctx, const char* in, char* out, size_t count, DType dtype, ReduceOp op, int root) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  const Prepared p = prepare(op, n);
  ctx.run_slices(
      count, ctx.slot_bytes() / es, rank == root ? SliceContext::kWaitAll : SliceContext::kWaitNone,
      [&](const SliceContext::Slice& sl) {
        if (rank != root) ctx.stage_input(in, sl, es, CopyMode::Cached);
      },
      no_work,
      [&](const SliceContext::Slice& sl) {
        if (rank != root) return;
        const void** srcs = ctx.srcs();
        for (int q = 0; q < n; ++q) srcs[q] = q == root ? in + sl.offset * es : ctx.slot(q, sl.k);
        reduce_n(out + sl.offset * es, srcs, n, sl.count, dtype, p.op, p.divisor);
      });
}

// The non-roots stage slices of their block, the root copies every slot out into its block of `out`.
// After the first slice only the root waits. Per non-root: writes B to shm; the root reads (n-1)*B and
// writes n*B.
void gather_staged(SliceContext& ctx, const char* input, char* output, size_t count, DType dtype, int root) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  ctx.run_slices(
      count, ctx.slot_bytes() / es, rank == root ? SliceContext::kWaitAll : SliceContext::kWaitNone,
      [&](const SliceContext::Slice& sl) {
        if (rank != root) std::memcpy(ctx.slot(rank, sl.k), input + sl.offset * es, sl.count * es);
      },
      [&](const SliceContext::Slice& sl) {
        if (rank == root && output + (root * count + sl.offset) * es != input + sl.offset * es)
          std::memmove(output + (root * count + sl.offset) * es, input + sl.offset * es, sl.count * es);
      },
      [&](const SliceContext::Slice& sl) {
        if (rank != root) return;
        for (int q = 0; q < n; ++q)
          if (q != root) std::memcpy(output + (q * count + sl.offset) * es, ctx.slot(q, sl.k), sl.count * es);
      });
}

// The root stages the slice of every peer's block in its slot (one piece per rank), each non-root copies
// its own piece out. After the first slice the non-roots wait for the root alone, and the root for no
// one. Per non-root: reads B, writes B; the root writes (n-1)*B.
void scatter_staged(SliceContext& ctx, const char* input, char* output, size_t count, DType dtype, int root) {
  const int n = ctx.nranks(), rank = ctx.rank();
  const size_t es = dtype_size(dtype);
  const size_t piece_elems = std::max<size_t>(1, ctx.slot_bytes() / n / 64 * 64 / es);
  ctx.run_slices(
      count, piece_elems, rank == root ? SliceContext::kWaitNone : root,
      [&](const SliceContext::Slice& sl) {
        if (rank != root) return;
        for (int q = 0; q < n; ++q)
          if (q != root)
            std::memcpy(ctx.slot(root, sl.k) + q * piece_elems * es, input + (q * count + sl.offset) * es,
                        sl.count * es);
      },
      [&](const SliceContext::Slice& sl) {
        if (rank == root && output + sl.offset * es != input + (root * count + sl.offset) * es)
          std::memmove(output + sl.offset * es, input + (root * count + sl.offset) * es, sl.count * es);
      },
      [&](const SliceContext::Slice& sl) {
        if (rank != root) std::memcpy(output + sl.offset * es, ctx.slot(root, sl.k) + rank * piece_elems * es, sl.count * es);
      });
}

}  // namespace ringzero
