// Point-to-point transports under the network ring driver (layer 3): NCCL between processes, and a
// loopback between simulated ranks of one process that replaces ncclSend/ncclRecv with
// cudaMemcpyAsync so the driver's streams, events and pipelining can be tested on one GPU.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ringzero::nccl {

// Makes `after` wait for the work queued so far on `before` (a one-off event; no host wait).
void stream_order(cudaStream_t before, cudaStream_t after);

class Transport {
 public:
  virtual ~Transport() = default;
  // Sends and receives posted between group_start and group_end are matched together (NCCL groups).
  // `rank` is the posting rank (the loopback drives several; NCCL has exactly one).
  virtual void group_start() = 0;
  virtual void send(int rank, const void* buf, size_t bytes, int peer, cudaStream_t stream) = 0;
  virtual void recv(int rank, void* buf, size_t bytes, int peer, cudaStream_t stream) = 0;
  virtual void group_end() = 0;
};

// Loopback between simulated ranks: at group_end each recv is paired with the send addressed to it
// (in posting order) and becomes one cudaMemcpyAsync on the receiver's stream, ordered after the
// sender's stream (event) and before the sender's later work (event back), as a real transfer is.
class LoopbackTransport : public Transport {
 public:
  void group_start() override;
  void send(int rank, const void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void recv(int rank, void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void group_end() override;

 private:
  struct Post {
    int rank, peer;
    const void* src;
    void* dst;
    size_t bytes;
    cudaStream_t stream;
  };
  std::vector<Post> sends_, recvs_;
  bool open_ = false;
};

// NCCL: one communicator per process, bootstrapped from a unique id that rank 0 makes and the others
// receive through the store. Bytes move as ncclUint8 (the driver does the arithmetic itself).
class NcclTransport : public Transport {
 public:
  static std::string make_unique_id();  // sizeof(ncclUniqueId) bytes
  NcclTransport(const std::string& unique_id, int rank, int nranks);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;
  void group_start() override;
  void send(int rank, const void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void recv(int rank, void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void group_end() override;

 private:
  void* comm_ = nullptr;  // ncclComm_t, kept opaque so this header needs no nccl.h
  int rank_;
};

}  // namespace ringzero::nccl
