// The CUDA lane of RingzeroBackend: ShmComm's collectives on cuda::PeerComm, the side stream, and the
// Work whose wait() orders the caller's stream after the op ([Note: CUDA tensors in the backend],
// backend_cuda.h). Without RINGZERO_WITH_CUDA only make_cuda_lane is here, and it refuses.
#include "backend_cuda.h"

#include "core/errors.h"

#ifndef RINGZERO_WITH_CUDA

namespace ringzero {
std::shared_ptr<CudaLane> make_cuda_lane(CudaPeers, int) {
  throw InvalidArgument("ringzero: this build has no CUDA path (built against a CPU torch or without nvcc)");
}
}  // namespace ringzero

#else

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "backend_work.h"
#include "cuda/peer_comm.h"
#include "cuda_algo.h"

namespace ringzero {
namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("ringzero CUDA backend: ") + what + ": " + cudaGetErrorString(e));
}

// A CUDA event for ordering streams (no timing). The runtime's own, not torch's CUDAEvent: that one moved
// from ATen to c10 in 2.11 and its ATen header pulls in the cuSPARSE/cuBLAS headers.
class Event {
 public:
  Event() { cuda_ok(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s) { cuda_ok(cudaEventRecord(event_, s), "cudaEventRecord"); }
  void block(cudaStream_t s) const { cuda_ok(cudaStreamWaitEvent(s, event_, 0), "cudaStreamWaitEvent"); }
  bool query() const { return cudaEventQuery(event_) == cudaSuccess; }
  void synchronize() const { cuda_ok(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

 private:
  cudaEvent_t event_ = nullptr;
};

// ShmComm's vocabulary on the lane's stream, over `run`, one collective of the CUDA transport: the peer
// kernels (one host) or the engine (several hosts).
class LaneCollectives : public CudaComm {
 public:
  LaneCollectives(at::Device device, c10::cuda::CUDAStream stream) : device_(device), stream_(stream) {}

  void all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, AllReduceAlgo algo) override {
    run(cuda::Coll::AllReduce, in, out, count, dtype, op, cuda_algo_of(algo));
  }
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    run(cuda::Coll::ReduceScatter, in, out, count, dtype, op, cuda::Algo::Auto);
  }
  void all_gather(const void* in, void* out, size_t count, DType dtype) override {
    if (!cuda_reducible(dtype)) {  // moved as 32-bit words (the route checked the byte count)
      const size_t bytes = count * dtype_size(dtype);
      if (bytes % 4 != 0) throw InvalidArgument("ringzero CUDA all_gather: a block of this dtype is not 4-byte sized");
      dtype = DType::I32;
      count = bytes / 4;
    }
    run(cuda::Coll::AllGather, in, out, count, dtype, ReduceOp::Sum, cuda::Algo::Auto);
  }
  void all_gather_v(const void*, void*, const std::vector<size_t>&, DType) override {
    throw InvalidArgument("ringzero CUDA: uneven all_gather is the inner backend's (this is a routing bug)");
  }
  void all_to_all_v(const void*, void*, const std::vector<size_t>&, const std::vector<size_t>&, DType) override {
    throw InvalidArgument("ringzero CUDA: the all-to-all across hosts is the inner backend's (this is a routing bug)");
  }
  // Broadcast as a sum in which only the root contributes: the root's bytes, as 32-bit integers, plus
  // zeros from every other rank is exact for any dtype. Costs an all-reduce (no broadcast kernel yet).
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    const size_t bytes = count * dtype_size(dtype);
    if (bytes == 0 || alone()) return;
    at::Tensor words = at::zeros({static_cast<int64_t>((bytes + 3) / 4)}, options(at::kInt));
    if (rank() == root) copy(words.data_ptr(), buf, bytes);
    run(cuda::Coll::AllReduce, words.data_ptr(), words.data_ptr(), words.numel(), DType::I32, ReduceOp::Sum,
        cuda::Algo::Auto);
    if (rank() != root) copy(buf, words.data_ptr(), bytes);
  }
  // Reduce as an all-reduce whose non-root ranks write a scratch buffer (their tensor stays as it was).
  void reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) override {
    if (rank() == root) return all_reduce(in, out, count, dtype, op, AllReduceAlgo::Auto);
    at::Tensor scratch = at::empty({static_cast<int64_t>(count * dtype_size(dtype))}, options(at::kByte));
    all_reduce(in, scratch.data_ptr(), count, dtype, op, AllReduceAlgo::Auto);
  }

 protected:
  virtual bool alone() const = 0;  // a group of one rank: every collective is a copy
  // One collective, `count` elements per rank (shapes as cuda::run_collective), queued on the lane's stream.
  virtual void run(cuda::Coll coll, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                   cuda::Algo algo) = 0;
  at::TensorOptions options(at::ScalarType t) const { return at::TensorOptions().dtype(t).device(device_); }
  void copy(void* dst, const void* src, size_t bytes) {
    if (dst != src && bytes) cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.stream()),
                                     "cudaMemcpyAsync");
  }

  at::Device device_;
  c10::cuda::CUDAStream stream_;
};

