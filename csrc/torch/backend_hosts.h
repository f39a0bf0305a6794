// The backend's communicator for a CPU group that spans hosts ([Note: one engine behind every door],
// docs/design.md): it speaks ShmComm's vocabulary (the op bodies of backend_ops.cpp are written once
// against it) and hands each collective to the engine its Python creator made (HostsEngine in
// python/ringzero/comm/backend.py): the transport ringzero.* runs for the same layout, from
// comm/transports.py's pick_transport. Runs on the backend's worker thread, in call order; the engine
// call takes the GIL itself (backend_bindings.cpp).
#pragma once
#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/types.h"
#include "dtype_map.h"

namespace ringzero {

// engine(op, tensors, args): see HostsEngine's docstring for what each op takes. Raises (as a C++
// exception: CommTimeoutError, CollectiveMismatchError or CommError) what the engine raised. The CUDA
// lane's engine across hosts has this form (backend_cuda.cpp).
using HostsEngine = std::function<void(const std::string& op, const std::vector<at::Tensor>& tensors,
                                       const std::vector<int64_t>& args)>;

// [Note: the engine's deferred tail]
// Stock DDP hands its buckets over one all-reduce at a time, and across hosts each pipelined all-reduce
// ends with its last segment's all-gather inside the host, after that segment came off the link; the next
// call's first reduce-scatter inside the host comes only after it, so the link idles between the calls
// (3-6 ms per bucket boundary in the lab, benchmarks/RESULTS.md). When another op is already queued
// behind a pipelined all-reduce on every local rank, the engine returns with that last segment still
// to finish (its "tail"), and the next op runs it: a pipelined all-reduce after its own first segment
// is on the link, any other op before it starts. The call's Work completes when the tail has run
// (DeferredCall::complete), never earlier. Whether to defer is voted inside the host (the engine's
// in-host steps must run in one order on every local rank; comm/transports.py Hierarchical), and the
// vote counts only where another op is queued, so the tail never waits for an op that may not come. As a
// guard against a bug in that chain, a wait() on a handed-off Work raises once four timeouts and 10 s
// have passed since the hand-off (RingzeroWork::hand_off, backend_work.h).

// What the backend hands HostsComm for the task it runs (run()): whether another op is queued behind it,
// how its Work completes, and how to tell the task's wrapper that the Work completes later.
struct HostsTask {
  std::function<bool()> next_queued;
  std::function<void(std::exception_ptr)> complete;  // completes the op's Work (once)
  std::function<void()> hand_off;
  bool tail_may_wait = false;  // CallOpts::tail_may_wait: else run() runs a pending tail before the body
};

struct DeferredCall {
  HostsTask task;         // the task of the all-reduce: next_queued() and complete() are the engine's
  bool deferred = false;  // set by the engine, on the thread running the call, as the last thing it does
  bool completed = false;
};

// The CPU engine's form: as HostsEngine, with the DeferredCall of an all-reduce that may defer its tail
// (null for every other call, and for an all-reduce whose result the backend still copies out).
using HostsEngineCall = std::function<void(const std::string& op, const std::vector<at::Tensor>& tensors,
                                           const std::vector<int64_t>& args, const std::shared_ptr<DeferredCall>& call)>;

class HostsComm {
 public:
  HostsComm(HostsEngineCall engine, int rank, int size) : engine_(std::move(engine)), rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  explicit operator bool() const { return static_cast<bool>(engine_); }

  // Every task of the backend's worker that runs on this communicator runs its body through here: a tail
  // left by the task before runs first, unless the task says its body reads no tensor before its engine
  // call (a contiguous all-reduce, whose engine call runs the tail after its first segment); one that no
  // engine call of the body ran runs after it, also when the body threw ([Note: the engine's deferred
  // tail]). `task` is empty for a task whose Work never defers (a barrier).
  // Running the tail first matters wherever a body copies a tensor before its engine call (a coalesced
  // op's concatenation, a strided tensor's contiguous copy, a premultiplied copy, a non-root's copy for
  // reduce): that copy would read the memory the tail has yet to write (tests/backend/test_backend_fuzz.py
  // found it: an all-reduce, then all_reduce_coalesced of the same tensor, left the last segment as the
  // first call's inputs' sum).
  template <class Body>
  void run(HostsTask task, Body&& body) {
    const bool tail_may_wait = task.tail_may_wait;
    task_ = std::move(task);
    if (!tail_may_wait) run_pending_tail();
    calls_at_run_ = calls_;
    try {
      body();
    } catch (...) {
      settle();
      throw;
    }
    settle();
  }

