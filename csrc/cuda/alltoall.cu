// All-to-all(v) over peer memory (torch's all_to_all_single along dim 0): a reader's collective, like
// all-gather. One kernel per call; the send counts stay in device memory, the host never reads them.
//
// Per slice of the staging buffer: each rank copies its part of its input (input elements
// [s slot, (s+1) slot)) into its own staging buffer, barrier, then every rank reads from every rank's
// staging the piece of that rank's block for it that lies in the slice and writes it to its output,
// barrier (peers are done reading before the slot is reused). The first slice also carries the count
// table: each rank writes its send counts at the head of its staging buffer before the first barrier, so
// that after it every rank holds the same n x n matrix and derives from it alone where each block lies,
// where it lands (block r of rank q after block r of ranks 0..q-1) and how many slices there are (the
// largest input of any rank over the slot, at least one): every rank runs the same number of barriers.
// Latency: 2 barriers per slice (each one remote store + one poll per peer), ceil(max_q S_q / slot)
// slices; an exchange of small blocks costs 2 barriers, as a one-shot does.
// Bytes moved per rank (S_in sent, S_out received): copy-in 2 S_in, read and write 2 S_out
//   ->  2 (S_in + S_out), 4S for even splits (registered inputs would save the copy-in, 2 S_in).
// 16-byte copies wherever a piece's source and destination share their address mod 16 (always when the
// counts are multiples of 16 bytes and the buffers 16-byte aligned), scalar loads and stores otherwise.
// Invariant: a rank's output is written by that rank only, each element once, and depends only on the
// count matrix and the inputs; input and output never alias (the launcher's caller's contract).
//
// Layout of rank r's staging buffer: [count table | data]. The count table is kAllToAllHeaderBytes:
// row b (kMaxRanks int64) is block b's copy of rank r's send counts, as cut below. The data region holds
// `slot` elements (whole packs), cut into chunks of `chunk` elements; block b owns chunks b, b + nb,
// b + 2 nb, ... of every slice (nb = blocks per rank).
// Synchronisation (block_barrier in device.cuh; per block index b):
//   - chunk j of slice s in staging[r] is written by block b = j mod nb of rank r only; `chunk` and nb
//     depend on neither the slice nor the counts, so block b owns the same elements in every slice
//     ([Note: fixed slice partition] in oneshot.cu) and its barriers guard exactly what it touches;
//   - row b of rank r's count table is written by block b before barrier 1 of slice 0 and read by
//     block b of every rank after it, once; it is rewritten only by the next launch, which starts
//     after this rank's last barrier, i.e. after every peer's block b read it;
//   - barrier 1 of slice s (release after the copy-in, acquire before the reads) guards the reads of
//     block b's chunks of every staging[q] (and of row b of every count table in slice 0);
//   - barrier 2 of slice s: every rank's block b has finished reading its chunks of every staging[q],
//     so block b may overwrite them in slice s + 1; after the last slice, as in oneshot.cu, a rank's
//     kernel ends only after all its blocks passed barrier 2, so the next launch (of any collective)
//     may overwrite any of its staging;
//   - orders and scopes as in oneshot.cu: st.release.sys / ld.acquire.sys on 64-bit counters that
//     only grow; data and counts move with .cg loads (L2, never a stale L1 line) and plain stores made
//     visible by the barrier's release.
// Counts are the caller's contract; the kernel only keeps to the buffers: a negative count is 0, a
// rank's counts are cut where its input (in_elems) ends, a block is cut where the receiver's output
// (out_elems) ends. Nothing reports the cut (no error channel without the host reading the counts).
#include "cuda/collectives.h"
#include "cuda/dispatch.cuh"

