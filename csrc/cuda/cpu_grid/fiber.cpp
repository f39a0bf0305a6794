// Fibers of the CPU grid (fiber.h): the context switch and the pool of stack arenas.
#include "cuda/cpu_grid/fiber.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace ringzero::cpu_grid {

// ---- context switching ------------------------------------------------------------------------------
// x86-64: a minimal switch of the callee-saved registers (plus mxcsr and the x87 control word); a few
// ns, where swapcontext makes a system call per switch. Elsewhere: ucontext.
#if defined(__x86_64__)
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
#else
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
void ctx_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

// ---- fiber stacks: one arena per block, kept in a pool -----------------------------------------------
namespace {
std::mutex g_arena_mu;
std::vector<Arena> g_arenas;

Arena take_arena_impl(size_t fibers) {
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
}  // namespace

Arena take_arena(size_t fibers) { return take_arena_impl(fibers); }
void give_arena(const Arena& a) {
  std::lock_guard<std::mutex> lock(g_arena_mu);
  g_arenas.push_back(a);
}

}  // namespace ringzero::cpu_grid
