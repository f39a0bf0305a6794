// Fibers of the CPU grid (internal to csrc/cuda/cpu_grid): an execution context on a stack of its own,
// switched by hand (a few ns on x86-64, where swapcontext makes a system call per switch), and the
// pool of stack arenas, one arena per running block.
#pragma once
#include <cstddef>

#if defined(__SANITIZE_THREAD__)
#define RINGZERO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RINGZERO_TSAN 1
#endif
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
extern "C" void ringzero_cpu_grid_switch(void** save_sp, void* load_sp);
#endif

namespace ringzero::cpu_grid {

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
inline void ctx_switch(Context* from, Context* to) { ringzero_cpu_grid_switch(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};
void ctx_switch(Context* from, Context* to);
#endif
// Prepares `c` to run entry(arg) on [stack, stack + bytes) at its first switch; entry never returns.
void ctx_init(Context* c, char* stack, size_t bytes, void (*entry)(void*), void* arg);

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

// An arena of at least `fibers` stacks (from the pool, else newly mapped); give it back when done.
Arena take_arena(size_t fibers);
void give_arena(const Arena& a);

}  // namespace ringzero::cpu_grid
