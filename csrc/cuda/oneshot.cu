// One-shot all-reduce over peer memory, for small messages (latency-bound).
//
// Per slice of the staging buffer: each rank copies its part of the input into its own staging buffer,
// barrier, then every rank reads the same part from all ranks' staging buffers in rank order and writes
// the reduced value to its output, barrier (peers are done reading before the buffer is reused).
// Latency: 2 barriers per slice (each one remote store + one poll per peer) and one pass over the data.
// Bytes moved per rank: copy-in 2S, reduce (N + 1)S  ->  (N + 3)S for a message of S bytes.
// Invariant: every rank sums the same values in the same order: bitwise-identical results everywhere.
#include "cuda/collectives.h"
#include "cuda/dispatch.cuh"

namespace ringzero::cuda {
namespace {

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(CollArgs a) {
  const RankBuffers& me = a.ranks[blockIdx.y];
  const int n = a.peers.nranks;
  const T* in = static_cast<const T*>(me.in);
  T* out = static_cast<T*>(me.out);
  // Whole packs per slice so every block part starts 16-byte aligned in staging.
  const size_t slot = a.peers.staging_bytes / sizeof(T) / Pack<T>::N * Pack<T>::N;
  for (size_t off = 0; off < a.count; off += slot) {  // the host never launches count = 0
    const size_t len = a.count - off < slot ? a.count - off : slot;
    size_t begin, end;
    block_part<T>(len, blockIdx.x, gridDim.x, &begin, &end);
    copy_block(reinterpret_cast<T*>(a.peers.staging[me.rank]) + begin, in + off + begin, end - begin);
    block_barrier(a.peers, me.rank, a.timeout_ns);
    Span<T> red{};
    for (int q = 0; q < n; ++q) red.src[q] = reinterpret_cast<const T*>(a.peers.staging[q]) + begin;
    red.nsrc = n;
    red.dst[0] = out + off + begin;
    red.ndst = 1;
    reduce_span<T, Op>(red, end - begin, a.divisor);
    block_barrier(a.peers, me.rank, a.timeout_ns);
  }
}

template <class T, class Op> struct OneShot {
  static constexpr auto kernel = one_shot_kernel<T, Op>;
};

}  // namespace

cudaError_t launch_one_shot(const CollArgs& args, int grid_y, DType dtype, ReduceOp op, cudaStream_t stream) {
  return launch_typed<OneShot>(args, grid_y, dtype, op, stream);
}

}  // namespace ringzero::cuda
