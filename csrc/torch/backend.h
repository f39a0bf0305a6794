// ringzero as a c10d Backend (layer 4): `torch.distributed.init_process_group("ringzero")` lands here.
//
// CPU tensors of a group whose ranks share one host run on the shared-memory collectives of
// csrc/core/shm_comm.h, on one worker thread in call order, and send/recv on the point-to-point
// channels of csrc/core/shm_p2p.h, on one thread per peer and direction (so that a send waiting
// for its receiver never holds up a collective or a message to another peer). Everything else is handed to an inner
// backend built by the Python creator from the same store: gloo for CPU tensors (ops we do not
// implement, dtypes or reduce ops our kernels lack, groups spanning hosts). CUDA tensors of a group on
// one host run on the CUDA peer-memory kernels through a lane set up at the first CUDA op
// ([Note: CUDA tensors in the backend], backend_cuda.h); the rest goes to NCCL. Each op that falls
// back says so once at c10d debug level, and stats() counts both routes per device so tests can tell
// which one ran.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/shm_comm.h"
#include "core/shm_p2p.h"
#include "backend_cuda.h"
#include "backend_hosts.h"
#include "backend_work.h"

namespace ringzero {

// What the Python creator hands over (python/ringzero/comm/backend.py), from the one validated
// configuration of python/ringzero/comm/config.py; bound as ringzero._C.BackendConfig.
struct BackendConfig {
  std::string host_id;     // this rank's host identity (RINGZERO_HOST_ID overrides it); the creator decides spans_hosts
  double timeout_s = 300;  // every shared-memory wait and store wait ends after this
  size_t slot_bytes = 1 << 20;                            // RINGZERO_SHM_BUFFER_BYTES
  AllReduceAlgo all_reduce_algo = AllReduceAlgo::Auto;  // RINGZERO_ALLREDUCE_ALGO; Auto chooses by size
  bool single_copy = true;                                // RINGZERO_SINGLE_COPY
  // The group's ranks are on several hosts: decided by the creator from the host exchange (the one
  // decision of the layout, comm/transports.py pick_transport); no shared-memory segment is made then.
  bool spans_hosts = false;
  // The cpus this host's ranks may run on together (HostGroup.local_cpus): whether each can have a core of
  // its own, which one rank's affinity no longer shows once a launcher bound it (ShmComm::set_host_cpus).
  // 0: judge by this process's affinity.
  int host_cpus = 0;
};

// What an op's options say about how it is run: its timeout, and whether the caller waits for it at
// once (asyncOp false: torch's blocking form, whose Work it waits on before going on).
struct CallOpts {
  std::chrono::milliseconds timeout;
  bool async_op = true;
  // Across hosts: the op's body hands its tensors to the engine as they are, reading none of them first, so
  // a tail the op before left may run after the body's first segment ([Note: the engine's deferred tail],
  // backend_hosts.h). False (every op but a contiguous all-reduce without premultiplication): the tail runs
  // before the body, which may copy a tensor the tail is still to write.
  bool tail_may_wait = false;
};
template <class Options>
CallOpts call_opts(const Options& opts) {
  return {opts.timeout, opts.asyncOp};
}

class RingzeroBackend : public c10d::Backend {
 public:
  // Collective over the group: every rank constructs it with the same store (already prefixed for
  // this group). `cpu_fallback` is required; `cuda_fallback` may be null (no NCCL here); `cuda_setup`
  // is empty where this build or machine has no CUDA path (CUDA ops then all go to `cuda_fallback`).
  // `hosts_engine` runs the CPU collectives of a group that spans hosts (config.spans_hosts); without
  // it those go to `cpu_fallback`.
  RingzeroBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, BackendConfig config,
                  c10::intrusive_ptr<c10d::Backend> cpu_fallback, c10::intrusive_ptr<c10d::Backend> cuda_fallback,
                  CudaSetup cuda_setup = {}, HostsEngineCall hosts_engine = {});
  ~RingzeroBackend() override;

  const std::string getBackendName() const override { return "ringzero"; }
  bool uses_shared_memory() const { return shm_ != nullptr; }
  bool runs_across_hosts() const { return static_cast<bool>(hosts_); }
  // {"native": {op: calls}, "fallback": {op: calls}} for tensors of `device_type`, as plain maps.
  std::map<std::string, std::map<std::string, int64_t>> stats(c10::DeviceType device_type) const;

  // Ours on the shared-memory path.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Tag 0 (torch's default) on our channels, in order per peer; other tags go to the inner backend.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  // Tag 0 likewise: the first message from a rank with no earlier recv() waiting for it; the Work's
  // sourceRank() names the sender ([Note: receive from any source]).
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Handed to the inner backend.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // [Note: coalescing] torch's _coalescing_manager(group, device=...) (the form NCCL users write, and
  // batch_isend_irecv on a backend that says it supports coalescing) calls startCoalescing() before its
  // ops and waits on the Work endCoalescing() returns instead of theirs. Without device= torch hands
  // the captured ops to the *_coalesced entry points and never calls these. Here every op issued in
  // between, ours or the inner backend's, runs as it would outside (in issue order, on its own queue)
  // and the returned CoalescedWork covers them all. supportsCoalescing() stays false: batch_isend_irecv
  // then issues each send and recv on its own, which our per-peer channels need (a send may wait for
  // its receiver). Bracketing twice, or ending without a start, is an error that says so.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void shutdown() override;

