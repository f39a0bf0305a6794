// The CPU grid's runtime API ([Note: the CPU grid's execution model] in grid.h): the subset of CUDA's
// that layer 2, layer 3's loopback driver and the C++ tests use, over host memory. Every stream is an
// asynchronous in-order queue with a worker thread of its own; an event is a marker in such a queue;
// a stream under capture records its work into a graph instead.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
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

// ---- device memory ([Note: device memory on the CPU grid] in grid.h) ------------------------------

// Each cudaMalloc is a shared anonymous mapping of its own (so that IPC can map its pages again
// elsewhere); every live one, and every open IPC mapping, is closed to every thread from a host
// synchronisation that finds no device work running until a stream's worker starts its next item.
struct Allocation {
  char* base = nullptr;
  size_t bytes = 0;   // as asked
  size_t mapped = 0;  // whole pages
  uint64_t owner = 0;                // the process that allocated it
  bool freed = false;                // cudaFree'd; the record stays while peers hold mappings
  bool base_mapped = true;           // the owner's addresses still mapped (under TSan: until the last close)
  std::map<uint64_t, char*> opened;  // process -> its open mapping
};

// For the SIGSEGV handler, which may not lock: the address ranges the grid made inaccessible, in a
// fixed table of atomics (a slot is free when its end is 0).
enum class Kind : int { Device = 1, Ipc = 2, ClosedIpc = 3 };
constexpr int kRanges = 1 << 14;
struct Range {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<int> kind{0};
  std::atomic<size_t> bytes{0};
};
Range g_ranges[kRanges];

void track(const char* p, size_t mapped, size_t bytes, Kind kind) {
  for (Range& r : g_ranges) {
    if (r.end.load(std::memory_order_relaxed) != 0) continue;
    r.begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_relaxed);
    r.kind.store(static_cast<int>(kind), std::memory_order_relaxed);
    r.bytes.store(bytes, std::memory_order_relaxed);
    r.end.store(reinterpret_cast<uintptr_t>(p) + mapped, std::memory_order_release);
    return;
  }  // table full: the fault is still a fault, just not named
}
void untrack(const char* p) {
  for (Range& r : g_ranges)
    if (r.end.load(std::memory_order_relaxed) != 0 && r.begin.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(p))
      r.end.store(0, std::memory_order_release);
}
[[maybe_unused]] void retrack(const char* p, Kind kind) {
  for (Range& r : g_ranges)
    if (r.end.load(std::memory_order_relaxed) != 0 && r.begin.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(p))
      r.kind.store(static_cast<int>(kind), std::memory_order_relaxed);
}

struct sigaction g_previous_segv;

void say(const char* s) {
  ssize_t ignored = write(2, s, std::strlen(s));
  (void)ignored;
}

void on_segv(int sig, siginfo_t* info, void* ctx) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Range& r : g_ranges) {
    const uintptr_t end = r.end.load(std::memory_order_acquire);
    const uintptr_t begin = r.begin.load(std::memory_order_relaxed);
    if (end == 0 || at < begin || at >= end) continue;
    char msg[512];
    switch (static_cast<Kind>(r.kind.load(std::memory_order_relaxed))) {
      case Kind::Device:
      case Kind::Ipc:
        std::snprintf(msg, sizeof msg,
                      "ringzero cpu_grid: host code touched device memory at %p (%s of %zu bytes at %p) while no "
                      "device work ran; on a GPU this is a fault or garbage: copy with cudaMemcpy, or use "
                      "cudaHostAlloc'd memory\n",
                      info->si_addr, static_cast<Kind>(r.kind.load()) == Kind::Ipc ? "an IPC mapping" : "a cudaMalloc",
                      r.bytes.load(std::memory_order_relaxed), reinterpret_cast<void*>(begin));
        break;
      case Kind::ClosedIpc:
        std::snprintf(msg, sizeof msg,
                      "ringzero cpu_grid: %p is in an IPC mapping (%zu bytes at %p) that cudaIpcCloseMemHandle closed\n",
                      info->si_addr, r.bytes.load(std::memory_order_relaxed), reinterpret_cast<void*>(begin));
        break;
    }
    say(msg);
    _exit(86);
  }
  // Not the grid's: whatever handled it before (a sanitizer's report), or the default crash.
  if (g_previous_segv.sa_flags & SA_SIGINFO) {
    if (g_previous_segv.sa_sigaction) return g_previous_segv.sa_sigaction(sig, info, ctx);
  } else if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
    return g_previous_segv.sa_handler(sig);
  }
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now takes the default action
}

