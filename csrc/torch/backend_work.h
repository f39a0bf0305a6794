// The asynchronous half of the c10d backend (layer 4): a Work whose completion also completes a
// torch Future (so DDP communication hooks can chain on it), and the one worker thread per backend
// that runs the shared-memory collectives in call order, as gloo's worker threads do.
#pragma once
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace ringzero {

// [Note: the caller runs its own collective]
// Runs submitted tasks one at a time, in submission order, on one lazily started thread, or on a thread
// that waits for one of them (help_until): every rank submits the same collectives in the same order,
// so the shared-memory sequence stays matched whoever runs them, as long as two never run at once.
// Why a waiter runs the op itself: handing it to the worker costs a wake-up of the worker, and one of
// the waiter when it ends (tens of us each on a VM), and the worker, which shares its core with the
// rank's compute, sleeps in every wait for a peer rather than spin (set_spin(false) in backend.cpp).
// A caller blocked in Work.wait() computes nothing, so it may spin: a blocking 4 KiB dist.all_reduce
// at 2 ranks went from 62.5 us to 11.0 us (benchmarks/RESULTS.md, "The swap-in door's own cost").
// The worker still starts every op as soon as it can (DDP's and FSDP's overlap need it); whoever pops
// a task first runs it, and a waiter that finds another thread running one waits as before.
class SerialExecutor {
 public:
  // What a Work keeps of its executor, so that it can help after the backend has returned it.
  struct State {
    std::mutex mu;
    std::condition_variable cv;                                   // the worker's: a task, or the end
    std::deque<std::pair<uint64_t, std::function<void()>>> queue;  // (ticket, task)
    uint64_t submitted = 0;                                       // tickets handed out, 1, 2, ...
    bool running = false;                                         // a task runs now (worker or waiter)
    bool stopped = false;
    std::atomic<int> waiters{0};                                  // threads blocked in a Work's wait()
  };

  SerialExecutor() : state_(std::make_shared<State>()) {}
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;
  ~SerialExecutor() { stop(); }

  const std::shared_ptr<State>& state() const { return state_; }

  // Queues task; returns its ticket.
  uint64_t submit(std::function<void()> task) {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    TORCH_CHECK(!s.stopped, "ringzero backend was shut down; create a new process group");
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    s.queue.emplace_back(++s.submitted, std::move(task));
    s.cv.notify_one();
    return s.submitted;
  }

  // Runs task on the calling thread at once if nothing is queued or running (so the order holds) and
  // returns true; false otherwise (then the caller queues it).
  bool run_if_idle(const std::function<void()>& task) {
    State& s = *state_;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.stopped || s.running || !s.queue.empty()) return false;
      s.running = true;
    }
    run_here(s, task);
    return true;
  }

  // Runs the tasks queued up to and including `ticket` on the calling thread, in order, while no other
  // thread runs one; returns when `ticket` has left the queue (run here or taken by another thread,
  // which the caller then waits for as usual). Runs nothing on a stopped executor.
  static void help_until(State& s, uint64_t ticket) {
    for (;;) {
      std::function<void()> task;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.stopped || s.running || s.queue.empty() || s.queue.front().first > ticket) return;
        task = std::move(s.queue.front().second);
        s.queue.pop_front();
        s.running = true;
      }
      run_here(s, task);
    }
  }

  // True on a thread running a task for its caller (run_if_idle, help_until): that caller is blocked on
  // the result.
  static bool& running_inline() {
    static thread_local bool flag = false;
    return flag;
  }

  // Runs what is queued, then joins the thread (and waits for a task a waiter still runs). Later
  // submits fail. Called from inside a task (a future's callback that shuts the backend down), it only
  // marks the executor stopped: the worker thread drains the queue once that task has ended.
  void stop() {
    State& s = *state_;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.stopped = true;
      s.cv.notify_all();
    }
    const bool inside_task = running_inline() || thread_.get_id() == std::this_thread::get_id();
    if (inside_task) return;
    if (thread_.joinable()) thread_.join();
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return !s.running; });
  }

 private:
  static void run_here(State& s, const std::function<void()>& task) {
    running_inline() = true;
    task();  // tasks catch their own errors and hand them to their Work
    running_inline() = false;
    std::lock_guard<std::mutex> lock(s.mu);
    s.running = false;
    if (s.stopped || !s.queue.empty()) s.cv.notify_all();  // the worker's turn, or a stop() waiting
  }

  void loop() {
    State& s = *state_;
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] { return !s.running && (s.stopped || !s.queue.empty()); });
        if (s.queue.empty()) return;  // stopped and drained
        task = std::move(s.queue.front().second);
        s.queue.pop_front();
        s.running = true;
      }
      task();  // tasks catch their own errors and hand them to their Work
      std::lock_guard<std::mutex> lock(s.mu);
      s.running = false;
      s.cv.notify_all();  // a stop() waiting for the last task
    }
  }

  std::shared_ptr<State> state_;
  std::thread thread_;
};

