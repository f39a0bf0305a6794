// The CPU grid's runtime API ([Note: the CPU grid's execution model] in grid.h): the subset of CUDA's
// that layer 2, layer 3's loopback driver and the C++ tests use, over host memory. Every stream is an
// asynchronous in-order queue with a worker thread of its own; an event is a marker in such a queue;
// a stream under capture records its work into a graph instead.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cuda/cpu_grid/grid.h"

struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};

namespace {

// Done once the queue item it belongs to has run, and so every item queued before it on that stream.
// Who waits registers its condition variable; the item's completion wakes exactly those.
struct Marker {
  bool done = false;
  std::vector<std::condition_variable*> waiters;
};
using MarkerPtr = std::shared_ptr<Marker>;

struct Item {
  std::function<void()> work;    // empty for an event record or wait
  std::vector<MarkerPtr> after;  // the item runs once all of these are done
  MarkerPtr done;
};

}  // namespace

// Everything but `capture` (only the capturing host thread touches it) is guarded by runtime().mu.
struct CUstream_st {
  unsigned flags = cudaStreamDefault;
  bool legacy = false;  // a host thread's default stream (stream 0)
  uint64_t serial = 0;
  CUgraph_st* capture = nullptr;  // non-null while capturing
  std::deque<Item> queue;         // the front item is the one running or waiting
  MarkerPtr tail;                 // the last item queued (null: none yet)
  bool closing = false;           // the worker ends once the queue is empty
  std::condition_variable wake;   // an item queued, closing set, or a marker the front waits for done
  std::thread worker;
};
struct CUevent_st {
  MarkerPtr last;  // the most recent record (null: never recorded, which counts as complete)
};

namespace {

// How long a host synchronisation or a queued wait may take before the grid aborts naming it: far
// beyond any test's kernel, so that only a hang (a kernel that never ends, a wait on work that never
// comes) reaches it.
constexpr auto kSyncTimeout = std::chrono::seconds(300);

struct Runtime {
  std::mutex mu;
  std::set<CUstream_st*> streams;  // every live stream, the host threads' legacy streams included
  uint64_t serials = 0;
};
// Never destroyed: a legacy stream's worker may still run while the process exits.
Runtime& runtime() {
  static auto* r = new Runtime;
  return *r;
}

thread_local cudaError_t t_last_error = cudaSuccess;

[[noreturn]] void sync_timed_out(const char* what) {
  std::fprintf(stderr,
               "ringzero cpu_grid: %s waited more than %lld s: a kernel that never ends, or a stream waiting for "
               "an event whose stream never gets there\n",
               what, static_cast<long long>(kSyncTimeout.count()));
  std::fflush(stderr);
  std::abort();
}

// Waits (runtime().mu held in `lock`) until `m` is done, woken through `cv`.
void wait_done(std::unique_lock<std::mutex>& lock, Marker& m, std::condition_variable& cv, const char* what) {
  if (m.done) return;
  m.waiters.push_back(&cv);
  const auto deadline = std::chrono::steady_clock::now() + kSyncTimeout;
  while (!m.done)
    if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !m.done) sync_timed_out(what);
}

void complete(Marker& m) {
  m.done = true;
  for (std::condition_variable* cv : m.waiters) cv->notify_all();
  m.waiters.clear();
}

bool blocking(const CUstream_st* s) { return !s->legacy && !(s->flags & cudaStreamNonBlocking); }

// Queues an item on `s` (runtime().mu held) and returns its marker. The legacy default stream's
// implicit edges: its work waits for the work queued before on every blocking stream, and a blocking
// stream's work for the work queued before on the legacy streams (non-blocking streams are exempt).
MarkerPtr push(CUstream_st* s, std::function<void()> work, std::vector<MarkerPtr> after) {
  Item item{std::move(work), std::move(after), std::make_shared<Marker>()};
  if (s->legacy || blocking(s))
    for (CUstream_st* t : runtime().streams)
      if (t != s && (s->legacy ? blocking(t) : t->legacy) && t->tail && !t->tail->done) item.after.push_back(t->tail);
  s->tail = item.done;
  s->queue.push_back(std::move(item));
  s->wake.notify_all();
  return s->tail;
}