struct Memory {
  std::mutex mu;
  std::map<uint64_t, Allocation> allocs;  // by serial, until freed and no longer opened anywhere
  std::map<char*, uint64_t> live;          // a live allocation's base -> its serial
  std::map<char*, uint64_t> openings;      // an open IPC mapping (its own addresses) -> the serial
  int working = 0;                         // stream items running now
  bool open = false;                       // device memory accessible (from the first item after a settle)
  uint64_t serials = 0;
  Memory() {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
  }
  int prot() const { return open ? PROT_READ | PROT_WRITE : PROT_NONE; }
  void protect_all() {
    for (auto& [serial, a] : allocs)
      if (a.base_mapped) mprotect(a.base, a.mapped, prot());
    for (auto& [view, serial] : openings) mprotect(view, allocs.at(serial).mapped, prot());
  }
};
Memory& memory() {
  static auto* m = new Memory;  // never destroyed: workers may run while the process exits
  return *m;
}

// Device work (a stream item) running: device memory opens for it, and stays open until a host
// synchronisation finds the device idle (settle_device_memory). Closing at every item's end would be
// sure a little earlier at a cost of two mprotect calls per allocation per item; a host access between
// the end of device work and the host's wait for it is not caught either way on a busy grid.
struct DeviceWork {
  DeviceWork() {
    Memory& m = memory();
    std::lock_guard<std::mutex> lock(m.mu);
    ++m.working;
    if (!m.open) {
      m.open = true;
      m.protect_all();
    }
  }
  ~DeviceWork() {
    Memory& m = memory();
    std::lock_guard<std::mutex> lock(m.mu);
    --m.working;
  }
};

// At the end of a host synchronisation: if no device work runs, device memory closes to the host.
void settle_device_memory() {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.working == 0 && m.open) {
    m.open = false;
    m.protect_all();
  }
}

// The IPC processes: an explicit id, or one of each host thread's own (above every explicit one).
thread_local uint64_t t_process = 0;
std::atomic<uint64_t> g_thread_processes{uint64_t{1} << 48};
uint64_t current_process() {
  thread_local const uint64_t own = g_thread_processes.fetch_add(1);
  return t_process ? t_process : own;
}

struct Handle {
  char magic[8];
  uint64_t serial;
};
constexpr char kHandleMagic[8] = "rzgrid";

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
    if (work) {
      DeviceWork open_device_memory;
      work();
    }
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
  {
    std::condition_variable cv;
    std::unique_lock<std::mutex> lock(runtime().mu);
    if (const MarkerPtr m = s->tail) wait_done(lock, *m, cv, what);
  }
  settle_device_memory();
}

}  // namespace

namespace ringzero::cpu_grid {

void set_process(uint64_t id) { t_process = id; }

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
    case cudaErrorDeviceUninitialized: return "invalid device context (CPU grid)";
    case cudaErrorMapBufferObjectFailed: return "mapping of buffer object failed (CPU grid)";
    case cudaErrorAlreadyMapped: return "resource already mapped (CPU grid)";
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
  lock.unlock();
  settle_device_memory();
  return cudaSuccess;
}

// Fresh device memory holds garbage: a pattern, so a read of what nobody wrote shows.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes ? bytes + page - 1 : page) / page * page;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return record_error(cudaErrorMemoryAllocation);
  std::memset(base, 0xa5, mapped);
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const uint64_t serial = ++m.serials;
  Allocation& a = m.allocs[serial];
  a.base = static_cast<char*>(base);
  a.bytes = bytes;
  a.mapped = mapped;
  a.owner = current_process();
  m.live[a.base] = serial;
  track(static_cast<char*>(base), mapped, bytes, Kind::Device);
  mprotect(base, mapped, m.prot());
  *p = base;
  return cudaSuccess;
}
// CUDA's cudaFree synchronises the device first, so queued work never touches freed memory. The pages
// live on in peers' open mappings, as a GPU's do (CUDA calls freeing them first undefined).
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  cudaDeviceSynchronize();
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.live.find(static_cast<char*>(p));
  if (it == m.live.end()) return record_error(cudaErrorInvalidValue);  // not a live cudaMalloc base
  Allocation& a = m.allocs.at(it->second);
  a.freed = true;
  const uint64_t serial = it->second;
  m.live.erase(it);
