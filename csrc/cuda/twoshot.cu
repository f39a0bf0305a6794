// Two-shot all-reduce over peer memory, for medium messages: a reduce-scatter and an all-gather, both
// through the ranks' staging buffers.
//
// Per slice: (0) each rank copies its input into its own staging buffer; barrier; (1) rank r reduces
// chunk r from every rank's staging (rank order) into its own staging chunk r; barrier; (2) every rank
// copies chunk q from rank q's staging into its output, for all q; barrier.
// Block b owns sub-range b of every chunk in all three phases, so per-block barriers suffice.
// Bytes moved per rank: copy-in 2S, reduce S + S/N, gather 2S  ->  (5 + 1/N)S. Latency: 3 barriers.
// Invariant: chunk r is reduced once, by rank r, and copied to all: bitwise-identical results.
#include "cuda/collectives.h"
#include "cuda/dispatch.cuh"

namespace ringzero::cuda {
namespace {

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(CollArgs a) {
  const RankBuffers& me = a.ranks[blockIdx.y];
  const int n = a.peers.nranks;
  const T* in = static_cast<const T*>(me.in);
  T* out = static_cast<T*>(me.out);
  constexpr size_t N = Pack<T>::N;
  // A multiple of n packs, so that n chunks of ceil(len / n) packs always fit in the slot.
  const size_t slot = a.peers.staging_bytes / sizeof(T) / (n * N) * (n * N);
  T* mine = reinterpret_cast<T*>(a.peers.staging[me.rank]);
  for (size_t off = 0; off < a.count; off += slot) {  // the host never launches count = 0
    const size_t len = a.count - off < slot ? a.count - off : slot;
    const size_t chunk = (len + n * N - 1) / (n * N) * N;
    size_t b0, b1;  // this block's sub-range of a chunk
    block_part<T>(chunk, blockIdx.x, gridDim.x, &b0, &b1);
    auto chunk_len = [&](int k) -> size_t {  // elements of chunk k's sub-range that exist
      const size_t lo = k * chunk + b0, hi = k * chunk + b1;
      return lo >= len ? 0 : (hi < len ? hi : len) - lo;
    };
    for (int k = 0; k < n; ++k) copy_block(mine + k * chunk + b0, in + off + k * chunk + b0, chunk_len(k));
    block_barrier(a.peers, me.rank, a.timeout_ns);
    Span<T> red{};
    for (int q = 0; q < n; ++q) red.src[q] = reinterpret_cast<const T*>(a.peers.staging[q]) + me.rank * chunk + b0;
    red.nsrc = n;
    red.dst[0] = mine + me.rank * chunk + b0;
    red.ndst = 1;
    reduce_span<T, Op>(red, chunk_len(me.rank), a.divisor);
    block_barrier(a.peers, me.rank, a.timeout_ns);
    for (int k = 0; k < n; ++k)
      copy_block(out + off + k * chunk + b0, reinterpret_cast<const T*>(a.peers.staging[k]) + k * chunk + b0,
                 chunk_len(k));
    block_barrier(a.peers, me.rank, a.timeout_ns);
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