// The worker of a stream: runs its items in order, each once the markers it waits for are done. With
// chaos on it pauses a random while before each item, so that work on other streams gets ahead of it
// and an ordering that rests on timing rather than on an event shows.
void work_loop(CUstream_st* s) {
  std::mt19937_64 rng(ringzero::cpu_grid::chaos_seed() ^ (s->serial * 0x9e3779b97f4a7c15ull));
  std::unique_lock<std::mutex> lock(runtime().mu);
  for (;;) {
    s->wake.wait(lock, [&] { return !s->queue.empty() || s->closing; });
    if (s->queue.empty()) break;
    for (const MarkerPtr& m : s->queue.front().after) wait_done(lock, *m, s->wake, "a stream's cudaStreamWaitEvent");
    std::function<void()> work = std::move(s->queue.front().work);
    lock.unlock();
    if (ringzero::cpu_grid::chaos_seed()) {
      const uint64_t r = rng();
      if (r % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(r / 4 % 200));
      else if (r % 4 == 1) std::this_thread::yield();
    }
    if (work) work();
    lock.lock();
    const MarkerPtr done = std::move(s->queue.front().done);
    s->queue.pop_front();
    complete(*done);
  }
  if (s->legacy) {  // its host thread has exited: nobody joins this worker
    runtime().streams.erase(s);
    lock.unlock();
    s->worker.detach();
    delete s;
  }
}

CUstream_st* make_stream(unsigned flags, bool legacy) {
  auto* s = new CUstream_st;
  s->flags = flags;
  s->legacy = legacy;
  std::lock_guard<std::mutex> lock(runtime().mu);
  s->serial = ++runtime().serials;
  runtime().streams.insert(s);
  s->worker = std::thread(work_loop, s);
  return s;
}

// The legacy default stream of the calling host thread. One per host thread, not per process: on the
// grid a host thread stands for a process of its own (PeerComm's ranks, each launching on stream 0),
// and one shared queue would run one rank's kernel only after its peer's, which waits for it. At the
// thread's exit its stream finishes its queue and ends; nobody waits for that but a device sync.
struct LegacyStream {
  CUstream_st* s = nullptr;
  ~LegacyStream() {
    if (!s) return;
    std::lock_guard<std::mutex> lock(runtime().mu);
    s->closing = true;
    s->wake.notify_all();
  }
};
thread_local LegacyStream t_legacy;

CUstream_st* resolve(cudaStream_t s) {
  if (s) return s;
  if (!t_legacy.s) t_legacy.s = make_stream(cudaStreamDefault, true);
  return t_legacy.s;
}

// Waits on the host until the work queued on `s` so far has run.
void host_wait_stream(CUstream_st* s, const char* what) {
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(runtime().mu);
  if (const MarkerPtr m = s->tail) wait_done(lock, *m, cv, what);
}

}  // namespace

namespace ringzero::cpu_grid {

cudaError_t record_error(cudaError_t e) {
  t_last_error = e;
  return e;
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
  if (stream && stream->capture) {
    stream->capture->work.push_back(std::move(work));
    return cudaSuccess;
  }
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(runtime().mu);
  push(s, std::move(work), {});
  return cudaSuccess;
}

}  // namespace ringzero::cpu_grid

