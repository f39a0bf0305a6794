// Peer-memory communicators (layer 2, host side): PeerComm is one real rank whose staging buffer and
// signal block are exported as a CUDA IPC handle and opened by the other ranks of the node; SimWorld
// is N simulated ranks in one process on one GPU (docs/design.md "Proving GPU code on one GPU"), launched
// as one grid with blockIdx.y = rank. Both run the same kernels through run_collective().
//
// Every method enqueues work on the given stream and returns (no host synchronisation, so calls can be
// captured in a CUDA graph). Setup errors and launch errors throw ringzero::CommError/InvalidArgument.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/types.h"
#include "cuda/collectives.h"
#include "cuda/peer_types.h"

namespace ringzero::cuda {

struct PeerConfig {
  size_t staging_bytes = 8u << 20;        // per rank; larger messages stream through it
  double timeout_s = 300;                 // a kernel wait longer than this gives up (see device.cuh)
  int ring_channels = 16;                 // fixed per communicator (it fixes the FIFO layout)
  int max_blocks = 32;                    // one-shot/two-shot blocks per rank
  // Auto picks one-shot up to one_shot_max_bytes, two-shot up to two_shot_max_bytes, ring above.
  // NOT MEASURED yet: starting points. The first H100 run (benchmarks/results/h100-2026-11-22/)
  // timed a one-shot/two-shot with a staging race since fixed, so its crossovers do not count; replace
  // these with the crossover that benchmarks/gpu_check.sh prints ("fastest per size") on a fixed build.
  size_t one_shot_max_bytes = 256u << 10;
  size_t two_shot_max_bytes = 16u << 20;
};

// The algorithm Auto picks for a message of `bytes` per rank.
Algo choose_algo(const PeerConfig& cfg, size_t bytes);

// What a rank's table of peers and config yield for one call: the launch of `grid_y` ranks' buffers.
// all_reduce: in/out `count` elements; reduce_scatter: in nranks * count, out count; all_gather: in
// count, out nranks * count. Throws on an invalid argument or a failed launch.
enum class Coll : int32_t { AllReduce = 0, ReduceScatter = 1, AllGather = 2 };
void run_collective(Coll coll, const PeerConfig& cfg, const PeerTable& peers, const RankBuffers* ranks,
                    int grid_y, size_t count, DType dtype, ReduceOp op, Algo algo, cudaStream_t stream);

// All-to-all(v) of `grid_y` ranks' buffers (collectives.h, launch_all_to_all): v holds each rank's
// device table of nranks send counts and its buffers' sizes in elements. Any dtype. Blocks per rank:
// cfg.max_blocks on every rank (a size-dependent choice would differ between ranks with uneven counts;
// the counts themselves stay on the device). Throws on an invalid argument or a failed launch.
void run_all_to_all(const PeerConfig& cfg, const PeerTable& peers, const RankBuffers* ranks, int grid_y,
                    const AllToAllArgs& v, DType dtype, cudaStream_t stream);

// What a RunStatus::what (a WaitKind) waited for, in words ("a barrier", "ring data", ...).
const char* wait_name(int32_t what);

// The communicator's RunStatus (peer_types.h) in mapped, pinned host memory: kernels record a wait that
// ran out there and return; the host reads it without a CUDA call ([Note: a wait that runs out]).
class TimeoutRecord {
 public:
  TimeoutRecord();
  ~TimeoutRecord();
  TimeoutRecord(const TimeoutRecord&) = delete;
  TimeoutRecord& operator=(const TimeoutRecord&) = delete;
  RunStatus* device() const { return device_; }
  // The record once a kernel of this communicator has run out of time (read it after the collective:
  // a running kernel may still be writing it), else null.
  const RunStatus* timed_out() const;
  // Throws CommTimeoutError naming the waiting rank, the rank it waited for and the one that never
  // arrived, if timed_out(). Ranks are the communicator's (0..nranks-1).
  void check(double timeout_s) const;