// One host: the peer-memory kernels over CUDA IPC.
class PeerCollectives final : public LaneCollectives {
 public:
  PeerCollectives(std::shared_ptr<cuda::PeerComm> peer, at::Device device, c10::cuda::CUDAStream stream)
      : LaneCollectives(device, stream), peer_(std::move(peer)) {}
  int rank() const override { return peer_ ? peer_->rank() : 0; }

  // The kernel reads the send counts in device memory: they go there on the lane's stream, from host
  // memory the copy is done with when cudaMemcpyAsync returns (pageable), so the vector may go.
  void all_to_all_v(const void* in, void* out, const std::vector<size_t>& send_counts,
                    const std::vector<size_t>& recv_counts, DType dtype) override {
    size_t in_elems = 0, out_elems = 0;
    for (size_t c : send_counts) in_elems += c;
    for (size_t c : recv_counts) out_elems += c;
    if (!peer_) return copy(out, in, in_elems * dtype_size(dtype));  // a group of one rank
    const std::vector<int64_t> host(send_counts.begin(), send_counts.end());
    at::Tensor counts = at::empty({static_cast<int64_t>(host.size())}, options(at::kLong));
    cuda_ok(cudaMemcpyAsync(counts.data_ptr(), host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                            stream_.stream()),
            "cudaMemcpyAsync of the all-to-all's counts");
    peer_->all_to_all(in, in_elems, out, out_elems, counts.data_ptr<int64_t>(), dtype, stream_.stream());
  }

 private:
  bool alone() const override { return !peer_; }
  void run(cuda::Coll coll, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
           cuda::Algo algo) override {
    if (count == 0) return;
    if (!peer_) return copy(out, in, count * dtype_size(dtype));
    peer_->run(coll, in, out, count, dtype, op, algo, stream_.stream());
  }

  std::shared_ptr<cuda::PeerComm> peer_;
};

// Several hosts: the engine (CudaHostsEngine in comm/backend.py), called with the lane's stream current
// (PeerLane::launch), on CUDA views of the staged buffers: engine(op, tensors, args) as HostsComm calls
// the CPU one (backend_hosts.h).
class EngineCollectives final : public LaneCollectives {
 public:
  EngineCollectives(const CudaPeers& peers, at::Device device, c10::cuda::CUDAStream stream)
      : LaneCollectives(device, stream), engine_(peers.engine), rank_(peers.rank), size_(peers.size) {}
  int rank() const override { return rank_; }

 private:
  bool alone() const override { return size_ == 1; }
  void run(cuda::Coll coll, const void* in, void* out, size_t count, DType dtype, ReduceOp op, cuda::Algo) override {
    if (count == 0) return;
    const int64_t o = static_cast<int64_t>(op);
    switch (coll) {
      case cuda::Coll::AllReduce:
        copy(out, in, count * dtype_size(dtype));
        return engine_("all_reduce", {view(out, count, dtype)}, {o});
      case cuda::Coll::ReduceScatter:
        return engine_("reduce_scatter", {view(out, count, dtype), view(in, count * size_, dtype)}, {o});
      case cuda::Coll::AllGather:
        return engine_("all_gather", {view(out, count * size_, dtype), view(in, count, dtype)}, {});
    }
    throw InvalidArgument("ringzero CUDA: unknown collective for the engine across hosts");
  }
  at::Tensor view(const void* p, size_t count, DType dtype) const {
    return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(count)}, options(scalar_type_of(dtype)));
  }

  HostsEngine engine_;
  int rank_, size_;
};

