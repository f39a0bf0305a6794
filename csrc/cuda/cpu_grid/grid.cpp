// The CPU grid's executor ([Note: the CPU grid's execution model] in grid.h): blocks on OS threads,
// CUDA threads as fibers with a cooperative scheduler per block, optional chaos (random yields, stalls
// and fiber order), launches and their log. The runtime API is in runtime.cpp.
#include "cuda/cpu_grid/grid.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cuda/cpu_grid/fiber.h"

#if defined(RINGZERO_TSAN)
#include <sanitizer/tsan_interface.h>
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

}  // namespace
}  // namespace ringzero::cpu_grid

namespace ringzero::cpu_grid {

void misaligned_access(const void* p, size_t width, const char* what) {
  std::fprintf(stderr, "cpu grid: misaligned address: %s of %zu bytes at %p (a GPU faults here)\n", what, width, p);
  std::fflush(stderr);
  std::abort();
}

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

int multiprocessors() { return std::max(1, settings().sms); }
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

cudaError_t launch(const char* kernel, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body) {
  if (const unsigned t = block_threads()) block = dim3(t);
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    return record_error(cudaErrorInvalidConfiguration);
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