// What every Work of the backend carries: the tensors the collective writes, which are its future's
// value (a list of tensors, the type gloo's and NCCL's futures carry) and stay alive until completion;
// the future (CUDA-aware, on `devices`, for the CUDA lane); the sequence number.
class OutputsWork : public c10d::Work {
 public:
  OutputsWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq,
              std::vector<c10::Device> devices = {})
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                          std::move(devices))),
        seq_(seq) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }

 protected:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  uint64_t seq_;
};

// A shared-memory op (or a send/recv), completed by the worker thread that ran it.
class RingzeroWork : public OutputsWork {
 public:
  RingzeroWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq)
      : OutputsWork(rank, type, std::move(outputs), seq) {}

  // Called once, by the thread that ran the op (or, for an all-reduce whose tail was deferred, the one that ran
  // the tail: [Note: the engine's deferred tail], backend_hosts.h). The future completes first so that its callbacks have run
  // (or are running) by the time wait() returns, as with ProcessGroupGloo.
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

  // The task that ran it returned with its completion handed to a later task (the engine's deferred tail,
  // backend_hosts.h), which calls complete(); set by the task itself, before it returns. That task is queued
  // already and its waits each end after the backend's timeout, so only a bug in ringzero could leave the
  // Work uncompleted for long: a wait() without a timeout raises once `bound_s` has passed since.
  void hand_off(double bound_s) {
    std::lock_guard<std::mutex> lock(mutex_);
    handed_off_ = true;
    hand_off_bound_s_ = bound_s;
    hand_off_deadline_ = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(bound_s));
    cv_.notify_all();  // a wait() already blocked switches to the bound
  }
  bool handed_off() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return handed_off_;
  }

  // Receives from any source: the sender's group rank, set by the worker before complete().
  void set_source_rank(int rank) { source_rank_ = rank; }
  int sourceRank() const override {
    TORCH_CHECK(source_rank_ >= 0, "ringzero: sourceRank() is known only for a completed receive from any source");
    return source_rank_;
  }

  // The executor it was queued on and its ticket there, for a wait() that runs it (help_until).
  void set_helper(std::shared_ptr<SerialExecutor::State> state, uint64_t ticket) {
    helper_ = std::move(state);
    ticket_ = ticket;
  }
  // Whether a thread is blocked in wait() on a Work of this executor (its worker may then spin).
  static bool someone_waits(const SerialExecutor::State& s) { return s.waiters.load(std::memory_order_relaxed) > 0; }

  bool wait(std::chrono::milliseconds timeout) override {
    // With a timeout given to wait(), an op run here could not end at it: only the worker runs it then.
    if (helper_ && timeout == kNoTimeout) SerialExecutor::help_until(*helper_, ticket_);
    struct Waiting {  // counted while blocked below
      std::atomic<int>* n;
      explicit Waiting(std::atomic<int>* n) : n(n) { if (n) n->fetch_add(1); }
      ~Waiting() { if (n) n->fetch_sub(1); }
    } waiting(helper_ ? &helper_->waiters : nullptr);
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      // Not unbounded: every shared-memory wait ends in a CommTimeout after the op's timeout, and a Work whose
      // completion was handed to a later task waits at most its bound from then (hand_off).
      cv_.wait(lock, [&] { return completed_ || handed_off_; });
      if (!completed_ && !cv_.wait_until(lock, hand_off_deadline_, [&] { return completed_; }))
        TORCH_CHECK(false, "ringzero: ", c10d::opTypeToString(retrieveOpType()), " (sequence number ", seq_, ") on rank ",
                    rank_, " returned with its last segment left to the op after it ([Note: the engine's deferred "
                    "tail], csrc/torch/backend_hosts.h), and that segment has not run ", hand_off_bound_s_,
                    " s later, although every wait of the op running it ends sooner: a bug in ringzero; please "
                    "report it");
    } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
      // "Timed out waiting <n>ms" is the wording of gloo's timeouts, which callers match.
      TORCH_CHECK(false, "ringzero: Timed out waiting ", timeout.count(), "ms (given to Work.wait()) for ",
                  c10d::opTypeToString(retrieveOpType()), " (sequence number ", seq_, ") on rank ", rank_);
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
 private:
  std::atomic<int> source_rank_{-1};
  bool handed_off_ = false;  // under mutex_, as the two below
  double hand_off_bound_s_ = 0;
  std::chrono::steady_clock::time_point hand_off_deadline_;
  std::shared_ptr<SerialExecutor::State> helper_;
  uint64_t ticket_ = 0;
};

