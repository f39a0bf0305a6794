// The loopback transport: NCCL's send/recv matching, done with cudaMemcpyAsync inside one process.
#include <string>

#include "core/errors.h"
#include "nccl/transport.h"

namespace ringzero::nccl {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("ringzero loopback: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

// Destroying the event right after the wait is legal: the runtime keeps it until its work completes.
void stream_order(cudaStream_t before, cudaStream_t after) {
  if (before == after) return;
  cudaEvent_t ev;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(ev, before), "cudaEventRecord");
  check(cudaStreamWaitEvent(after, ev, 0), "cudaStreamWaitEvent");
  check(cudaEventDestroy(ev), "cudaEventDestroy");
}

void LoopbackTransport::group_start() {
  if (open_) throw InvalidArgument("ringzero loopback: nested group_start");
  open_ = true;
}

void LoopbackTransport::send(int rank, const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  sends_.push_back(Post{rank, peer, buf, nullptr, bytes, stream});
}

void LoopbackTransport::recv(int rank, void* buf, size_t bytes, int peer, cudaStream_t stream) {
  recvs_.push_back(Post{rank, peer, nullptr, buf, bytes, stream});
}

void LoopbackTransport::group_end() {
  if (!open_) throw InvalidArgument("ringzero loopback: group_end without group_start");
  open_ = false;
  std::vector<bool> used(sends_.size(), false);
  for (const Post& r : recvs_) {
    size_t i = 0;
    while (i < sends_.size() && (used[i] || sends_[i].rank != r.peer || sends_[i].peer != r.rank)) ++i;
    if (i == sends_.size())
      throw CommError("ringzero loopback: rank " + std::to_string(r.rank) + " receives from rank " +
                      std::to_string(r.peer) + " but that rank posted no matching send in this group");
    const Post& s = sends_[i];
    used[i] = true;
    if (s.bytes != r.bytes)
      throw CommError("ringzero loopback: rank " + std::to_string(s.rank) + " sends " + std::to_string(s.bytes) +
                      " bytes but rank " + std::to_string(r.rank) + " expects " + std::to_string(r.bytes));
    stream_order(s.stream, r.stream);  // the data is ready
    if (r.bytes) check(cudaMemcpyAsync(r.dst, s.src, r.bytes, cudaMemcpyDeviceToDevice, r.stream), "copy");
    stream_order(r.stream, s.stream);  // the sender may reuse its buffer only after the copy
  }
  for (size_t i = 0; i < sends_.size(); ++i)
    if (!used[i])
      throw CommError("ringzero loopback: rank " + std::to_string(sends_[i].rank) + " sends to rank " +
                      std::to_string(sends_[i].peer) + " but that rank posted no matching receive");
  sends_.clear();
  recvs_.clear();
}

}  // namespace ringzero::nccl
