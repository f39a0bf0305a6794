// The CPU grid's streams and events against CUDA's documented semantics (CPU grid only): in-order
// queues, cudaStreamWaitEvent on the record current at the call, an event never recorded, the legacy
// default stream's implicit edges (and non-blocking streams' exemption), cudaEventQuery, a cudaMemcpy
// to the host complete on return, cudaStreamDestroy finishing its queue. The reference is the order
// the semantics impose: work held behind a gate that the host opens must not have run before it opens.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda_test_util.h"

using namespace ringzero::test;
using ringzero::cpu_grid::enqueue;

namespace {

// A gate the host opens; work queued behind it waits at most 10 s (a test bug, not a hang).
struct Gate {
  std::atomic<bool> open{false};
  void wait() const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!open.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
};

// Time for work that is free to run to have run, had nothing held it (on 2 busy cores, generous).
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

// Whether `flag` becomes true within 10 s.
bool eventually(const std::atomic<bool>& flag) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!flag.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return flag.load();
}

void in_order_and_wait_event() {
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t e;
  CUDA_OK(cudaEventCreate(&e));
  Gate gate;
  std::vector<int> order;  // written by a's worker only, read after a sync
  std::atomic<int> seen{-1};
  enqueue(a, [&] { gate.wait(); order.push_back(1); });
  enqueue(a, [&] { order.push_back(2); });
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  enqueue(b, [&] { seen.store(static_cast<int>(order.size())); });
  settle();
  CHECK(cudaEventQuery(e) == cudaErrorNotReady, "an event behind a closed gate is ready");
  CHECK(seen.load() == -1, "stream b ran past cudaStreamWaitEvent before the event's work ran");
  gate.open = true;
  CUDA_OK(cudaEventSynchronize(e));
  CHECK(cudaEventQuery(e) == cudaSuccess, "an event whose work ran is not ready");
  CUDA_OK(cudaStreamSynchronize(b));
  CHECK(seen.load() == 2, "stream b saw %d items of stream a, want 2", seen.load());
  CHECK(order == std::vector<int>({1, 2}), "stream a ran its items out of order");
  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
}

// The wait takes the record current at the call: a later record elsewhere does not release it, and an
// event never recorded is complete at once.
void wait_takes_the_record_of_the_call() {
  cudaStream_t a, b, c;
  for (cudaStream_t* s : {&a, &b, &c}) CUDA_OK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  cudaEvent_t e, never;
  CUDA_OK(cudaEventCreate(&e));
  CUDA_OK(cudaEventCreate(&never));
  Gate gate;
  std::atomic<bool> b_ran{false}, c_ran{false};
  enqueue(a, [&] { gate.wait(); });
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  enqueue(b, [&] { b_ran = true; });
  CUDA_OK(cudaEventRecord(e, c));  // the event's latest record is now c's, which completes at once
  CUDA_OK(cudaStreamWaitEvent(c, never, 0));
  enqueue(c, [&] { c_ran = true; });
  CUDA_OK(cudaStreamSynchronize(c));
  CHECK(c_ran.load(), "a wait on an event never recorded held the stream");
  CHECK(cudaEventQuery(e) == cudaSuccess, "the event's latest record (on c) is not complete");
  settle();
  CHECK(!b_ran.load(), "stream b was released by a record made after its cudaStreamWaitEvent");
  gate.open = true;
  CUDA_OK(cudaStreamSynchronize(b));
  CHECK(b_ran.load(), "stream b never ran");
  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaEventDestroy(never));
  for (cudaStream_t s : {a, b, c}) CUDA_OK(cudaStreamDestroy(s));
}

// Legacy stream work waits for a blocking stream's earlier work; a non-blocking stream's does not
// hold it; a blocking stream's later work waits for the legacy stream's.
void legacy_stream_edges() {
  cudaStream_t blocking, free_running;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamCreateWithFlags(&free_running, cudaStreamNonBlocking));
  Gate hold_free, hold_blocking, hold_legacy;
  std::atomic<bool> legacy_ran{false}, blocking_after{false}, free_done{false};
  enqueue(free_running, [&] {
    hold_free.wait();
    free_done = true;
  });
  enqueue(nullptr, [&] { legacy_ran = true; });
  CUDA_OK(cudaStreamSynchronize(nullptr));
  CHECK(legacy_ran.load(), "the legacy stream did not run");
  CHECK(!free_done.load(), "the legacy stream waited for a non-blocking stream");
  enqueue(blocking, [&] { hold_blocking.wait(); });
  legacy_ran = false;
  enqueue(nullptr, [&] { legacy_ran = true; hold_legacy.wait(); });
  enqueue(blocking, [&] { blocking_after = true; });
  settle();
  CHECK(!legacy_ran.load(), "legacy stream work ran before a blocking stream's earlier work");
  hold_blocking.open = true;
  CHECK(eventually(legacy_ran), "legacy stream work did not run after the blocking stream's");
  settle();
  CHECK(!blocking_after.load(), "a blocking stream's work ran before the legacy stream's earlier work");
  hold_legacy.open = true;
  CUDA_OK(cudaStreamSynchronize(blocking));
  CHECK(blocking_after.load(), "the blocking stream's last work never ran");
  hold_free.open = true;
  CUDA_OK(cudaStreamDestroy(blocking));
  CUDA_OK(cudaStreamDestroy(free_running));
}

// A device-to-host cudaMemcpy returns complete and after earlier legacy-stream work; cudaStreamDestroy
// lets queued work finish.
void memcpy_and_destroy() {
  DevBuf d(4);
  int32_t v = 0;
  Gate gate;
  enqueue(nullptr, [&] { gate.wait(); });
  CUDA_OK(cudaMemset(d.p, 0x11, 4));
  std::thread opener([&] {
    settle();
    gate.open = true;
  });
  CUDA_OK(cudaMemcpy(&v, d.p, 4, cudaMemcpyDeviceToHost));
  CHECK(v == 0x11111111, "cudaMemcpy to the host returned %#x, want 0x11111111", static_cast<unsigned>(v));
  opener.join();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i)
    enqueue(s, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ++ran;
    });
  CUDA_OK(cudaStreamDestroy(s));
  CHECK(ran.load() == 3, "cudaStreamDestroy returned with %d of 3 items run", ran.load());
}

}  // namespace

int main() {
  in_order_and_wait_event();
  wait_takes_the_record_of_the_call();
  legacy_stream_edges();
  memcpy_and_destroy();
  return finish();
}
