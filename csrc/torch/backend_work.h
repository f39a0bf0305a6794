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

  // Called once, on the worker thread. The future completes first so that its callbacks have run
  // (or are running) by the time wait() returns, as with ProcessGroupGloo.
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

  // Receives from any source: the sender's group rank, set by the worker before complete().
  void set_source_rank(int rank) { source_rank_ = rank; }
  int sourceRank() const override {
    TORCH_CHECK(source_rank_ >= 0, "ringzero: sourceRank() is known only for a completed receive from any source");
    return source_rank_;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      // Not unbounded: every shared-memory wait ends in a CommTimeout after the op's timeout.
      cv_.wait(lock, [&] { return completed_; });
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

// Runs submitted tasks one at a time, in submission order, on one lazily started thread. Every rank
// submits the same collectives in the same order, so the shared-memory sequence stays matched.
class SerialExecutor {
 public:
  SerialExecutor() = default;
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;
  ~SerialExecutor() { stop(); }

  void submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(!stopped_, "ringzero backend was shut down; create a new process group");
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(std::move(task));
    cv_.notify_one();
  }

  // Runs what is queued, then joins the thread. Later submits fail.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopped and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // tasks catch their own errors and hand them to their Work
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace ringzero
