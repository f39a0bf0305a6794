// Host-and-device types of the peer-memory collectives (layer 2): the signal block each rank exports,
// the table of peer pointers a kernel reads, and the per-launch arguments. Plain C++ (no device code),
// so layer 3 and layer 4 can include it without nvcc.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace ringzero::cuda {

// NVLink islands and the DGX/HGX boards have at most 8 GPUs; one-shot reads all of them per element.
constexpr int kMaxRanks = 8;
// Blocks per rank whose barrier flags exist. 64 x 8 ranks = 512 co-resident blocks of 512 threads,
// about what an H100 (132 SMs x 4 such blocks) holds at once.
constexpr int kMaxBlocks = 64;
// Ring channels (one block each) and FIFO depth per channel. NCCL's Simple protocol uses 8 steps of
// a 4 MiB buffer; 4 steps keep the staging buffer small and still let a sender run ahead of a reducer.
constexpr int kMaxChannels = 32;
constexpr int kRingSteps = 4;
// Threads per block of every collective kernel (a multiple of the warp size, at least kMaxRanks).
constexpr int kThreads = 512;

enum class Algo : int32_t { Auto = 0, OneShot = 1, TwoShot = 2, Ring = 3 };

// One per rank, in that rank's device memory, exported with its staging buffer in one IPC allocation.
// Every counter only grows (64 bits never wrap), so no kernel ever resets a flag and a captured CUDA
// graph replays without host updates: each launch reads where the previous one left off.
struct alignas(128) Signal {
  // arrive[b][q]: how many barriers block b of rank q has entered; written by rank q (remote store).
  uint64_t arrive[kMaxBlocks][kMaxRanks];
  // epoch[b]: barriers block b of this rank has passed; private to this rank.
  uint64_t epoch[kMaxBlocks];
  // Ring FIFO per channel: ready[c] = slices the left neighbour has put into our FIFO; freed[c] =
  // slices our right neighbour has consumed from its FIFO (so we may overwrite); steps[c] = slices
  // sent (= received) by this rank so far, private.
  uint64_t ready[kMaxChannels];
  uint64_t freed[kMaxChannels];
  uint64_t steps[kMaxChannels];
  // 1 + the rank a kernel of this rank timed out waiting for; 0 while it never did. Written once
  // (system scope) by the timed-out kernel and read by peers that time out on this rank, so that a
  // chain of waits (ring: d+2 waits for d+1, which waits for the dead d) names d, not d+1.
  uint64_t stuck_on;
  // Nonzero once a wait of the communicator that owns this block ran out (device word, claimed by
  // atomicCAS: the first wait to run out records RunStatus). SimWorld uses rank 0's for all its ranks.
  uint32_t timeout_claim;
};

// What a spinning wait was waiting for (RunStatus::what).
enum class WaitKind : int32_t { Barrier = 1, RingData = 2, RingCredit = 3 };

// The outcome of the launches of one communicator, in host-pinned memory mapped into the device
// (cudaHostAllocMapped): a kernel whose wait runs out records here who waited for what and returns
// early instead of trapping (a trap would poison the CUDA context); the host reads it after the
// collective (no copy, no synchronisation needed to read it) and raises CommTimeout. Once code != 0
// every later wait of the same communicator gives up at once, and the host refuses further launches:
// the counters of the ranks no longer agree.
struct RunStatus {
  uint32_t code;     // 0 ok; kTimedOut, written after the fields below by the wait that won the claim
  int32_t rank;      // the rank whose wait ran out
  int32_t peer;      // the rank it waited for
  int32_t culprit;   // the first rank along peer's own stuck_on chain that was not itself stuck
  int32_t block;     // blockIdx.x of the waiting block
  int32_t what;      // WaitKind
  uint64_t flag;     // the flag's value when the wait gave up
  uint64_t target;   // the value it waited for
};
constexpr uint32_t kTimedOut = 1;

// What one kernel launch knows about the ranks: rank q's staging buffer and signal block as mapped in
// this process (IPC mappings for real peers; plain allocations for simulated ranks).
struct PeerTable {
  char* staging[kMaxRanks];
  Signal* signal[kMaxRanks];
  int nranks;
  size_t staging_bytes;
  RunStatus* status;   // device view of the communicator's mapped RunStatus (never null in a launch)
  uint32_t* claim;     // the communicator's Signal::timeout_claim (device memory)
};

// The caller's buffers of one rank. One real rank per launch has grid.y = 1; simulated ranks launch
// every rank in one grid with blockIdx.y = index into CollArgs::ranks.
struct RankBuffers {
  const void* in;
  void* out;
  int rank;
};

struct CollArgs {
  PeerTable peers;
  RankBuffers ranks[kMaxRanks];
  size_t count;             // all-reduce: elements; reduce-scatter/all-gather: elements per rank block
  int divisor;              // > 1: divide the final value (Avg)
  int nblocks;              // blocks per rank (grid.x); ring: channels
  int32_t variant;          // ring: which collective (RingKind)
  uint64_t timeout_ns;      // a spinning wait longer than this records a timeout in *status and returns
};

}  // namespace ringzero::cuda