#if defined(__SANITIZE_THREAD__)
  if (!a.opened.empty()) return cudaSuccess;  // the peers' mappings are these addresses: the last close unmaps
#endif
  untrack(a.base);
  munmap(a.base, a.mapped);  // the peers' own mappings hold the pages on
  a.base_mapped = false;
  if (a.opened.empty()) m.allocs.erase(serial);
  return cudaSuccess;
}
// Pinned host memory: host memory, readable by the host and (through the same pointer) by kernels.
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return record_error(cudaErrorMemoryAllocation);
  std::memset(*p, 0xa5, bytes);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  cudaDeviceSynchronize();
  std::free(p);
  return cudaSuccess;
}
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
  lock.unlock();
  settle_device_memory();
  return cudaSuccess;
}
// A record still queued keeps its marker: destroying the event at once after a wait on it is legal.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(runtime().mu);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.live.find(static_cast<char*>(p));
  if (it == m.live.end()) return record_error(cudaErrorInvalidValue);  // only a live allocation's base
  Handle handle{};
  std::memcpy(handle.magic, kHandleMagic, sizeof handle.magic);
  handle.serial = it->second;
  std::memset(h, 0, sizeof *h);
  std::memcpy(h->reserved, &handle, sizeof handle);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned) {
  Handle handle;
  std::memcpy(&handle, h.reserved, sizeof handle);
  if (std::memcmp(handle.magic, kHandleMagic, sizeof handle.magic) != 0) return record_error(cudaErrorInvalidValue);
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.allocs.find(handle.serial);
  if (it == m.allocs.end() || it->second.freed) return record_error(cudaErrorMapBufferObjectFailed);
  Allocation& a = it->second;
  const uint64_t me = current_process();
  if (a.owner == me) return record_error(cudaErrorDeviceUninitialized);
  if (a.opened.count(me)) return record_error(cudaErrorAlreadyMapped);
#if defined(__SANITIZE_THREAD__)
  char* view = a.base;  // the allocation's own addresses ([Note] in grid.h: TSan keys races by address)
#else
  void* alias = mremap(a.base, 0, a.mapped, MREMAP_MAYMOVE);
  if (alias == MAP_FAILED) return record_error(cudaErrorMapBufferObjectFailed);
  char* view = static_cast<char*>(alias);
  mprotect(view, a.mapped, m.prot());
  track(view, a.mapped, a.bytes, Kind::Ipc);
  m.openings[view] = it->first;
#endif
  a.opened[me] = view;
  *p = view;
  return cudaSuccess;
}
// Closes this process's mapping. Its addresses stay reserved and inaccessible, so a later use faults
// (never a new allocation that happened to land there); an allocation freed while opened goes with
// its last mapping.
cudaError_t cudaIpcCloseMemHandle(void* p) {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const uint64_t me = current_process();
  for (auto it = m.allocs.begin(); it != m.allocs.end(); ++it) {
    Allocation& a = it->second;
    auto mine = a.opened.find(me);
    if (mine == a.opened.end() || mine->second != p) continue;
    a.opened.erase(mine);
#if !defined(__SANITIZE_THREAD__)
    mmap(p, a.mapped, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    retrack(static_cast<char*>(p), Kind::ClosedIpc);
    m.openings.erase(static_cast<char*>(p));
#endif
    if (a.freed && a.opened.empty()) {
      if (a.base_mapped) {  // TSan: the owner freed it while this mapping (its own addresses) was open
        untrack(a.base);
        munmap(a.base, a.mapped);
      }
      m.allocs.erase(it);
    }
    return cudaSuccess;
  }
  return record_error(cudaErrorInvalidValue);  // not a mapping this process opened (or closed already)
}
