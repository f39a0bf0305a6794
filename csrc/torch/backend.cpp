// RingzeroBackend: construction (shared-memory rendezvous through the group's store), the choice
// between our path and the inner backend, the worker-thread plumbing, and the ops that are always
// handed to the inner backend. The collectives themselves are in backend_ops.cpp.
#include "backend.h"

#include <torch/csrc/distributed/c10d/logging.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <sstream>

#include "core/errors.h"

namespace ringzero {
namespace {

constexpr const char* kKeyPrefix = "ringzero/";

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// c10d's debug level (TORCH_CPP_LOG_LEVEL=INFO with TORCH_DISTRIBUTED_DEBUG=DETAIL), as torch's own
// C10D_DEBUG does; that macro formats with fmt, whose compiled part torch does not export.
void debug_log(const std::string& msg) {
  if (c10d::detail::isLogLevelEnabled(c10d::detail::LogLevel::Debug)) LOG(INFO) << "[c10d - debug] ringzero: " << msg;
}

// Point-to-point slots: smaller than the collectives' (n^2 channels of kSlots slots each); a test's
// smaller RINGZERO_SHM_BUFFER_BYTES shrinks them too, so that it exercises slicing.
constexpr size_t kP2PSlotBytesMax = 64 << 10;

std::string key(const std::string& name, int rank = -1) {
  return kKeyPrefix + name + (rank >= 0 ? "/" + std::to_string(rank) : "");
}

}  // namespace

size_t RingzeroBackend::p2p_slot_bytes() const { return std::min(config_.slot_bytes, kP2PSlotBytesMax); }

RingzeroBackend::RingzeroBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 BackendConfig config, c10::intrusive_ptr<c10d::Backend> cpu_fallback,
                                 c10::intrusive_ptr<c10d::Backend> cuda_fallback, CudaSetup cuda_setup,
                                 HostsEngineCall hosts_engine)
    : c10d::Backend(rank, size),
      config_(std::move(config)),
      cpu_fallback_(std::move(cpu_fallback)),
      cuda_fallback_(std::move(cuda_fallback)),
      hosts_(config_.spans_hosts ? std::move(hosts_engine) : HostsEngineCall{}, rank, size),
      cuda_setup_(std::move(cuda_setup)) {
  TORCH_CHECK_VALUE(cpu_fallback_, "ringzero backend needs an inner CPU backend (gloo) for the ops it hands on");
  TORCH_CHECK_VALUE(config_.timeout_s > 0, "timeout must be positive, got ", config_.timeout_s, " s");
  pending_recvs_.reset(new std::atomic<int>[size]());
  recv_locks_.reset(new std::mutex[size]);
  init();
  rendezvous(store);
}

RingzeroBackend::~RingzeroBackend() {
  close_cuda();
  stop_executors();
}

void RingzeroBackend::stop_executors() {
  executor_.stop();
  any_source_executor_.stop();
  std::lock_guard<std::mutex> lock(peers_mu_);
  for (auto& kv : peer_executors_) kv.second->stop();
}

SerialExecutor& RingzeroBackend::peer_executor(bool sending, int peer) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto& ex = peer_executors_[{sending, peer}];
  if (!ex) ex = std::make_unique<SerialExecutor>();
  return *ex;
}

