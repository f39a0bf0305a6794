// Launchers of the peer-memory collectives (layer 2). Each enqueues one kernel on `stream` and returns
// at once (no host synchronisation: capturable in a CUDA graph). `args` holds the peer table and the
// buffers of `grid_y` ranks (1 for a real rank, N for N simulated ranks in one process). Every rank
// must launch the same collective with the same count, dtype, op and nblocks.
#pragma once
#include <cuda_runtime.h>

#include "core/types.h"
#include "cuda/peer_types.h"

namespace ringzero::cuda {

// All-reduce, every rank reads every peer's staging copy in rank order: bitwise-identical results.
cudaError_t launch_one_shot(const CollArgs& args, int grid_y, DType dtype, ReduceOp op, cudaStream_t stream);
// All-reduce as reduce-scatter then all-gather through peer staging buffers.
cudaError_t launch_two_shot(const CollArgs& args, int grid_y, DType dtype, ReduceOp op, cudaStream_t stream);

enum class RingKind : int32_t { AllReduce = 0, ReduceScatter = 1, AllGather = 2 };
// Persistent ring kernels, one block per channel, slices pipelined through each peer's FIFO.
cudaError_t launch_ring(RingKind kind, const CollArgs& args, int grid_y, DType dtype, ReduceOp op,
                        cudaStream_t stream);

// All-to-all(v), torch's all_to_all_single along dim 0 (alltoall.cu): rank r's input is nranks blocks
// in rank order, block q of send_counts[q] elements going to rank q; rank r's output is, in rank order,
// block r of every rank's input. The counts live in device memory (the host need not know them) and the
// output is placed by the senders' counts (rank q's block r lands after blocks r of ranks 0..q-1), so a
// caller whose receive counts disagree gets the senders' layout, not an error. One entry per launched rank
// (index blockIdx.y, as CollArgs::ranks); the buffers are CollArgs::ranks[y].in / .out.
struct AllToAllArgs {
  const int64_t* send_counts[kMaxRanks];  // device: nranks counts in elements (negative counts as 0)
  size_t in_elems[kMaxRanks];             // elements the input holds: counts past it are cut there
  size_t out_elems[kMaxRanks];            // elements the output holds: blocks past it are cut there
};
// Any dtype (the kernel moves bytes, by element size). args.nblocks must be the same on every rank.
cudaError_t launch_all_to_all(const CollArgs& args, const AllToAllArgs& v, int grid_y, DType dtype,
                              cudaStream_t stream);
// Bytes at the head of each staging buffer that the all-to-all's count table takes (alltoall.cu).
constexpr size_t kAllToAllHeaderBytes = static_cast<size_t>(kMaxBlocks) * kMaxRanks * sizeof(int64_t);

// Ring channels that stay resident with grid_y ranks on this GPU. Every kernel here has kThreads = 512
// threads and no shared memory (the all-to-all: 256 bytes), so at least one block fits per SM (ptxas caps registers at 128):
// one channel per SM and simulated rank is always safe.
int ring_max_channels(int grid_y);

// Bytes of one ring FIFO slot when `staging_bytes` is split into nchannels x kRingSteps slots (whole
// 16-byte packs). The slice a ring step moves is one slot.
inline size_t ring_slot_bytes(size_t staging_bytes, int nchannels) {
  return staging_bytes / (static_cast<size_t>(nchannels) * kRingSteps) / 16 * 16;
}

}  // namespace ringzero::cuda
