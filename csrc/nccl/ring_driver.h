// The network ring (layer 3): ring all-reduce, reduce-scatter and all-gather over a Transport's
// grouped send/recv, with layer 2's reduction kernel between steps.
//
// Streams (why each exists): `comm` carries the transfers in ring order; `reduce` runs the reduction of
// slice j while `comm` already moves slice j+1 (NCCL's pipelining, done from the host). Both start
// after the work already queued on the caller's stream and the caller's stream waits for both at
// finish(). Events: reduced[j] (slice j of the chunk reduced last, which the next step sends) and
// tmp_free[b] (the reduction that last read receive buffer b finished) are the only cross-stream edges.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "core/types.h"
#include "nccl/transport.h"

namespace ringzero::nccl {

class RingDriver {
 public:
  // Rank `rank` of a ring of `nranks` (ring order = rank order). Transfers move slices of at most
  // `slice_bytes`; two receive buffers of that size are allocated here (on the current device).
  RingDriver(int rank, int nranks, size_t slice_bytes);
  ~RingDriver();
  RingDriver(const RingDriver&) = delete;
  RingDriver& operator=(const RingDriver&) = delete;

  // Plans one collective (every rank of the ring plans the same one). Buffers are device pointers.
  // all_reduce: `buf` (count elements) in place. reduce_scatter: `in` holds nranks blocks of `count`,
  // `work` is scratch of the same size, `out` (count) gets block `rank` reduced; `in` is not modified.
  // all_gather: `in` (count) to block `rank` of `out` (nranks * count), then everyone's blocks.
  // op Avg divides by nranks at the write that completes each chunk.
  void plan_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, cudaStream_t caller);
  void plan_reduce_scatter(const void* in, void* work, void* out, size_t count, DType dtype, ReduceOp op,
                           cudaStream_t caller);
  void plan_all_gather(const void* in, void* out, size_t count, DType dtype, cudaStream_t caller);

  size_t num_steps() const { return steps_.size(); }
  // Step i in two halves: the transfers (inside the transport's group) and, after group_end, the
  // reduction of what was received (the loopback only copies at group_end, so it must come after).
  void post_transfers(size_t i, Transport& t);
  void post_reduce(size_t i);
  // Makes the caller's stream wait for everything planned.
  void finish();

  int rank() const { return rank_; }

 private:
  struct Step {
    const char* send = nullptr;  // slice sent to the right neighbour (nullptr: none)
    size_t send_bytes = 0;
    bool send_after_reduce = false;  // the sent slice was written by the previous step's reduction
    char* recv = nullptr;            // where the slice from the left lands (tmp buffer if reducing)
    size_t recv_bytes = 0;
    bool reduce = false;             // dst = src (op) tmp after the receive
    char* dst = nullptr;
    const char* src = nullptr;
    int divisor = 1;
    int slice = 0;                   // j: index into reduced_
    int tmp = 0;                     // receive buffer used
  };
  void begin(DType dtype, ReduceOp op, size_t slice_elems_max, cudaStream_t caller);
  // Adds the steps of one ring pass: at pass step t, send chunk send_chunk(t), receive chunk
  // recv_chunk(t) (reduced with src_chunk(t) into dst_chunk(t) when reduce is set).
  template <class SendF, class RecvF, class DstF, class SrcF>
  void add_pass(int nsteps, size_t chunk_count, SendF send_ptr, RecvF recv_ptr, DstF dst_ptr, SrcF src_ptr,
                bool reduce, bool first_send_after_reduce, bool divide_last);

  int rank_, nranks_;
  size_t slice_bytes_;
  DType dtype_ = DType::F32;
  ReduceOp op_ = ReduceOp::Sum;
  size_t esize_ = 4;
  cudaStream_t caller_ = nullptr, comm_ = nullptr, reduce_ = nullptr;
  void* tmp_[2] = {nullptr, nullptr};
  std::vector<cudaEvent_t> reduced_;
  std::vector<bool> reduced_set_;
  cudaEvent_t tmp_free_[2] = {nullptr, nullptr};
  bool tmp_free_set_[2] = {false, false};
  cudaEvent_t recv_done_ = nullptr;
  std::vector<Step> steps_;
};

// One process's rank over NCCL: every step in its own group, then its reduction.
void run_ring(RingDriver& driver, Transport& transport);
// Simulated ranks over the loopback: all ranks' step i in one group (so sends meet receives), in
// lockstep. Every driver must have planned the same collective.
void run_rings(const std::vector<RingDriver*>& drivers, Transport& transport);

}  // namespace ringzero::nccl