// A group on one host (the creator decided it: config_.spans_hosts is false): rank 0 creates the two
// segments (collectives and point-to-point) and publishes their names, the others open them and
// report, rank 0 unlinks them once all have reported (so a killed process leaks nothing) and publishes
// the verdict. Every store wait is bounded by the timeout. A group spanning hosts makes no segment: its
// CPU collectives run on the hosts engine (which has its own segment per host), the rest on gloo.
void RingzeroBackend::rendezvous(const c10::intrusive_ptr<c10d::Store>& store) {
  const auto timeout = to_ms(config_.timeout_s);
  const int rank = getRank(), size = getSize();
  if (config_.spans_hosts) {
    debug_log("group rank " + std::to_string(rank) + " of " + std::to_string(size) + " spans several hosts; " +
              (hosts_ ? "its CPU collectives run on ringzero's engine across hosts" : "every op goes to the inner backend"));
    return;
  }

  std::string error;
  if (rank == 0) {
    try {
      shm_ = std::make_unique<ShmComm>("", 0, size, config_.slot_bytes, config_.timeout_s, std::vector<int>{});
      p2p_ = std::make_unique<ShmP2P>("", 0, size, p2p_slot_bytes());
      store->set(key("segment"), "ok:" + shm_->name() + "|" + p2p_->name());
    } catch (const std::exception& e) {
      store->set(key("segment"), std::string("error:rank 0: ") + e.what());
      throw;
    }
  } else {
    store->wait({key("segment")}, timeout);
    const std::string seg = store->get_to_str(key("segment"));
    if (seg.rfind("ok:", 0) != 0) throw CommError("ringzero backend could not set up shared memory: " + seg.substr(6));
    try {
      const size_t bar = seg.find('|');
      shm_ = std::make_unique<ShmComm>(seg.substr(3, bar - 3), rank, size, config_.slot_bytes, config_.timeout_s,
                                       std::vector<int>{});
      p2p_ = std::make_unique<ShmP2P>(seg.substr(bar + 1), rank, size, p2p_slot_bytes());
    } catch (const std::exception& e) {
      error = "rank " + std::to_string(rank) + ": " + e.what();
    }
    store->set(key("opened", rank), error);
  }

  if (rank == 0) {
    std::vector<std::string> opened;
    for (int r = 1; r < size; ++r) opened.push_back(key("opened", r));
    std::string errors;
    try {
      if (!opened.empty()) store->wait(opened, timeout);
      for (const auto& k : opened) {
        const std::string e = store->get_to_str(k);
        if (!e.empty()) errors += (errors.empty() ? "" : "; ") + e;
      }
    } catch (...) {
      shm_->unlink();
      p2p_->unlink();
      store->set(key("verdict"), "some ranks never opened the segment");
      throw;
    }
    shm_->unlink();
    p2p_->unlink();
    store->set(key("verdict"), errors);
    error = errors;
  } else {
    store->wait({key("verdict")}, timeout);
    const std::string verdict = store->get_to_str(key("verdict"));
    if (error.empty()) error = verdict;
  }
  // The worker thread waits while this rank's main thread computes (DDP's backward overlaps its
  // all-reduces): spinning would take that core, so it sleeps on the peer's futex at once. Measured
  // with benchmarks/ddp_backend.py on the shared 2-core machine (then still a polling sleep): all-reduce
  // of 13 MB at 2 ranks took 3.1 ms without spinning, 14.4 ms with it (benchmarks/RESULTS.md). Each op
  // sets it again: a caller blocked on the result spins ([Note: the caller runs its own collective]);
  // whether spinning is allowed at all is judged by the cpus of the host's ranks together.
  if (shm_ && config_.host_cpus > 0) shm_->set_host_cpus(config_.host_cpus);
  if (shm_) shm_->set_spin(false);
  if (shm_) shm_->set_single_copy(config_.single_copy);
  if (!error.empty()) {
    shm_.reset();
    p2p_.reset();
    throw CommError("ringzero backend could not set up shared memory: " + error);
  }
}

void RingzeroBackend::count(bool native, c10::DeviceType device_type, const char* op) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (calls_[{native, device_type}][op]++ == 0 && !native)
    debug_log(std::string(op) + " on " + c10::DeviceTypeName(device_type, true) +
              " tensors is handed to the inner backend (first call on group rank " + std::to_string(getRank()) + ")");
}

std::map<std::string, std::map<std::string, int64_t>> RingzeroBackend::stats(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  auto table = [&](bool native) {
    auto it = calls_.find({native, device_type});
    return it == calls_.end() ? std::map<std::string, int64_t>{} : it->second;
  };
  return {{"native", table(true)}, {"fallback", table(false)}};
}

