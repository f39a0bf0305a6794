// The CPU grid's executor and runtime ([Note: the CPU grid's execution model] in grid.h): blocks on OS
// threads, CUDA threads as fibers with a cooperative scheduler per block, optional chaos (random
// yields, stalls and fiber order), and the runtime API subset over host memory.
#include "cuda/cpu_grid/grid.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#define RINGZERO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RINGZERO_TSAN 1
#endif
#endif
#if defined(RINGZERO_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace ringzero::cpu_grid {

thread_local std::atomic<const Coords*> t_coords{nullptr};

namespace {

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

struct Settings {
  int sms = static_cast<int>(env_u64("RINGZERO_CPU_GRID_SMS", 64));
  std::atomic<uint64_t> chaos{env_u64("RINGZERO_CPU_GRID_CHAOS", 0)};
  std::atomic<unsigned> block_threads{static_cast<unsigned>(env_u64("RINGZERO_CPU_GRID_THREADS", 0))};
  std::atomic<uint64_t> launches{0};
};
Settings& settings() {
  static Settings s;
  return s;
}

// ---- context switching ------------------------------------------------------------------------------
// x86-64: a minimal switch of the callee-saved registers (plus mxcsr and the x87 control word); a few
// ns, where swapcontext makes a system call per switch. Elsewhere: ucontext.
#if defined(__x86_64__)
extern "C" void ringzero_cpu_grid_switch(void** save_sp, void* load_sp);
extern "C" void ringzero_cpu_grid_trampoline();
asm(R"(
.text
.globl ringzero_cpu_grid_switch
.type ringzero_cpu_grid_switch,@function
ringzero_cpu_grid_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size ringzero_cpu_grid_switch,.-ringzero_cpu_grid_switch
.globl ringzero_cpu_grid_trampoline
.type ringzero_cpu_grid_trampoline,@function
ringzero_cpu_grid_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
.size ringzero_cpu_grid_trampoline,.-ringzero_cpu_grid_trampoline
)");

struct Context {
  void* sp = nullptr;
};
void ctx_init(Context* c, char* stack, size_t bytes, void (*entry)(void*), void* arg) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 64);
  const uint32_t mxcsr = 0x1f80;
  const uint16_t fpucw = 0x037f;
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
  sp[1] = 0;                                       // r15
  sp[2] = 0;                                       // r14
  sp[3] = reinterpret_cast<uint64_t>(entry);       // r13
  sp[4] = reinterpret_cast<uint64_t>(arg);         // r12
  sp[5] = 0;                                       // rbx
  sp[6] = 0;                                       // rbp
  sp[7] = reinterpret_cast<uint64_t>(&ringzero_cpu_grid_trampoline);
  c->sp = sp;
}
inline void ctx_switch(Context* from, Context* to) { ringzero_cpu_grid_switch(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};
thread_local void (*t_entry)(void*);
thread_local void* t_arg;
void ucontext_entry() { t_entry(t_arg); }
void ctx_init(Context* c, char* stack, size_t bytes, void (*entry)(void*), void* arg) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, ucontext_entry, 0);
  t_entry = entry;  // read at the first switch into it, on this OS thread
  t_arg = arg;
}
inline void ctx_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

// ---- fiber stacks: one arena per block, kept in a pool -----------------------------------------------
#if defined(RINGZERO_TSAN)
constexpr size_t kStackBytes = 256u << 10;  // instrumented frames are larger
#else
constexpr size_t kStackBytes = 64u << 10;
#endif
// One guard page below the arena, none between stacks: a guard per stack would cost two memory maps
// per fiber, and 64 blocks x 512 threads would pass the kernel's limit on maps (vm.max_map_count).
constexpr size_t kGuardBytes = 4096;

struct Arena {
  char* base = nullptr;
  size_t fibers = 0;
  char* stack(size_t i) const { return base + kGuardBytes + i * kStackBytes; }
};
std::mutex g_arena_mu;
std::vector<Arena> g_arenas;

Arena take_arena(size_t fibers) {
  {
    std::lock_guard<std::mutex> lock(g_arena_mu);
    for (size_t i = 0; i < g_arenas.size(); ++i)
      if (g_arenas[i].fibers >= fibers) {
        Arena a = g_arenas[i];
        g_arenas.erase(g_arenas.begin() + static_cast<long>(i));
        return a;
      }
  }
  Arena a;
  a.fibers = fibers;
  const size_t bytes = kGuardBytes + fibers * kStackBytes;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "ringzero cpu_grid: mmap of %zu fiber stacks failed\n", fibers);
    std::abort();
  }
  a.base = static_cast<char*>(p);
  mprotect(a.base, kGuardBytes, PROT_NONE);
  return a;
}
void give_arena(const Arena& a) {
  std::lock_guard<std::mutex> lock(g_arena_mu);
  g_arenas.push_back(a);
}