using ringzero::cpu_grid::enqueue;
using ringzero::cpu_grid::record_error;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error (CPU grid)";
    case cudaErrorInvalidValue: return "invalid argument (CPU grid)";
    case cudaErrorMemoryAllocation: return "out of memory (CPU grid)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (CPU grid)";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version (CPU grid)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (CPU grid)";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch (CPU grid)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (CPU grid)";
    case cudaErrorNotReady: return "device not ready (CPU grid)";
  }
  return "unknown error (CPU grid)";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : record_error(cudaErrorInvalidValue); }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return record_error(cudaErrorInvalidValue);
  *v = ringzero::cpu_grid::multiprocessors();
  return cudaSuccess;
}
// Every stream's work queued so far, every host thread's legacy stream included.
cudaError_t cudaDeviceSynchronize() {
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(runtime().mu);
  std::vector<MarkerPtr> tails;
  for (CUstream_st* s : runtime().streams)
    if (s->tail) tails.push_back(s->tail);
  for (const MarkerPtr& m : tails) wait_done(lock, *m, cv, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  // Fresh device memory holds garbage: a pattern, so a read of what nobody wrote shows.
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return record_error(cudaErrorMemoryAllocation);
  std::memset(*p, 0xa5, bytes);
  return cudaSuccess;
}
// CUDA's cudaFree synchronises the device first, so queued work never touches freed memory.
cudaError_t cudaFree(void* p) {
  cudaDeviceSynchronize();
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
// The synchronous forms are work on the legacy stream. cudaMemset and a host-to-device or
// device-to-device cudaMemcpy return before the copy lands (a host source is taken at the call, as
// CUDA stages pageable memory); a copy to the host returns complete.
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  return enqueue(nullptr, [=] { std::memset(p, v, bytes); });
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s) {
  return enqueue(s, [=] { std::memset(p, v, bytes); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyHostToDevice) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    return enqueue(nullptr, [=] { std::memcpy(dst, staged->data(), bytes); });
  }
  enqueue(nullptr, [=] { std::memmove(dst, src, bytes); });
  if (kind != cudaMemcpyDeviceToDevice) host_wait_stream(resolve(nullptr), "cudaMemcpy");
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  return enqueue(s, [=] { std::memmove(dst, src, bytes); });
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = make_stream(flags, false);
  return cudaSuccess;
}
// The stream's queued work finishes first (CUDA lets it), then its worker ends.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return record_error(cudaErrorInvalidValue);
  host_wait_stream(s, "cudaStreamDestroy");
  {
    std::lock_guard<std::mutex> lock(runtime().mu);
    s->closing = true;
    s->wake.notify_all();
  }
  s->worker.join();
  {
    std::lock_guard<std::mutex> lock(runtime().mu);
    runtime().streams.erase(s);
  }
  delete s->capture;
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s && s->capture) return record_error(cudaErrorStreamCaptureUnsupported);
  host_wait_stream(resolve(s), "cudaStreamSynchronize");
  return cudaSuccess;
}
// The stream waits for the event's most recent record as of this call; later records do not move it.
// The grid's graphs are one stream's work in order: a cross-stream edge under capture is not modelled.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return record_error(cudaErrorInvalidValue);
  if (s && s->capture) return record_error(cudaErrorStreamCaptureUnsupported);
  CUstream_st* q = resolve(s);
  std::lock_guard<std::mutex> lock(runtime().mu);
  if (e->last && !e->last->done) push(q, {}, {e->last});
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (!s || s->capture) return record_error(cudaErrorInvalidValue);
  s->capture = new CUgraph_st;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  if (!s || !s->capture) return record_error(cudaErrorInvalidValue);
  *g = s->capture;
  s->capture = nullptr;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  *exec = new CUgraphExec_st{g->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  for (const auto& w : exec->work) enqueue(s, w);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
// A marker queued on the stream: the event completes when the stream's work before it has run.
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return record_error(cudaErrorInvalidValue);
  if (s && s->capture) return record_error(cudaErrorStreamCaptureUnsupported);
  CUstream_st* q = resolve(s);
  std::lock_guard<std::mutex> lock(runtime().mu);
  e->last = push(q, {}, {});
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return record_error(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(runtime().mu);
  return !e->last || e->last->done ? cudaSuccess : cudaErrorNotReady;  // not ready is no error to record
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return record_error(cudaErrorInvalidValue);
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(runtime().mu);
  if (const MarkerPtr m = e->last) wait_done(lock, *m, cv, "cudaEventSynchronize");
  return cudaSuccess;
}
// A record still queued keeps its marker: destroying the event at once after a wait on it is legal.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(runtime().mu);
  delete e;
  return cudaSuccess;
}
// One process: a handle carries the pointer (CPU-grid "ranks" are threads of this process).
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  std::memset(h, 0, sizeof *h);
  std::memcpy(h->reserved, &p, sizeof p);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned) {
  std::memcpy(p, h.reserved, sizeof *p);
  return *p ? cudaSuccess : record_error(cudaErrorInvalidValue);
}
cudaError_t cudaIpcCloseMemHandle(void*) { return cudaSuccess; }
