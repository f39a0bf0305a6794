// The CUDA half of the c10d backend (layer 4): what the Python creator hands over at the group's first
// CUDA op, and the lane that runs CUDA collectives on ringzero's peer-memory kernels (csrc/cuda).
// Free of CUDA headers, so that backend.cpp and backend_ops.cpp compile the same in the CPU and the
// CUDA variant; backend_cuda.cpp implements it (a stub that refuses without RINGZERO_WITH_CUDA).
//
// [Note: CUDA tensors in the backend]
// Who sets up: Python. The C++ backend cannot know a rank's GPU when the group is created (scripts
// often call torch.cuda.set_device after init_process_group), so the CUDA peer communicator is made
// lazily, at the first CUDA collective, on that tensor's device: the backend calls the setup function
// the creator handed it (comm/backend.py CudaSetup), which meets the other ranks through the group's
// store with HostGroup (comm/host_group.py: timeouts, CommTimeout naming a missing rank), exchanges
// the CUDA IPC handles exactly as the Communicator's CUDA path does (comm/cuda.py open_ipc_peers),
// and returns the opened cuda::PeerComm. The backend only routes what it is handed: no store keys,
// no environment, no second rendezvous in C++. Calling into Python once per group is the price; the
// alternative (the IPC exchange rewritten in C++) is the duplication issue 16 set out to remove.
// Where it runs: every CUDA op of a group goes on one side stream (PeerComm requires its launches to be
// ordered on one stream: staging is reused because the previous kernel ended), which first waits for
// the caller's current stream; Work::wait() makes the caller's current stream wait for the op's end
// event (no host wait), and the Work's future is CUDA-aware, completed on the side stream, as
// ProcessGroupNCCL's is. One op body serves both devices: CudaComm speaks ShmComm's vocabulary.
// A group spanning hosts: the setup also hands over an engine (comm/backend.py CudaHostsEngine), the CUDA
// transport ringzero.* runs for that layout (comm/cuda.py: IPC in the host and NCCL rings across hosts,
// or the flat NCCL ring), and the lane calls it for all-reduce, reduce-scatter and all-gather with the
// lane's stream current, so its kernels and NCCL calls queue there like the peer kernels ([Note: one
// engine behind every door], docs/design.md); broadcast and reduce run as all-reduces, as on one host.
// The all-to-all runs its kernel on one host (any dtype: it moves bytes); across hosts it goes to the
// inner NCCL backend, as gather and scatter do everywhere.
// What is not ours: dtypes and reduce ops the CUDA kernels lack, uneven all-gathers, send/recv and the
// always-handed-on ops go to the inner NCCL backend; where NCCL cannot serve (ranks sharing one GPU, or
// no NCCL) the op raises a ValueError naming it.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend_hosts.h"
#include "core/types.h"

namespace ringzero {
namespace cuda {
class PeerComm;
}

// What the setup function returns (ringzero._C.CudaBackendPeers).
struct CudaPeers {
  // This rank's opened IPC communicator among its host's ranks; null when it is alone on its host.
  std::shared_ptr<cuda::PeerComm> peer;
  bool spans_hosts = false;    // the group spans hosts: its CUDA collectives go to `engine`
  bool shares_gpu = false;     // two ranks of the group share a GPU: NCCL cannot serve this group
  bool blocking_wait = false;  // RINGZERO_CUDA_BLOCKING_WAIT: Work::wait() also waits on the host
  // A group spanning hosts: the CUDA transport of its layout (see the Note), taking CUDA tensors; empty
  // otherwise, and then the group's CUDA ops go to the inner NCCL backend.
  HostsEngine engine;
  int rank = 0, size = 1;  // this rank and the group's size (the engine's views need them)
};
// Called once, at the group's first CUDA collective, with that tensor's device index.
using CudaSetup = std::function<CudaPeers(int device_index)>;

// The CUDA dtypes our kernels reduce (csrc/cuda/dispatch.cuh): float32, bfloat16, float16, int32, int64.
inline bool cuda_reducible(DType d) {
  return d == DType::F32 || d == DType::BF16 || d == DType::F16 || d == DType::I32 || d == DType::I64;
}

// ShmComm's collectives over the CUDA peer communicator, enqueued on the lane's stream (pointers are
// device pointers). A dtype the kernels lack moves as bytes (DType::U8) when the count is a multiple
// of 4 bytes; all_gather_v (uneven sizes) is never routed here.
class CudaComm {
 public:
  virtual ~CudaComm() = default;
  virtual int rank() const = 0;
  virtual void all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, AllReduceAlgo algo) = 0;
  virtual void reduce_scatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) = 0;
  virtual void all_gather(const void* in, void* out, size_t count, DType dtype) = 0;
  virtual void all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) = 0;
  // All-to-all(v) along dim 0, counts in elements per rank (ShmComm::all_to_all_v's shapes); one host
  // only, the counts already agreed on ([Note: the CUDA all-to-all's counts], backend_ops.cpp).
  virtual void all_to_all_v(const void* in, void* out, const std::vector<size_t>& send_counts,
                            const std::vector<size_t>& recv_counts, DType dtype) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual void reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) = 0;
};

// One group's CUDA collectives on one device (see the Note above).
class CudaLane {
 public:
  virtual ~CudaLane() = default;
  // Runs fn on the lane's stream after the caller's current stream's work; `tensors` are kept from
  // the caching allocator until the op ends. Refuses (CommTimeoutError) after a kernel timed out.
  virtual c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                const std::vector<at::Tensor>& tensors, uint64_t seq,
                                                const std::function<void(CudaComm&)>& fn) = 0;
  // Records, on the lane's stream, a point after the caller's current stream's work and every op
  // launched so far; the returned function waits on the host for it (a barrier's CUDA half).
  virtual std::function<void()> host_fence() = 0;
  virtual void synchronize() = 0;  // the host waits for every op launched so far
  virtual int device_index() const = 0;
  virtual const CudaPeers& peers() const = 0;
};

// The lane for `peers` on device `device_index`; throws in a build without CUDA.
std::shared_ptr<CudaLane> make_cuda_lane(CudaPeers peers, int device_index);

}  // namespace ringzero