// ---- one block: fibers and their scheduler ---------------------------------------------------------
enum Request : int { kPoll = 1, kYield = 2, kBarrier = 3, kWarpBarrier = 4, kDone = 5 };

struct Block;
struct Fiber {
  Coords coords;
  Context ctx;
  Block* block = nullptr;
  void* tsan = nullptr;
  // written by the fiber, read by the scheduler after the switch (and back): relaxed atomics, since
  // ThreadSanitizer sees the fiber and the scheduler as two threads with no order between them
  std::atomic<int> request{0}, pred{0}, result{0};
  std::mt19937_64 rng;  // the fiber's own chaos
  // the scheduler's own
  bool started = false, done = false;
  int waiting = 0;  // 0, kBarrier or kWarpBarrier
};

thread_local std::atomic<Fiber*> t_fiber{nullptr};

struct Block {
  const char* kernel = nullptr;
  const std::function<void()>* body = nullptr;
  Context sched;
  void* sched_tsan = nullptr;
  bool chaos = false;
  std::vector<uint64_t> shuffle;
  // __syncthreads and the warp barrier: every arriving thread releases (RMW), every leaving one acquires
  std::atomic<uint64_t> block_sync{0};
  std::unique_ptr<std::atomic<uint64_t>[]> warp_sync;
};

thread_local Block* t_block = nullptr;

void switch_to_scheduler(Fiber* f, int request, bool sync) {
  f->request.store(request, std::memory_order_relaxed);
  Block* b = f->block;
#if defined(RINGZERO_TSAN)
  __tsan_switch_to_fiber(b->sched_tsan, sync ? 0 : __tsan_switch_to_fiber_no_sync);
#else
  (void)sync;
#endif
  ctx_switch(&f->ctx, &b->sched);
}

void fiber_main(void* arg) {
  auto* f = static_cast<Fiber*>(arg);
  (*f->block->body)();
  switch_to_scheduler(f, kDone, true);  // never resumed
  std::abort();
}

void stall(std::mt19937_64& rng) {
  if (rng() % 2) {
    sched_yield();
  } else {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(1 + rng() % 50);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
}

[[noreturn]] void divergent(const Block& b, const char* what) {
  std::fprintf(stderr,
               "ringzero cpu_grid: kernel %s block (%u,%u): %s while other threads of the block have returned "
               "(a divergent barrier: undefined behaviour on a GPU)\n",
               b.kernel, coords().block_idx.x, coords().block_idx.y, what);
  std::abort();
}

void run_block(const char* kernel, const std::function<void()>& body, dim3 grid, dim3 block, size_t linear,
               uint64_t chaos) {
  const size_t n = static_cast<size_t>(block.x) * block.y * block.z;
  const size_t warps = (n + 31) / 32;
  Block b;
  b.kernel = kernel;
  b.body = &body;
  b.chaos = chaos != 0;
  b.shuffle.assign(n, 0);
  b.warp_sync.reset(new std::atomic<uint64_t>[warps]);
  for (size_t w = 0; w < warps; ++w) b.warp_sync[w].store(0);
  const dim3 bidx(static_cast<unsigned>(linear % grid.x), static_cast<unsigned>(linear / grid.x % grid.y),
                  static_cast<unsigned>(linear / (static_cast<size_t>(grid.x) * grid.y)));
  Arena arena = take_arena(n);
  std::unique_ptr<Fiber[]> fibers(new Fiber[n]);
  std::mt19937_64 sched_rng(chaos ^ (linear * 0x9e3779b97f4a7c15ull));
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.coords = Coords{dim3(static_cast<unsigned>(i % block.x), static_cast<unsigned>(i / block.x % block.y),
                           static_cast<unsigned>(i / (static_cast<size_t>(block.x) * block.y))),
                      bidx, block, grid};
    f.block = &b;
    f.rng.seed(sched_rng());
    ctx_init(&f.ctx, arena.stack(i), kStackBytes, fiber_main, &f);
#if defined(RINGZERO_TSAN)
    f.tsan = __tsan_create_fiber(0);
#endif
  }
#if defined(RINGZERO_TSAN)
  b.sched_tsan = __tsan_get_current_fiber();
#endif
  t_block = &b;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::vector<size_t> warp_live(warps, 0), warp_waiting(warps, 0);
  for (size_t i = 0; i < n; ++i) ++warp_live[i / 32];
  size_t live = n, exited = 0, block_waiting = 0;
  int block_or = 0;
  uint64_t idle_rounds = 0;
  auto release = [&](int kind, size_t warp) {
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = fibers[i];
      if (f.waiting != kind || (kind == kWarpBarrier && i / 32 != warp)) continue;
      f.waiting = 0;
      if (kind == kBarrier) f.result.store(block_or, std::memory_order_relaxed);
    }
  };
  while (live > 0) {
    bool moved = false;
    if (b.chaos) std::shuffle(order.begin(), order.end(), sched_rng);
    for (size_t i : order) {
      Fiber& f = fibers[i];
      if (f.done || f.waiting) continue;
      t_fiber.store(&f, std::memory_order_relaxed);
      t_coords.store(&f.coords, std::memory_order_relaxed);
      const bool first = !f.started;
      f.started = true;
#if defined(RINGZERO_TSAN)
      // The first switch synchronises (the launch's arguments and the block's setup happen before the
      // thread starts); later ones do not, so only the kernel's own synchronisation orders its threads.
      // Nothing may touch memory between this call and the switch: TSan counts it as the fiber's.
      __tsan_switch_to_fiber(f.tsan, first ? 0 : __tsan_switch_to_fiber_no_sync);
#else
      (void)first;
#endif
      ctx_switch(&b.sched, &f.ctx);
      const size_t w = i / 32;
      switch (f.request.load(std::memory_order_relaxed)) {
        case kPoll:
          break;
        case kYield:
          moved = true;
          break;
        case kBarrier:
          moved = true;
          f.waiting = kBarrier;
          block_or |= f.pred.load(std::memory_order_relaxed);
          if (++block_waiting == live) {
            if (exited) divergent(b, "__syncthreads reached");
            release(kBarrier, 0);
            block_waiting = 0;
            block_or = 0;
          }
          break;
        case kWarpBarrier:
          moved = true;
          f.waiting = kWarpBarrier;
          if (++warp_waiting[w] == warp_live[w]) {
            if (warp_live[w] != std::min<size_t>(32, n - w * 32)) divergent(b, "a warp shuffle reached");
            release(kWarpBarrier, w);
            warp_waiting[w] = 0;
          }
          break;
        case kDone:
          moved = true;
          f.done = true;
          --live;
          ++exited;
          --warp_live[w];
          if (block_waiting > 0 && block_waiting == live) divergent(b, "__syncthreads reached");
          if (warp_waiting[w] > 0 && warp_waiting[w] == warp_live[w]) divergent(b, "a warp shuffle reached");
          break;
        default:
          std::abort();
      }
    }
    // A round in which every thread only polled: let the other blocks' OS threads run (2 cores hold
    // many blocks); after a long while, sleep a little so a peer that is descheduled gets the cores.
    if (moved) {
      idle_rounds = 0;
    } else if (++idle_rounds > 2) {
      if (idle_rounds < 4096) sched_yield();
      else usleep(20);
    }
  }
  t_fiber.store(nullptr, std::memory_order_relaxed);
  t_coords.store(nullptr, std::memory_order_relaxed);
  t_block = nullptr;
