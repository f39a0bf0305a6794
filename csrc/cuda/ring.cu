// Ring all-reduce, reduce-scatter and all-gather over peer memory: persistent kernels, one block per
// channel, that pipeline slices around the ring the way NCCL's Simple protocol does.
//
// Each rank's staging buffer holds, per channel, a FIFO of kRingSteps slots that its LEFT neighbour
// fills. A step writes one slice into the right neighbour's slot, then releases `ready` (system scope)
// in the right neighbour's signal block; the receiver acquires `ready`, consumes the slot (reducing it
// with its own data and usually writing the result straight into the next rank's FIFO), then releases
// `freed` back to the sender. Counters only grow, across launches, so graph replays need no reset.
//
// All-reduce on N ranks, per chunk k of N (chunk k ends reduced on rank k), as in NCCL:
//   send(r-1), recvReduceSend(r-j) for j = 2..N-1, recvReduceCopySend(r), recvCopySend(r-j) for
//   j = 1..N-2, recv(r+1).
// Bytes moved per rank (S = message): about 6S (each step reads 1-2 and writes 1-2 slices of S/N).
// Invariant: chunk k is reduced once (on rank k) and copied to all: bitwise-identical results.
//
// Synchronisation (channel c; counters in Signal, all only grow, across launches):
//   - slot i of rank r's FIFO c is staging[r] + (c kRingSteps + i % kRingSteps) x slot; only the left
//     neighbour writes it (its send number i), only rank r reads it (its receive number i);
//   - ready[c] of rank r (written by the left neighbour, st.release.sys after the block's __syncthreads):
//     slots < ready are full. Rank r's thread 0 acquires it (ld.acquire.sys) before __syncthreads lets
//     the block read slot `recvd`;
//   - freed[c] of the sender (written by rank r after its block finished reading slot i, release):
//     the sender may overwrite slot i only once freed >= i + 1, i.e. send number `sent` waits for
//     freed >= sent + 1 - kRingSteps. So a slot is never rewritten while its reader may still read it,
//     whatever the slice length: the partition of a step among threads does not matter here, since
//     the whole block waits (unlike oneshot/twoshot, whose barriers are per block index);
//   - sends == receives per channel in every launch (2N-2 for all-reduce, N-1 otherwise), so steps[c]
//     (private, written by thread 0 at the end, read at the next launch) is both counters' base;
//   - the credit test uses the absolute counters, so the first sends of a launch wait for the receives
//     of the previous launch's last slices (a rank's kernel may end before its right neighbour has
//     read them): credits carry over, nothing is reset.
#include "cuda/collectives.h"
#include "cuda/dispatch.cuh"

namespace ringzero::cuda {
namespace {

template <class T, class Op>
struct RingChannel {
  const PeerTable* peers;
  bool failed;  // a wait ran out: every later step returns at once (block-uniform)
  int rank, right, left, c;
  T* my_fifo;
  T* right_fifo;
  size_t slot_elems;
  uint64_t sent, recvd;
  uint64_t timeout_ns;

  // The ring's primitives, named as NCCL's: a name lists its step's parts in order. recv: take the slot
  // the left neighbour filled; Reduce: combine it with `src` (this rank's input; without recv, `src` is
  // the data); Copy: write `dst` (this rank's output); Send: write the right neighbour's slot. Each is
  // one step(); `divisor` applies Avg on the step that completes a chunk.
  __device__ __forceinline__ void send(const T* src, size_t len) { step(false, src, nullptr, true, len, 1); }
  __device__ __forceinline__ void copySend(const T* src, T* dst, size_t len) {
    step(false, src, dst, true, len, 1);
  }
  __device__ __forceinline__ void recvReduceSend(const T* src, size_t len) { step(true, src, nullptr, true, len, 1); }
  __device__ __forceinline__ void recvReduceCopySend(const T* src, T* dst, size_t len, int divisor) {
    step(true, src, dst, true, len, divisor);
  }
  __device__ __forceinline__ void recvReduceCopy(const T* src, T* dst, size_t len, int divisor) {
    step(true, src, dst, false, len, divisor);
  }
  __device__ __forceinline__ void recvCopySend(T* dst, size_t len) { step(true, nullptr, dst, true, len, 1); }
  __device__ __forceinline__ void recv(T* dst, size_t len) { step(true, nullptr, dst, false, len, 1); }