// A CUDA collective in flight: complete for torch once its end event is recorded (the future is
// CUDA-aware, so callbacks and value() order their streams after it); wait() makes the caller's
// current stream wait for the end event, and waits on the host only with RINGZERO_CUDA_BLOCKING_WAIT.
class CudaWork final : public OutputsWork {
 public:
  CudaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq, at::Device device,
           c10::cuda::CUDAStream stream, std::shared_ptr<cuda::PeerComm> peer, bool blocking_wait)
      : OutputsWork(rank, type, std::move(outputs), seq, {device}), device_(device), peer_(std::move(peer)),
        blocking_wait_(blocking_wait) {
    end_.record(stream.stream());
    c10::cuda::CUDAStreamGuard on_lane(stream);  // the future records its own event on the lane's stream
    future_->markCompleted(c10::IValue(outputs_));
  }

  bool isCompleted() override { return end_.query(); }
  bool wait(std::chrono::milliseconds /*timeout: the kernels' own, RINGZERO_TIMEOUT_S*/) override {
    c10::cuda::CUDAGuard guard(device_);
    end_.block(c10::cuda::getCurrentCUDAStream(device_.index()).stream());
    if (blocking_wait_ && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None)
      end_.synchronize();
    if (peer_) peer_->check();  // host memory only: raises if a kernel of this group timed out
    return true;
  }

 private:
  at::Device device_;
  std::shared_ptr<cuda::PeerComm> peer_;
  bool blocking_wait_;
  Event end_;
};

class PeerLane final : public CudaLane {
 public:
  PeerLane(CudaPeers peers, int device_index)
      : peers_(std::move(peers)),
        device_(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)),
        // One stream for all of this group's CUDA ops: PeerComm needs its launches in one order.
        stream_(c10::cuda::getStreamFromPool(false, device_.index())) {
    if (peers_.engine) {
      comm_ = std::make_unique<EngineCollectives>(peers_, device_, stream_);
    } else {
      comm_ = std::make_unique<PeerCollectives>(peers_.peer, device_, stream_);
    }
  }

  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                        const std::vector<at::Tensor>& tensors, uint64_t seq,
                                        const std::function<void(CudaComm&)>& fn) override {
    if (peers_.peer) peers_.peer->check();  // an earlier kernel timed out: refuse, naming the cause
    c10::cuda::CUDAGuard guard(device_);
    follow_current();
    {
      // Staging tensors of fn are the lane stream's, and the engine queues its work on it.
      c10::cuda::CUDAStreamGuard on_lane(stream_);
      fn(*comm_);
    }
    for (const auto& t : tensors)
      if (t.defined() && t.numel() > 0) t.record_stream(stream_.unwrap());
    return c10::make_intrusive<CudaWork>(comm_->rank(), type, std::move(outputs), seq,
                                         device_, stream_, peers_.peer, peers_.blocking_wait);
  }

  std::function<void()> host_fence() override {
    c10::cuda::CUDAGuard guard(device_);
    follow_current();
    auto done = std::make_shared<Event>();
    done->record(stream_.stream());
    return [done] { done->synchronize(); };
  }

  void synchronize() override { stream_.synchronize(); }
  int device_index() const override { return device_.index(); }
  const CudaPeers& peers() const override { return peers_; }

 private:
  void follow_current() {
    Event ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()).stream());
    ready.block(stream_.stream());
  }

  CudaPeers peers_;
  at::Device device_;
  c10::cuda::CUDAStream stream_;
  std::unique_ptr<LaneCollectives> comm_;
};

}  // namespace

std::shared_ptr<CudaLane> make_cuda_lane(CudaPeers peers, int device_index) {
  return std::make_shared<PeerLane>(std::move(peers), device_index);
}

}  // namespace ringzero

#endif  // RINGZERO_WITH_CUDA