#if defined(RINGZERO_TSAN)
  for (size_t i = 0; i < n; ++i) __tsan_destroy_fiber(fibers[i].tsan);
#endif
  give_arena(arena);
}

void run_grid(const char* kernel, dim3 grid, dim3 block, const std::function<void()>& body) {
  const size_t blocks = static_cast<size_t>(grid.x) * grid.y * grid.z;
  const uint64_t launch = settings().launches.fetch_add(1);
  const uint64_t chaos_seed = settings().chaos.load();
  const uint64_t chaos = chaos_seed ? (chaos_seed * 0x2545f4914f6cdd1dull) ^ (launch + 1) : 0;
  // Blocks beyond the resident capacity wait for a free multiprocessor, as on a GPU.
  const size_t capacity = static_cast<size_t>(std::max(1, settings().sms));
  const size_t workers = std::min(blocks, capacity);
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t t = 0; t < workers; ++t)
    threads.emplace_back([&] {
      for (size_t i = next.fetch_add(1); i < blocks; i = next.fetch_add(1)) run_block(kernel, body, grid, block, i, chaos);
    });
  for (auto& t : threads) t.join();
}

// ---- launches, streams, graphs ----------------------------------------------------------------------
std::mutex g_kernels_mu;
// Never destroyed: write_kernel_log runs from atexit, which a static map registered later (at its first
// use, after the atexit call) would not outlive (that crashed the fuzz at exit, now and then).
std::map<std::string, uint64_t>& kernels() {
  static auto* k = new std::map<std::string, uint64_t>;
  return *k;
}

std::string short_name(const char* pretty) {
  std::string s(pretty);
  const size_t at = s.find("Kernel = ");
  if (at != std::string::npos) s = s.substr(at + 9);
  const size_t k = s.find("K = ");
  if (at == std::string::npos && k != std::string::npos) s = s.substr(k + 4);
  if (!s.empty() && s.back() == ']') s.pop_back();
  for (size_t p; (p = s.find("{anonymous}::")) != std::string::npos;) s.erase(p, 13);
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  return s;
}

thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

}  // namespace
}  // namespace ringzero::cpu_grid

struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};
struct CUstream_st {
  CUgraph_st* capture = nullptr;  // non-null while capturing
};
struct CUevent_st {};

namespace ringzero::cpu_grid {

int sync_block(int pred) {
  Fiber* f = t_fiber.load(std::memory_order_relaxed);
  if (!f) return pred;
  sync_point();
  f->pred.store(pred, std::memory_order_relaxed);
  f->block->block_sync.fetch_add(1, std::memory_order_acq_rel);
  switch_to_scheduler(f, kBarrier, false);
  f->block->block_sync.load(std::memory_order_acquire);
  return f->result.load(std::memory_order_relaxed);
}

void sync_warp() {
  Fiber* f = t_fiber.load(std::memory_order_relaxed);
  if (!f) return;
  std::atomic<uint64_t>& word = f->block->warp_sync[f->coords.thread_idx.x / 32];
  word.fetch_add(1, std::memory_order_acq_rel);
  switch_to_scheduler(f, kWarpBarrier, false);
  word.load(std::memory_order_acquire);
}

void poll_point() {
  Fiber* f = t_fiber.load(std::memory_order_relaxed);
  if (!f) return;
  if (f->block->chaos && f->rng() % 64 == 0) stall(f->rng);
  switch_to_scheduler(f, kPoll, false);
}

void sync_point() {
  Fiber* f = t_fiber.load(std::memory_order_relaxed);
  if (!f || !f->block->chaos) return;
  const uint64_t r = f->rng();
  if (r % 64 == 0) stall(f->rng);
  if (r % 4 == 1) switch_to_scheduler(f, kYield, false);
}

uint64_t* shuffle_slots() {
  Fiber* f = t_fiber.load(std::memory_order_relaxed);
  return f ? f->block->shuffle.data() : nullptr;
}

void set_chaos(uint64_t seed) { settings().chaos.store(seed); }
uint64_t chaos_seed() { return settings().chaos.load(); }
void set_block_threads(unsigned threads) { settings().block_threads.store(threads); }
unsigned block_threads() { return settings().block_threads.load(); }

std::map<std::string, uint64_t> launched_kernels() {
  std::lock_guard<std::mutex> lock(g_kernels_mu);
  return kernels();
}

void write_kernel_log() {
  const char* path = std::getenv("RINGZERO_CPU_GRID_KERNEL_LOG");
  if (!path || !*path) return;
  FILE* out = std::fopen(path, "w");
  if (!out) return;
  for (const auto& [name, count] : launched_kernels())
    std::fprintf(out, "%llu\t%s\n", static_cast<unsigned long long>(count), name.c_str());
  std::fclose(out);
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
  if (stream && stream->capture) {
    stream->capture->work.push_back(std::move(work));
  } else {
    work();
  }
  return cudaSuccess;
}

cudaError_t launch(const char* kernel, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body) {
  if (const unsigned t = block_threads()) block = dim3(t);
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    return fail(cudaErrorInvalidConfiguration);
  const std::string name = short_name(kernel);
  {
    std::lock_guard<std::mutex> lock(g_kernels_mu);
    static const bool logged = (std::atexit(write_kernel_log), true);
    (void)logged;
    ++kernels()[name];
  }
  return enqueue(stream, [kernel, grid, block, body = std::move(body)] { run_grid(kernel, grid, block, body); });
}

}  // namespace ringzero::cpu_grid

// ---- the runtime API -----------------------------------------------------------------------------------
using ringzero::cpu_grid::enqueue;
using ringzero::cpu_grid::fail;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error (CPU grid)";
    case cudaErrorInvalidValue: return "invalid argument (CPU grid)";
    case cudaErrorMemoryAllocation: return "out of memory (CPU grid)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (CPU grid)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (CPU grid)";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch (CPU grid)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (CPU grid)";
  }
  return "unknown error (CPU grid)";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = ringzero::cpu_grid::t_last_error;
  ringzero::cpu_grid::t_last_error = cudaSuccess;
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
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidValue); }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return fail(cudaErrorInvalidValue);
  *v = ringzero::cpu_grid::settings().sms;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }  // every stream's work has run already

cudaError_t cudaMalloc(void** p, size_t bytes) {
  // Fresh device memory holds garbage: a pattern, so a read of what nobody wrote shows.
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
  std::memset(*p, 0xa5, bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s) {
  return enqueue(s, [=] { std::memset(p, v, bytes); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  return enqueue(s, [=] { std::memmove(dst, src, bytes); });
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return s && s->capture ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (!s || s->capture) return fail(cudaErrorInvalidValue);
  s->capture = new CUgraph_st;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  if (!s || !s->capture) return fail(cudaErrorInvalidValue);
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
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
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
  return *p ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaIpcCloseMemHandle(void*) { return cudaSuccess; }