namespace ringzero::cuda {
namespace {

static_assert(kAllToAllHeaderBytes % kPackBytes == 0, "the data region must start 16-byte aligned");

// The most a chunk holds: one pass of kThreads threads x one 16-byte pack. Smaller chunks spread a
// small message over more blocks; larger ones cut the per-chunk index arithmetic. Not measured.
constexpr size_t kChunkBytes = static_cast<size_t>(kThreads) * kPackBytes;

// dst[0, len) = src[0, len), block-wide: 16-byte packs wherever dst and src have the same address mod 16
// (a scalar head up to the boundary, a scalar tail), else element by element. Not copy_block (device.cuh):
// it goes all vector or all scalar, and a block of an all-to-all starts at any element, so after the
// first block with an odd count every piece would take its scalar loop.
template <class T> __device__ void copy_elems(T* dst, const T* src, size_t len) {
  constexpr size_t N = Pack<T>::N;
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  size_t head = len, vec = 0;
  if ((d - s) % kPackBytes == 0) {
    head = (kPackBytes - d % kPackBytes) % kPackBytes / sizeof(T);
    if (head > len) head = len;
    vec = (len - head) / N * N;
  }
  for (size_t e = threadIdx.x; e < head; e += blockDim.x) dst[e] = load_cg(src + e);
  for (size_t p = head + static_cast<size_t>(threadIdx.x) * N; p < head + vec; p += static_cast<size_t>(blockDim.x) * N)
    store_pack(dst + p, load_pack(src + p));
  for (size_t e = head + vec + threadIdx.x; e < len; e += blockDim.x) dst[e] = load_cg(src + e);
}

// T is an unsigned integer of the element's size: the kernel only moves bytes.
template <class T>
__global__ void __launch_bounds__(kThreads) all_to_all_kernel(CollArgs a, AllToAllArgs v) {
  const int y = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
  const RankBuffers& me = a.ranks[y];
  const int n = a.peers.nranks, r = me.rank;
  const Waiter w = waiter_of(a, r);
  const T* in = static_cast<const T*>(me.in);
  T* out = static_cast<T*>(me.out);
  constexpr size_t N = Pack<T>::N;
  const size_t slot = (a.peers.staging_bytes - kAllToAllHeaderBytes) / sizeof(T) / N * N;
  size_t chunk = slot / nb / N * N;  // whole packs: every chunk starts 16-byte aligned in staging
  if (chunk > kChunkBytes / sizeof(T)) chunk = kChunkBytes / sizeof(T);
  if (chunk < N) chunk = N;
  auto data_of = [&](int q) { return reinterpret_cast<T*>(a.peers.staging[q] + kAllToAllHeaderBytes); };
  auto counts_of = [&](int q) { return reinterpret_cast<int64_t*>(a.peers.staging[q]) + b * kMaxRanks; };

  // This rank's send counts as every rank will read them (negatives as 0, cut where the input ends).
  size_t in_total = 0;
  for (int p = 0; p < n; ++p) {
    const int64_t c = v.send_counts[y][p];
    size_t cut = c > 0 ? static_cast<size_t>(c) : 0;
    if (cut > v.in_elems[y] - in_total) cut = v.in_elems[y] - in_total;
    if (static_cast<int>(threadIdx.x) == p) counts_of(r)[p] = static_cast<int64_t>(cut);
    in_total += cut;
  }

  // Peer i of the read order is rank (r + i) % n (each rank starts with itself, then its right
  // neighbour: the ranks' first reads go to different buffers). Filled after the first barrier.
  __shared__ size_t src_at[kMaxRanks];   // where that rank's block for r starts in its input
  __shared__ size_t len_of[kMaxRanks];   // its length, cut where r's output ends
  __shared__ size_t dst_at[kMaxRanks];   // where it lands in r's output
  __shared__ size_t total_of[kMaxRanks]; // that rank's whole input (for the slice count)
  size_t longest = 0;
  T* mine = data_of(r);
  for (size_t off = 0;; off += slot) {
    const size_t len = in_total > off ? (in_total - off < slot ? in_total - off : slot) : 0;
    for (size_t j = b * chunk; j < len; j += nb * chunk) copy_elems(mine + j, in + off + j, len - j < chunk ? len - j : chunk);
    if (!block_barrier(w)) return;
    if (off == 0) {  // the count table is in: every rank derives the same layout from it
      if (static_cast<int>(threadIdx.x) < n) {
        const int i = threadIdx.x, q = (r + i) % n;
        const int64_t* row = counts_of(q);
        size_t before = 0, total = 0, at = 0;
        for (int p = 0; p < n; ++p) {
          const size_t c = static_cast<size_t>(load_cg(row + p));
          if (p < r) before += c;
          total += c;
        }
        for (int p = 0; p < q; ++p) at += static_cast<size_t>(load_cg(counts_of(p) + r));
        size_t got = static_cast<size_t>(load_cg(row + r));
        const size_t room = v.out_elems[y];
        got = at >= room ? 0 : (got < room - at ? got : room - at);
        src_at[i] = before;
        len_of[i] = got;
        dst_at[i] = at;
        total_of[i] = total;
      }
      __syncthreads();
      for (int i = 0; i < n; ++i) longest = total_of[i] > longest ? total_of[i] : longest;
    }
    for (int i = 0; i < n; ++i) {
      // The piece of rank q's block for r that lies in this slice, in slice coordinates [lo, hi).
      const size_t from = src_at[i] > off ? src_at[i] : off;
      const size_t to = src_at[i] + len_of[i] < off + slot ? src_at[i] + len_of[i] : off + slot;
      if (from >= to) continue;
      const size_t lo = from - off, hi = to - off;
      const T* theirs = data_of((r + i) % n);
      T* dst = out + dst_at[i];  // slice element x is element off + x - src_at[i] of the block
      size_t k = lo / chunk;     // this block's first chunk that ends past lo
      k += (static_cast<size_t>(b) + nb - k % nb) % nb;
      for (size_t j = k * chunk; j < hi; j += nb * chunk) {
        const size_t s = j > lo ? j : lo, e = j + chunk < hi ? j + chunk : hi;
        copy_elems(dst + (off + s - src_at[i]), theirs + s, e - s);
      }
    }
    if (!block_barrier(w)) return;
    if (off + slot >= longest) break;
  }
}

// launch_resident (dispatch.cuh) for a kernel that also takes the AllToAllArgs: the same clamp to the
// blocks that stay resident (every rank's blocks spin on each other), the same on every rank.
template <class T>
cudaError_t launch_sized(CollArgs args, const AllToAllArgs& v, int grid_y, cudaStream_t stream) {
  static const int resident = resident_blocks(all_to_all_kernel<T>);
  int limit = resident / grid_y;
  if (limit > kMaxBlocks) limit = kMaxBlocks;
  if (limit < 1) return cudaErrorCooperativeLaunchTooLarge;
  if (args.nblocks > limit) args.nblocks = limit;
  if (args.nblocks < 1) args.nblocks = 1;
  return launch_kernel<all_to_all_kernel<T>>(dim3(args.nblocks, grid_y), dim3(kThreads), stream, args, v);
}

}  // namespace

cudaError_t launch_all_to_all(const CollArgs& args, const AllToAllArgs& v, int grid_y, DType dtype,
                              cudaStream_t stream) {
  switch (dtype_size(dtype)) {
    case 1: return launch_sized<uint8_t>(args, v, grid_y, stream);
    case 2: return launch_sized<uint16_t>(args, v, grid_y, stream);
    case 4: return launch_sized<uint32_t>(args, v, grid_y, stream);
    case 8: return launch_sized<uint64_t>(args, v, grid_y, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ringzero::cuda