  void all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, AllReduceAlgo) {
    at::Tensor x = view(out, count, dtype);
    if (in != out) x.copy_(view(const_cast<void*>(in), count, dtype));
    call("all_reduce", {x}, {static_cast<int64_t>(op)});
  }
  // An all-reduce in place whose Work completes with it, with nothing left to do after it: the engine may
  // return before its tail has run, which completes the Work later.
  void all_reduce_deferrable(void* buf, size_t count, DType dtype, ReduceOp op) {
    if (!task_.complete) return all_reduce(buf, buf, count, dtype, op, AllReduceAlgo::Auto);
    auto deferred = std::make_shared<DeferredCall>();
    deferred->task = task_;
    call("all_reduce", {view(buf, count, dtype)}, {static_cast<int64_t>(op)}, deferred);
    if (deferred->deferred) task_.hand_off();
  }
  void reduce_scatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
    call("reduce_scatter", {view(out, count_per_rank, dtype), view(const_cast<void*>(in), count_per_rank * size_, dtype)},
            {static_cast<int64_t>(op)});
  }
  void all_gather(const void* in, void* out, size_t count, DType dtype) {
    call("all_gather", {view(out, count * size_, dtype), view(const_cast<void*>(in), count, dtype)}, {});
  }
  void all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    call("all_gather", {view(out, total, dtype), view(const_cast<void*>(in), counts.at(rank_), dtype)},
            std::vector<int64_t>(counts.begin(), counts.end()));
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) {
    call("broadcast", {view(buf, count, dtype)}, {root});
  }
  // Only root's output is defined (torch's reduce); the others reduce a copy, so that their input is
  // left as it was whatever the ring does with its buffer.
  void reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) {
    at::Tensor src = view(const_cast<void*>(in), count, dtype);
    at::Tensor x = rank_ == root ? view(out, count, dtype) : src.clone();
    if (rank_ == root && in != out) x.copy_(src);
    call("reduce", {x}, {root, static_cast<int64_t>(op)});
  }
  void all_to_all_v(const void* in, void* out, const std::vector<size_t>& send_counts,
                    const std::vector<size_t>& recv_counts, DType dtype) {
    const size_t sent = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
    const size_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
    std::vector<int64_t> args(send_counts.begin(), send_counts.end());
    args.insert(args.end(), recv_counts.begin(), recv_counts.end());
    call("all_to_all", {view(out, received, dtype), view(const_cast<void*>(in), sent, dtype)}, args);
  }
  // Only root's out (size_ * count elements) is written; the others pass an empty one.
  void gather(const void* in, void* out, size_t count, DType dtype, int root) {
    call("gather", {view(out, rank_ == root ? count * size_ : 0, dtype), view(const_cast<void*>(in), count, dtype)},
         {root});
  }
  // Only root's in (size_ * count elements) is read.
  void scatter(const void* in, void* out, size_t count, DType dtype, int root) {
    call("scatter", {view(out, count, dtype), view(const_cast<void*>(in), rank_ == root ? count * size_ : 0, dtype)},
         {root});
  }
  // The root's side as its own blocks (count elements each, one per rank, received or sent in place: no
  // copy of the whole buffer); the others call gather and scatter above. The engine gets the tensors in the
  // same order as there, the root's blocks in place of its one buffer: a gather's outputs, then its input;
  // a scatter's output, then its inputs.
  void gather_blocks(const void* in, const std::vector<void*>& outs, size_t count, DType dtype, int root) {
    std::vector<at::Tensor> ts;
    for (void* o : outs) ts.push_back(view(o, count, dtype));
    ts.push_back(view(const_cast<void*>(in), count, dtype));
    call("gather", ts, {root});
  }
  void scatter_blocks(const std::vector<void*>& ins, void* out, size_t count, DType dtype, int root) {
    std::vector<at::Tensor> ts{view(out, count, dtype)};
    for (void* i : ins) ts.push_back(view(i, count, dtype));
    call("scatter", ts, {root});
  }
  void barrier() { call("barrier", {}, {}); }

 private:
  // After a task's body: runs a tail left before the task that no engine call of the body ran.
  void settle() noexcept {
    task_ = {};
    if (calls_ == calls_at_run_) run_pending_tail();
  }
  void run_pending_tail() noexcept {
    if (!pending_) return;
    try {
      call("flush", {}, {});  // the tail's own failure completes its Work with the error
    } catch (...) {
    }
  }

  // Every engine call runs a tail left before it; afterwards one is pending only if this call deferred.
  void call(const std::string& op, const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& args,
            const std::shared_ptr<DeferredCall>& deferred = nullptr) {
    ++calls_;
    pending_ = false;
    engine_(op, tensors, args, deferred);
    pending_ = deferred && deferred->deferred;
  }

  static at::Tensor view(void* p, size_t count, DType dtype) {
    return at::from_blob(p, {static_cast<int64_t>(count)}, at::TensorOptions().dtype(scalar_type_of(dtype)));
  }

  HostsEngineCall engine_;
  int rank_, size_;
  HostsTask task_;            // the task running now (run()), else empty
  uint64_t calls_ = 0;        // engine calls so far
  uint64_t calls_at_run_ = 0;  // calls_ when the task's body began
  bool pending_ = false;      // the last engine call returned with its tail to run
};

}  // namespace ringzero