c10d::Backend* RingzeroBackend::route(const at::Device& device, const char* op, bool native_ok, bool collective) {
  if (device.is_cpu()) {
    const bool ours = (shm_ || (hosts_ && collective)) && native_ok;
    count(ours, device.type(), op);
    return ours ? nullptr : cpu_fallback_.get();
  }
  if (device.is_cuda()) {
    CudaLane* lane = cuda_lane(device, op, collective);
    // Across hosts only with the engine the setup handed over (the transport ringzero.* runs there).
    if (lane && (!lane->peers().spans_hosts || lane->peers().engine) && native_ok) {
      count(true, device.type(), op);
      return nullptr;
    }
    TORCH_CHECK_VALUE(!(lane && lane->peers().shares_gpu), "ringzero ", op, ": ringzero's CUDA kernels do not run ",
                      lane && lane->peers().spans_hosts
                          ? "CUDA ops of a group spanning hosts whose ranks share a GPU (its NCCL rings cannot), "
                          : "this op with these arguments (an op, dtype, reduce op or layout they lack, or uneven "
                            "sizes), ",
                      "and the inner NCCL backend cannot: ranks of this group share one GPU. Use CPU tensors for this "
                      "op, or one GPU per rank");
    TORCH_CHECK_VALUE(cuda_fallback_, "ringzero ", op, ": got a CUDA tensor that ringzero's CUDA kernels do not take ",
                      lane ? "(an op, dtype, reduce op or layout they lack, or uneven sizes)"
                           : "(this build or machine has no CUDA path)",
                      ", and this process group has no NCCL backend to hand it to (torch without NCCL, or no GPU "
                      "when the group was created); use CPU tensors or init_process_group('cpu:ringzero,cuda:nccl')");
    count(false, device.type(), op);
    return cuda_fallback_.get();
  }
  TORCH_CHECK_VALUE(false, "ringzero ", op, ": tensors on ", device, " are not supported; use CPU or CUDA tensors");
}

// Measured on a plain gloo group (torch 2.13, 3 ranks; the cases of tests/backend/test_backend_ops.py): a
// BXOR all-reduce or reduce of x[::2] wrote its result into x's first elements and left the view's own
// unreduced, and so did scatter into a strided output (broadcast too, which ringzero runs itself);
// all_to_all_single and send/recv refuse such tensors, gather and all_to_all copy them right. Where ringzero
// hands one of the first kind to the inner gloo, it raises instead of returning a wrong result.
void RingzeroBackend::check_contiguous_for_inner(const std::vector<at::Tensor>& tensors, const char* op,
                                                 const char* what) {
  for (const auto& t : tensors) {
    // Strided tensors only: a sparse one (allreduce_sparse, or allreduce of one) is gloo's to take as it is.
    TORCH_CHECK_VALUE(!t.defined() || !t.is_cpu() || t.layout() != at::kStrided || t.is_contiguous(), "ringzero ", op,
                      ": a non-contiguous ",
                      what, " (sizes ", t.sizes(), ", strides ", t.strides(), ") would go to the inner gloo backend ",
                      "(this op, dtype or reduce op is not one of ringzero's own), which writes it as if it were ",
                      "contiguous: wrong elements. Pass a contiguous tensor (t.contiguous(), then copy the result back)");
  }
}

CudaLane* RingzeroBackend::cuda_lane(const at::Device& device, const char* op, bool may_set_up) {
  std::lock_guard<std::mutex> lock(cuda_mu_);
  if (!cuda_ && may_set_up && cuda_setup_) {
    // Once, whatever happens: the setup is a rendezvous, and a second try would meet stale keys.
    CudaSetup setup = std::move(cuda_setup_);
    cuda_setup_ = nullptr;
    const int index = device.has_index() ? device.index() : 0;
    try {
      cuda_ = make_cuda_lane(setup(index), index);
    } catch (const std::exception& e) {
      cuda_setup_error_ = e.what();
      throw;
    }
  }
  TORCH_CHECK(cuda_ || cuda_setup_error_.empty(), "ringzero ", op, ": the CUDA path of this group failed to set up "
              "at its first CUDA op: ", cuda_setup_error_);
  if (!cuda_) return nullptr;
  TORCH_CHECK_VALUE(!device.has_index() || device.index() == cuda_->device_index(), "ringzero ", op,
                    ": tensor is on ", device, " but this group's CUDA collectives run on cuda:",
                    cuda_->device_index(), " (the device of its first CUDA op); use one device per rank");
  return cuda_.get();
}