 private:
  // Which backend runs an op on tensors of `device`: null for ours, else the inner one. `native_ok`
  // is false when our kernels cannot take these arguments (dtype, reduce op, layout, uneven sizes).
  // `collective`: every rank calls it, so it may set up the CUDA lane (send/recv pass false).
  c10d::Backend* route(const at::Device& device, const char* op, bool native_ok, bool collective = true);
  // Before an op whose CPU tensors go to the inner gloo and that gloo runs on data_ptr() as if contiguous
  // (all-reduce and reduce, also coalesced, and scatter's outputs; torch 2.13): a ValueError naming the op
  // for a non-contiguous one, where gloo would write the wrong elements without a word.
  static void check_contiguous_for_inner(const std::vector<at::Tensor>& tensors, const char* op, const char* what);
  void count(bool native, c10::DeviceType device_type, const char* op);
  // Every Work an op returns passes here: between startCoalescing() and endCoalescing() it is kept
  // for the CoalescedWork.
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work);
  // The CUDA lane on `device`, set up at the first CUDA collective when `may_set_up`; null when this
  // group has no CUDA path. Throws if the setup failed or `device` is not the lane's.
  CudaLane* cuda_lane(const at::Device& device, const char* op, bool may_set_up);
  // Whether the CUDA all-to-all kernel serves this group on `device`: a CUDA lane on one host, and the
  // group's shared memory for the count check ([Note: the CUDA all-to-all's counts], backend_ops.cpp).
  bool cuda_moves_blocks(const at::Device& device, const char* op);
  // Every rank's send and receive counts (elements) meet on the host; throws CollectiveMismatchError on
  // every rank where two ranks' split sizes disagree. Every rank of the group calls it. backend_ops.cpp.
  void agree_on_splits(const std::vector<size_t>& send, const std::vector<size_t>& recv, const char* op);
  void close_cuda();
  // Runs body(comm) on ringzero's communicator for `device`: the shared-memory worker thread (CPU) or
  // the CUDA lane; `inputs` are the CUDA tensors read besides `outputs`. Defined in backend_ops.cpp.
  template <class Body>
  c10::intrusive_ptr<c10d::Work> submit(const at::Device& device, c10d::OpType type, std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> inputs, CallOpts call, Body body);
  // Queues fn(shm) on the collectives' worker thread; the returned Work completes with `outputs`.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, CallOpts call,
                                         std::function<void(ShmComm&)> fn);
  // Queues fn on `executor`; the returned Work completes with `outputs` (or fn's exception). The
  // second form hands fn the Work (a receive from any source records its sender there). `now`: the
  // caller waits for it at once, so it runs here when nothing is queued before it ([Note: the caller
  // runs its own collective], backend_work.h).
  c10::intrusive_ptr<c10d::Work> enqueue_on(SerialExecutor& executor, c10d::OpType type,
                                            std::vector<at::Tensor> outputs, std::function<void()> fn,
                                            bool now = false);
  c10::intrusive_ptr<c10d::Work> enqueue_on(SerialExecutor& executor, c10d::OpType type,
                                            std::vector<at::Tensor> outputs, std::function<void(RingzeroWork&)> fn,
                                            bool now = false);
  // Reads one message from `src` into `buf` on our channel, holding src's receive lock.
  void recv_from(const at::Tensor& buf, int src, double timeout_s);
  // The thread that carries messages to (sends) or from (recvs) `peer`, started on first use.
  SerialExecutor& peer_executor(bool sending, int peer);
  void stop_executors();
  void rendezvous(const c10::intrusive_ptr<c10d::Store>& store);
  size_t p2p_slot_bytes() const;

  BackendConfig config_;
  c10::intrusive_ptr<c10d::Backend> cpu_fallback_;
  c10::intrusive_ptr<c10d::Backend> cuda_fallback_;
  std::unique_ptr<ShmComm> shm_;  // null when the group spans hosts
  std::unique_ptr<ShmP2P> p2p_;   // likewise
  HostsComm hosts_;               // the engine of a group spanning hosts; empty otherwise
  uint64_t seq_ = 0;              // collectives queued on the shared-memory path
  mutable std::mutex stats_mu_;
  std::map<std::pair<bool, c10::DeviceType>, std::map<std::string, int64_t>> calls_;  // (native, device) -> op -> n
  std::mutex cuda_mu_;
  CudaSetup cuda_setup_;         // handed by Python; run once, then dropped
  std::string cuda_setup_error_;  // why the setup failed, repeated to every later CUDA op
  std::shared_ptr<CudaLane> cuda_;
  // Last: destroyed (drained) before the communicators they use.
  SerialExecutor executor_;
  std::mutex peers_mu_;
  std::map<std::pair<bool, int>, std::unique_ptr<SerialExecutor>> peer_executors_;  // (sending, peer)
  // [Note: receive from any source] It runs on its own thread, in call order. A message from rank r
  // goes to recvs from r posted earlier: while any is queued (pending_recvs_[r] > 0) the any-source
  // receive passes r over. Reading a channel takes its recv_locks_ entry, so the any-source thread and
  // r's receive thread never read one channel at once; the any-source side re-checks under the lock.
  std::unique_ptr<std::atomic<int>[]> pending_recvs_;  // per source rank: recv() queued, not finished
  std::unique_ptr<std::mutex[]> recv_locks_;           // per source rank
  std::mutex coalesce_mu_;
  std::atomic<bool> coalescing_{false};  // between startCoalescing() and endCoalescing(); read first, unlocked
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;  // the Works issued meanwhile, in order
  SerialExecutor any_source_executor_;
};

}  // namespace ringzero
