// One-shot all-reduce over peer memory, for small messages (latency-bound).
//
// Per slice of the staging buffer: each rank copies its part of the input into its own staging buffer,
// barrier, then every rank reads the same part from all ranks' staging buffers in rank order and writes
// the reduced value to its output, barrier (peers are done reading before the buffer is reused).
// Latency: 2 barriers per slice (each one remote store + one poll per peer) and one pass over the data.
// Bytes moved per rank: copy-in 2S, reduce (N + 1)S  ->  (N + 3)S for a message of S bytes.
// Invariant: every rank sums the same values in the same order: bitwise-identical results everywhere.
//
// Synchronisation (see block_barrier in device.cuh):
//   - staging[r][lo, hi) of slice s is written by block b of rank r only, where [lo, hi) is block b's
//     part, THE SAME in every slice of the launch (see [Note: fixed slice partition] below);
//   - barrier 1 of block b (release by every rank after its copy-in, acquire before reading) guards the
//     reads of staging[q][lo, hi) for every q;
//   - barrier 2 of block b says every rank's block b has finished reading staging[*][lo, hi), so block b
//     of rank r may overwrite staging[r][lo, hi) for slice s + 1 (or the next launch: a rank's kernel
//     ends only after all its blocks passed barrier 2, i.e. after every peer's every block has read);
//   - orders and scopes: st.release.sys / ld.acquire.sys on 64-bit counters that only grow; data moves
//     with .cg loads (L2, never a stale L1 line) and plain stores made visible by the release.
// [Note: fixed slice partition] the partition of a slice among blocks must not depend on the slice's
// length. Barrier 2 of block b releases block b of the peers only, so block b may next write only what
// block b alone touched: were a shorter last slice split by its own length, block b's part of it would
// cover elements another block of a slower peer is still reading from the previous slice. So every
// slice has the same length `slice` (the last one at most that) and each block keeps its part of
// `slice`. tests/cpp/test_cuda_schedule.cpp checks the rule on the kernels' own slice arithmetic and
// shows the overwrite a per-slice split makes.
#include "cuda/collectives.h"
#include "cuda/dispatch.cuh"

namespace ringzero::cuda {
namespace {

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(CollArgs a) {
  const RankBuffers& me = a.ranks[blockIdx.y];
  const Waiter w = waiter_of(a, me.rank);
  const int n = a.peers.nranks;
  const T* in = static_cast<const T*>(me.in);
  T* out = static_cast<T*>(me.out);
  T* mine = reinterpret_cast<T*>(a.peers.staging[me.rank]);
  // Whole packs per slice so every block part starts 16-byte aligned in staging.
  const size_t slot = a.peers.staging_bytes / sizeof(T) / Pack<T>::N * Pack<T>::N;
  const size_t slice = even_slice(a.count, slot, Pack<T>::N);  // the host never launches count = 0
  size_t begin, end;  // this block's part of every slice (fixed: see the Note above)
  block_part<T>(slice, blockIdx.x, gridDim.x, &begin, &end);
  for (size_t off = 0; off < a.count; off += slice) {
    const size_t len = a.count - off < slice ? a.count - off : slice;
    const size_t lo = begin < len ? begin : len, hi = end < len ? end : len;
    copy_block(mine + lo, in + off + lo, hi - lo);
    if (!block_barrier(w)) return;
    Span<T> red{};
    for (int q = 0; q < n; ++q) red.src[q] = reinterpret_cast<const T*>(a.peers.staging[q]) + lo;
    red.nsrc = n;
    red.dst[0] = out + off + lo;
    red.ndst = 1;
    reduce_span<T, Op>(red, hi - lo, a.divisor);
    if (!block_barrier(w)) return;
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