  // One ring step over `len` elements: sources are the received slot (if recv) then `local` (if not
  // null), combined with Op; destinations are `out` (if not null) and the right neighbour's slot (if
  // send). The primitives above are its only callers (its flags shadow their names in here).
  __device__ void step(bool recv, const T* local, T* out, bool send, size_t len, int divisor) {
    if (failed) return;
    Signal* self = peers->signal[rank];
    bool ok = true;
    if (threadIdx.x == 0) {
      const Waiter w{peers, peers->status, peers->claim, timeout_ns, rank};  // made here: fewer live registers
      if (recv) ok = w.until(&self->ready[c], recvd + 1, WaitKind::RingData, left);
      if (ok && send && sent + 1 > kRingSteps)
        ok = w.until(&self->freed[c], sent + 1 - kRingSteps, WaitKind::RingCredit, right);
    }
    // thread 0's acquire covers the whole block's reads below; a wait that ran out ends the channel
    failed = __syncthreads_or(!ok);
    if (failed) return;
    Span<T, 2> s{};  // at most 2 sources: its pointers stay in registers (see Span)
    if (recv) s.src[s.nsrc++] = my_fifo + (recvd % kRingSteps) * slot_elems;
    if (local) s.src[s.nsrc++] = local;
    if (out) s.dst[s.ndst++] = out;
    if (send) s.dst[s.ndst++] = right_fifo + (sent % kRingSteps) * slot_elems;
    reduce_span<T, Op>(s, len, divisor);
    __syncthreads();  // the block's writes and reads are done before the flags below
    if (send) ++sent;
    if (recv) ++recvd;
    if (threadIdx.x == 0) {
      if (send) store_release_sys(&peers->signal[right]->ready[c], sent);
      if (recv) store_release_sys(&peers->signal[left]->freed[c], recvd);
    }
  }
};

struct Piece {
  size_t off, len;
};

// Min 1 block per SM: a channel is one persistent block and SimWorld keeps channels x ranks <= SMs, so
// occupancy above 1 buys nothing, and the bound lets ptxas give each thread up to 128 registers
// (65536 / kThreads) rather than fewer for an occupancy nobody uses: the step needs them to run without
// spills (tools/cuda_static_check.py holds it to none; the counts are in benchmarks/RESULTS.md,
// "CUDA kernels, static").
template <class T, class Op>
__global__ void __launch_bounds__(kThreads, 1) ring_kernel(CollArgs a) {
  const RankBuffers& me = a.ranks[blockIdx.y];
  const int n = a.peers.nranks, r = me.rank, c = blockIdx.x, nch = gridDim.x;
  const RingKind kind = static_cast<RingKind>(a.variant);
  constexpr size_t N = Pack<T>::N;
  const size_t slot_bytes = a.peers.staging_bytes / (static_cast<size_t>(nch) * kRingSteps) / 16 * 16;
  RingChannel<T, Op> ch;
  ch.peers = &a.peers;
  ch.failed = false;
  ch.rank = r;
  ch.right = (r + 1) % n;
  ch.left = (r + n - 1) % n;
  ch.c = c;
  ch.slot_elems = slot_bytes / sizeof(T);
  ch.my_fifo = reinterpret_cast<T*>(a.peers.staging[r] + static_cast<size_t>(c) * kRingSteps * slot_bytes);
  ch.right_fifo = reinterpret_cast<T*>(a.peers.staging[ch.right] + static_cast<size_t>(c) * kRingSteps * slot_bytes);
  ch.sent = ch.recvd = a.peers.signal[r]->steps[c];
  ch.timeout_ns = a.timeout_ns;
  const T* in = static_cast<const T*>(me.in);
  T* out = static_cast<T*>(me.out);
  auto mod = [n](int k) { return ((k % n) + n) % n; };

  if (kind == RingKind::AllReduce) {
    // Iterations of N chunks x nch channels x one slot; the last one is balanced over chunks.
    const size_t iter = static_cast<size_t>(n) * nch * ch.slot_elems;
    for (size_t base = 0; base < a.count; base += iter) {
      const size_t rem = a.count - base < iter ? a.count - base : iter;
      const size_t chunk = (rem + n * N * nch - 1) / (n * N * nch) * (N * nch);
      const size_t per = chunk / nch;
      auto piece = [&](int k) {
        const size_t lo = base + k * chunk + c * per, end = base + rem;
        return Piece{lo, lo >= end ? 0 : (lo + per < end ? per : end - lo)};
      };
      Piece p = piece(mod(r - 1));
      ch.send(in + p.off, p.len);
      for (int j = 2; j < n; ++j) {
        p = piece(mod(r - j));
        ch.recvReduceSend(in + p.off, p.len);
      }
      p = piece(r);
      ch.recvReduceCopySend(in + p.off, out + p.off, p.len, a.divisor);
      for (int j = 1; j < n - 1; ++j) {
        p = piece(mod(r - j));
        ch.recvCopySend(out + p.off, p.len);
      }
      p = piece(mod(r + 1));
      ch.recv(out + p.off, p.len);
    }
  } else {
    // Reduce-scatter (in: N blocks of count, out: block r) and all-gather (in: count, out: N blocks):
    // the same walk over the blocks, a slot per channel at a time.
    const size_t C = a.count, iter = static_cast<size_t>(nch) * ch.slot_elems;
    for (size_t w = 0; w < C; w += iter) {
      const size_t rem = C - w < iter ? C - w : iter;
      const size_t per = (rem + nch * N - 1) / (nch * N) * N;
      const size_t lo = w + c * per, end = w + rem;
      const size_t len = lo >= end ? 0 : (lo + per < end ? per : end - lo);
      if (kind == RingKind::ReduceScatter) {
        ch.send(in + mod(r - 1) * C + lo, len);
        for (int j = 2; j < n; ++j)
          ch.recvReduceSend(in + mod(r - j) * C + lo, len);
        ch.recvReduceCopy(in + r * C + lo, out + lo, len, a.divisor);
      } else {
        ch.copySend(in + lo, out + r * C + lo, len);
        for (int j = 1; j < n - 1; ++j)
          ch.recvCopySend(out + mod(r - j) * C + lo, len);
        ch.recv(out + mod(r + 1) * C + lo, len);
      }
    }
  }
  if (threadIdx.x == 0 && !ch.failed) a.peers.signal[r]->steps[c] = ch.sent;
}

template <class T, class Op> struct Ring {
  static constexpr auto kernel = ring_kernel<T, Op>;
};

}  // namespace

int ring_max_channels(int grid_y) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  const int per_rank = sms / (grid_y > 0 ? grid_y : 1);
  return per_rank < kMaxChannels ? per_rank : kMaxChannels;
}

cudaError_t launch_ring(RingKind kind, const CollArgs& args, int grid_y, DType dtype, ReduceOp op,
                        cudaStream_t stream) {
  CollArgs a = args;
  a.variant = static_cast<int32_t>(kind);
  // The channel count fixes the FIFO layout in every peer's staging buffer, so it must be the same for
  // every ring launch of a communicator: refuse rather than shrink it.
  if (a.nblocks < 1 || a.nblocks > kMaxChannels) return cudaErrorInvalidValue;
  return launch_typed<Ring>(a, grid_y, dtype, op, stream, false);
}

}  // namespace ringzero::cuda