// A peer's last kernel may still write a flag into this rank's staging (a ring credit): every rank
// finishes its CUDA work and meets the others (a shared-memory barrier; the lane exists only on one
// host) before its communicator is freed. A peer that never comes costs one timeout, then we free.
void RingzeroBackend::close_cuda() {
  std::shared_ptr<CudaLane> lane;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    lane = std::move(cuda_);
    cuda_ = nullptr;
  }
  if (!lane) return;
  try {
    lane->synchronize();
    if (shm_) enqueue(c10d::OpType::BARRIER, {}, CallOpts{to_ms(config_.timeout_s), false}, [](ShmComm& c) { c.barrier(); })->wait();
  } catch (const std::exception& e) {
    debug_log(std::string("closing the CUDA lane: ") + e.what());
  }
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::enqueue_on(SerialExecutor& executor, c10d::OpType type,
                                                           std::vector<at::Tensor> outputs, std::function<void()> fn,
                                                           bool now) {
  return enqueue_on(executor, type, std::move(outputs), [fn = std::move(fn)](RingzeroWork&) { fn(); }, now);
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::enqueue_on(SerialExecutor& executor, c10d::OpType type,
                                                           std::vector<at::Tensor> outputs,
                                                           std::function<void(RingzeroWork&)> fn, bool now) {
  auto work = c10::make_intrusive<RingzeroWork>(getRank(), type, outputs, ++seq_);
  // While queued, the task holds the Work and the Work the queue's state: a cycle that ends when the
  // task is popped (run or drained by stop()), so nothing outlives the executor's end.
  std::function<void()> task = [work, fn = std::move(fn)] {
    std::exception_ptr error;
    try {
      fn(*work);
    } catch (...) {
      error = std::current_exception();
    }
    if (!work->handed_off()) work->complete(error);  // else a later task completes it ([Note: the engine's deferred tail])
  };
  // Only the collectives' executor runs ops on their callers' threads: a send run by its waiter would be
  // fine too, but nothing measured asks for it ([Note: the caller runs its own collective], backend_work.h).
  if (&executor != &executor_) {
    executor.submit(std::move(task));
  } else if (!(now && executor.run_if_idle(task))) {
    work->set_helper(executor.state(), executor.submit(std::move(task)));
  }
  return track(work);
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::track(c10::intrusive_ptr<c10d::Work> work) {
  if (!coalescing_.load(std::memory_order_relaxed)) return work;  // every op passes here: no lock outside a bracket
  std::lock_guard<std::mutex> lock(coalesce_mu_);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

void RingzeroBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesce_mu_);
  TORCH_CHECK(!coalescing_, "ringzero: startCoalescing() called again before endCoalescing(); coalescing "
              "managers of one group cannot nest (end the first one before starting another)");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  {
    std::lock_guard<std::mutex> lock(coalesce_mu_);
    TORCH_CHECK(coalescing_, "ringzero: endCoalescing() called without startCoalescing(); use "
                "torch.distributed._coalescing_manager, which calls both");
    coalescing_ = false;
    parts.swap(coalesced_);
  }
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(parts));
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                        CallOpts call, std::function<void(ShmComm&)> fn) {
  const double timeout_s = call.timeout.count() > 0 ? call.timeout.count() / 1000.0 : config_.timeout_s;
  return enqueue_on(executor_, type, std::move(outputs), [this, timeout_s, fn = std::move(fn)] {
    shm_->set_timeout(timeout_s);
    // Spin in the waits for peers only while this rank's caller is blocked on a result: run by the
    // waiter itself, or by the worker while someone waits ([Note: the caller runs its own collective]).
    shm_->set_spin(SerialExecutor::running_inline() || RingzeroWork::someone_waits(*executor_.state()));
    fn(*shm_);
  }, !call.async_op);
}

void RingzeroBackend::shutdown() {
  close_cuda();
  stop_executors();
  cpu_fallback_->shutdown();
  if (cuda_fallback_) cuda_fallback_->shutdown();
}

// ---- always handed on: the device of the tensors picks gloo or NCCL --------------------------------

namespace {
const at::Tensor& first(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK_VALUE(!ts.empty(), "ringzero ", op, ": got an empty tensor list");
  return ts[0];
}
const at::Tensor& first(const std::vector<std::vector<at::Tensor>>& ts, const char* op) {
  TORCH_CHECK_VALUE(!ts.empty(), "ringzero ", op, ": got an empty tensor list");
  return first(ts[0], op);
}
}  // namespace

c10::intrusive_ptr<c10d::Work> RingzeroBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceOptions& opts) {
  auto* inner = route(first(tensors, "allreduce_sparse").device(), "allreduce_sparse", false);
  return track(inner->allreduce_sparse(tensors, opts));
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  return track(route(first(inputs, "allgather_coalesced").device(), "allgather_coalesced", false)
      ->allgather_coalesced(outputs, inputs, opts));
}

void RingzeroBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // gloo's monitored barrier names the ranks that did not arrive; that is what the caller wants.
  count(false, c10::DeviceType::CPU, "monitoredBarrier");
  cpu_fallback_->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace ringzero
