// Two-shot all-reduce over peer memory, for medium messages: a reduce-scatter and an all-gather, both
// through the ranks' staging buffers.
//
// Per slice: (0) each rank copies its input into its own staging buffer; barrier; (1) rank r reduces
// chunk r from every rank's staging (rank order) into its own staging chunk r; barrier; (2) every rank
// copies chunk q from rank q's staging into its output, for all q; barrier.
// Block b owns sub-range b of every chunk in all three phases, so per-block barriers suffice.
// Bytes moved per rank: copy-in 2S, reduce S + S/N, gather 2S  ->  (5 + 1/N)S. Latency: 3 barriers.
// Invariant: chunk r is reduced once, by rank r, and copied to all: bitwise-identical results.
//
// Synchronisation (block b, its sub-range [b0, b1) of each chunk, chunk k = [k C, (k+1) C) of the
// slice; C and [b0, b1) are fixed for the whole launch, [Note: fixed slice partition] in oneshot.cu):
//   - phase 0 writes staging[r][k C + b0, k C + b1) for every k; barrier 1 guards phase 1's reads of
//     staging[q][r C + b0, r C + b1);
//   - phase 1 writes staging[r][r C + b0, r C + b1) in place (nobody else reads chunk r of rank r in
//     phase 1: rank q reads chunk q); barrier 2 guards phase 2's reads of staging[k][k C + b0, ...);
//   - barrier 3: every rank's block b finished phase 2, so block b may overwrite staging[r] in phase 0
//     of the next slice or launch. This holds only because C does not follow each slice's length: a
//     shorter last slice would move every chunk boundary, and block b would overwrite what other
//     blocks of a slower peer are still copying in phase 2 (tests/cpp/test_cuda_schedule.cpp).
//   - orders and scopes as in oneshot.cu (system-scope release/acquire counters, .cg loads).
#include "cuda/collectives.h"
#include "cuda/dispatch.cuh"

namespace ringzero::cuda {
namespace {

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(CollArgs a) {
  const RankBuffers& me = a.ranks[blockIdx.y];
  const Waiter w = waiter_of(a, me.rank);
  const int n = a.peers.nranks;
  const T* in = static_cast<const T*>(me.in);
  T* out = static_cast<T*>(me.out);
  constexpr size_t N = Pack<T>::N;
  // A multiple of n packs, so that n chunks of whole packs always fit in the slot.
  const size_t slot = a.peers.staging_bytes / sizeof(T) / (n * N) * (n * N);
  const size_t slice = even_slice(a.count, slot, n * N);  // the host never launches count = 0
  const size_t chunk = slice / n;                          // whole packs
  size_t b0, b1;  // this block's sub-range of every chunk of every slice
  block_part<T>(chunk, blockIdx.x, gridDim.x, &b0, &b1);
  T* mine = reinterpret_cast<T*>(a.peers.staging[me.rank]);
  for (size_t off = 0; off < a.count; off += slice) {
    const size_t len = a.count - off < slice ? a.count - off : slice;
    auto chunk_len = [&](int k) -> size_t {  // elements of chunk k's sub-range that exist
      const size_t lo = k * chunk + b0, hi = k * chunk + b1;
      return lo >= len ? 0 : (hi < len ? hi : len) - lo;
    };
    for (int k = 0; k < n; ++k) copy_block(mine + k * chunk + b0, in + off + k * chunk + b0, chunk_len(k));
    if (!block_barrier(w)) return;
    Span<T> red{};
    for (int q = 0; q < n; ++q) red.src[q] = reinterpret_cast<const T*>(a.peers.staging[q]) + me.rank * chunk + b0;
    red.nsrc = n;
    red.dst[0] = mine + me.rank * chunk + b0;
    red.ndst = 1;
    reduce_span<T, Op>(red, chunk_len(me.rank), a.divisor);
    if (!block_barrier(w)) return;
    for (int k = 0; k < n; ++k)
      copy_block(out + off + k * chunk + b0, reinterpret_cast<const T*>(a.peers.staging[k]) + k * chunk + b0,
                 chunk_len(k));
    if (!block_barrier(w)) return;
  }
}

template <class T, class Op> struct TwoShot {
  static constexpr auto kernel = two_shot_kernel<T, Op>;
};

}  // namespace

cudaError_t launch_two_shot(const CollArgs& args, int grid_y, DType dtype, ReduceOp op, cudaStream_t stream) {
  return launch_typed<TwoShot>(args, grid_y, dtype, op, stream);
}

}  // namespace ringzero::cuda