// What endCoalescing() returns ([Note: coalescing] in backend.h): one Work over the ops issued between
// startCoalescing() and endCoalescing(), ours and the inner backend's alike. Waiting waits for each in
// issue order (a CUDA part's wait orders the current stream after it, as that part's own wait does);
// its future completes with every part's output tensors once all parts have, or with the first error.
// (A part's future here completes on the CPU side; the CUDA-aware stream hand-off of the parts' own
// futures is not repeated for the combined one.)
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts)
      : c10d::Work(rank, c10d::OpType::COALESCED), parts_(std::move(parts)) {}

  bool isCompleted() override {
    for (auto& w : parts_) {
      if (!w->isCompleted()) return false;
    }
    return true;
  }
  bool isSuccess() const override {
    for (auto& w : parts_) {
      if (w->exception()) return false;
    }
    return true;
  }
  std::exception_ptr exception() const override {
    for (auto& w : parts_) {
      if (auto e = w->exception()) return e;
    }
    return nullptr;
  }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> all;
    for (auto& w : parts_) {
      auto r = w->result();
      all.insert(all.end(), r.begin(), r.end());
    }
    return all;
  }
  void synchronize() override {
    for (auto& w : parts_) w->synchronize();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : parts_) w->wait(timeout);
    return true;
  }
  uint64_t getSequencenumber() const override { return parts_.empty() ? 0 : parts_.back()->getSequencenumber(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (future_) return future_;
    if (parts_.size() == 1) return future_ = parts_[0]->getFuture();
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    if (parts_.empty()) {
      future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
      return future_;
    }
    // Counted by hand rather than with c10::collectAll, whose List of futures does not build against
    // torch 2.10's headers.
    struct Count {
      std::mutex mu;
      size_t left;
      bool ended = false;
    };
    auto count = std::make_shared<Count>();
    count->left = parts_.size();
    auto result = future_;
    auto parts = parts_;
    for (auto& w : parts_) {
      w->getFuture()->addCallback([count, result, parts](c10::ivalue::Future& part) {
        std::exception_ptr error;
        {
          std::lock_guard<std::mutex> lock(count->mu);
          if (count->ended) return;
          if (part.hasError()) {
            error = part.exception_ptr();
          } else if (--count->left > 0) {
            return;
          }
          count->ended = true;
        }
        if (error) {
          result->setError(error);
          return;
        }
        std::vector<at::Tensor> tensors;
        for (auto& p : parts) {
          auto r = p->result();
          tensors.insert(tensors.end(), r.begin(), r.end());
        }
        result->markCompleted(c10::IValue(tensors));
      });
    }
    return future_;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made at the first getFuture()
};

}  // namespace ringzero