 private:
  RunStatus* host_ = nullptr;
  RunStatus* device_ = nullptr;
};

// One real rank.
class PeerComm {
 public:
  // Allocates and zeroes this rank's staging buffer and signal block on the current device.
  PeerComm(int rank, int nranks, const PeerConfig& cfg);
  ~PeerComm();
  PeerComm(const PeerComm&) = delete;
  PeerComm& operator=(const PeerComm&) = delete;

  // The IPC handle of this rank's allocation (sizeof(cudaIpcMemHandle_t) bytes) to share via the store.
  std::string ipc_handle() const;
  // Opens every other rank's handle (handles[q] from rank q; handles[rank] is ignored).
  void open_peers(const std::vector<std::string>& handles);

  // Throws CommTimeoutError (naming the ranks) if an earlier launch of this communicator timed out:
  // its counters no longer agree with the peers', so it never launches again.
  // Launches of one communicator must be ordered on one stream (comm/cuda.py uses one side stream):
  // staging may be reused by the next launch only because this rank's previous kernel has ended,
  // which implies every peer has finished reading it (the last barrier; the ring's credits).
  void run(Coll coll, const void* in, void* out, size_t count, DType dtype, ReduceOp op, Algo algo,
           cudaStream_t stream);
  // All-to-all(v), torch's all_to_all_single: `in` holds in_elems elements, block q of send_counts[q]
  // going to rank q; `out` (out_elems elements, not aliasing `in`) receives block rank() of every rank, in
  // rank order. send_counts: device memory, nranks() int64, read by the kernel (no host synchronisation).
  // Every rank must call it, in the same order relative to run(), as with run().
  void all_to_all(const void* in, size_t in_elems, void* out, size_t out_elems, const int64_t* send_counts,
                  DType dtype, cudaStream_t stream);
  // After the collective (stream synchronised): throws CommTimeoutError if one of its waits ran out.
  void check() const { timeouts_.check(cfg_.timeout_s); }
  const RunStatus* timed_out() const { return timeouts_.timed_out(); }
  int rank() const { return rank_; }
  int nranks() const { return table_.nranks; }
  const PeerConfig& config() const { return cfg_; }

 private:
  int rank_;
  PeerConfig cfg_;
  PeerTable table_{};
  void* base_ = nullptr;            // own allocation: Signal, then staging
  std::vector<void*> opened_;       // peers' IPC mappings, to close
  bool ready_ = false;
  TimeoutRecord timeouts_;
};

// N simulated ranks in this process, each with its own staging buffer and signal block.
class SimWorld {
 public:
  SimWorld(int nranks, const PeerConfig& cfg);
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  // ins[q], outs[q]: rank q's buffers (device pointers), shapes as run_collective.
  void run(Coll coll, const std::vector<const void*>& ins, const std::vector<void*>& outs, size_t count,
           DType dtype, ReduceOp op, Algo algo, cudaStream_t stream);
  // All-to-all(v) of every simulated rank: rank q's input ins[q] (in_elems[q] elements), output outs[q]
  // (out_elems[q]), send counts send_counts[q] (device, nranks() int64 each); as PeerComm::all_to_all.
  void all_to_all(const std::vector<const void*>& ins, const std::vector<size_t>& in_elems,
                  const std::vector<void*>& outs, const std::vector<size_t>& out_elems,
                  const std::vector<const int64_t*>& send_counts, DType dtype, cudaStream_t stream);
  void check() const { timeouts_.check(cfg_.timeout_s); }
  const RunStatus* timed_out() const { return timeouts_.timed_out(); }
  int nranks() const { return table_.nranks; }
  const PeerConfig& config() const { return cfg_; }

 private:
  PeerConfig cfg_;
  PeerTable table_{};
  std::vector<void*> bases_;
  TimeoutRecord timeouts_;  // one for all simulated ranks (they share a launch)
};

}  // namespace ringzero::cuda
