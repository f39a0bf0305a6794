// What a 2-rank all-gather of 64 MiB (the output; 32 MiB in per rank) can cost on this host, without
// torch: two threads pinned to two cpus run, interleaved call by call so that the VM's drifting memory
// speed and the host's moves of the vCPUs hit every arm alike,
//   write only    each thread streams its 64 MiB output from registers: the writes alone;
//   floor         each thread reads its input once and streams it into its block of both outputs: the
//                 least memory traffic any all-gather can have (read 32 MiB, write 64 MiB per rank). No
//                 library can run it across processes (it writes the peer's private memory); it is the
//                 floor under all of them;
//   single copy   each thread streams its own input and the peer's into its output: what a single-copy
//                 transport (CMA's process_vm_readv, XPMEM) reaches at best, with no kernel cost;
//   kernel copy   the own block streamed, the peer's read with process_vm_readv (CMA, Open MPI's and
//                 MPICH's single copy for large messages on Linux) in chunks of 4 MiB;
//   staged        ringzero's schedule (csrc/core/shm_collectives.cpp, ShmComm::all_gather, on one L3):
//                 slices of one slot through two shared slots per rank, the own block copied out of the
//                 own slot while the peer stages, the peer's out of its slot, one synchronisation per
//                 slice; the output written with streaming stores (ringzero's from 16 MiB per rank in)
//                 or with memcpy (below that).
// The cache-line round trip between the two cpus is measured before and after (45-130 ns: one last-level
// cache; 350-400 ns: two), since which one the host gives decides what an all-gather this large costs.
//
//   gcc -O2 -march=native -pthread benchmarks/all_gather_model.c -o /tmp/all_gather_model   (x86-64, AVX-512)
//   /tmp/all_gather_model [iters=30] [slot_kib=256] [cpus=0,1] [out_mib=64] [pages=small|huge]
//
// pages=huge puts the inputs and outputs on transparent huge pages (2 MiB-aligned, MADV_HUGEPAGE), as
// torch's allocator does with THP_MEM_ALLOC_ENABLE=1 and numpy by default: the kernel copy pins each page it
// reads, and pins 2 MiB pages far faster ([Note: single copy between a host's ranks], shm_single_copy.cpp).
//
// Every arm's output is checked against the expected bytes before it is timed (exit status 1 if wrong).
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include <time.h>

enum { WRITE, FLOOR, SINGLE, CMA, STAGED, STAGED_CACHED, NARMS };
static const char* kName[NARMS] = {"write only", "floor: read once, write both", "single copy",
                                  "kernel copy (CMA)", "staged, streaming output", "staged, cached output"};

static size_t kOut = 64ul << 20, kIn = 32ul << 20;
static size_t kSlot = 256ul << 10;
static const size_t kCmaChunk = 4ul << 20;
static int iters = 30, cpu[2] = {0, 1};
typedef struct {
  _Alignas(128) atomic_ulong v;
  char pad[120];
} Counter;
static Counter sig[2], done_reading[2], ping;
static char* slots;  // [rank][parity][kSlot]
static char* in[2];
static char* out[2];
static double secs[NARMS][1024];
static uint64_t phase[2], slice_no[2];
static pthread_barrier_t bar;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
static void stream_copy(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _mm512_stream_si512((__m512i*)(d + i), _mm512_load_si512((const void*)(s + i)));
}
static void cached_copy(char* d, const char* s, size_t n) { memcpy(d, s, n); }
static void stream_copy2(char* d1, char* d2, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    const __m512i v = _mm512_load_si512((const void*)(s + i));
    _mm512_stream_si512((__m512i*)(d1 + i), v);
    _mm512_stream_si512((__m512i*)(d2 + i), v);
  }
}
static void stream_fill(char* d, size_t n, int byte) {
  const __m512i v = _mm512_set1_epi8((char)byte);
  for (size_t i = 0; i < n; i += 64) _mm512_stream_si512((__m512i*)(d + i), v);
}
static inline char* slot(int r, uint64_t k) { return slots + (2 * (size_t)r + (k & 1)) * kSlot; }
static inline void wait_ge(atomic_ulong* a, uint64_t v) {
  while (atomic_load_explicit(a, memory_order_acquire) < v) _mm_pause();
}

static void staged(int me, int stream) {
  const int peer = 1 - me;
  for (size_t off = 0; off < kIn; off += kSlot) {
    const uint64_t k = slice_no[me]++;
    if (k >= 2) wait_ge(&done_reading[peer].v, k - 1);  // the peer has read slice k - 2's slot
    memcpy(slot(me, k), in[me] + off, kSlot);
    atomic_store_explicit(&sig[me].v, ++phase[me], memory_order_release);
    (stream ? stream_copy : cached_copy)(out[me] + me * kIn + off, slot(me, k), kSlot);
    wait_ge(&sig[peer].v, phase[me]);
    (stream ? stream_copy : cached_copy)(out[me] + peer * kIn + off, slot(peer, k), kSlot);
    _mm_sfence();
    atomic_store_explicit(&done_reading[me].v, k + 1, memory_order_release);
  }
}

static void run(int me, int arm) {
  const int peer = 1 - me;
  switch (arm) {
    case WRITE: stream_fill(out[me], kOut, me); break;
    case FLOOR: stream_copy2(out[me] + me * kIn, out[peer] + me * kIn, in[me], kIn); break;
    case SINGLE:
      stream_copy(out[me] + me * kIn, in[me], kIn);
      stream_copy(out[me] + peer * kIn, in[peer], kIn);
      break;
    case CMA:
      stream_copy(out[me] + me * kIn, in[me], kIn);
      for (size_t off = 0; off < kIn; off += kCmaChunk) {
        struct iovec local = {out[me] + peer * kIn + off, kCmaChunk}, remote = {in[peer] + off, kCmaChunk};
        if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)kCmaChunk) {
          perror("process_vm_readv");
          exit(1);
        }
      }
      break;
    case STAGED: staged(me, 1); break;
    case STAGED_CACHED: staged(me, 0); break;
  }
  _mm_sfence();
}

static int check(int arm) {
  if (arm == WRITE) return 1;
  for (int r = 0; r < 2; ++r)
    for (int q = 0; q < 2; ++q)
      if (memcmp(out[r] + q * kIn, in[q], kIn) != 0) return 0;
  return 1;
}

static void* thread(void* arg) {
  const int me = (int)(long)arg;
  pin(cpu[me]);
  memset(in[me], 0, kIn);  // first touch by the owner
  for (size_t i = 0; i < kIn; ++i) in[me][i] = (char)(i * 7 + 13 * me + (i >> 12));
  memset(out[me], 0, kOut);
  for (int arm = 0; arm < NARMS; ++arm) {  // correctness first, untimed
    pthread_barrier_wait(&bar);
    if (me == 0) memset(out[0], 0xee, kOut), memset(out[1], 0xee, kOut);
    pthread_barrier_wait(&bar);
    run(me, arm);
    pthread_barrier_wait(&bar);
    if (me == 0 && !check(arm)) {
      fprintf(stderr, "%s: wrong output\n", kName[arm]);
      exit(1);
    }
  }
  for (int it = 0; it < iters; ++it)
    for (int arm = 0; arm < NARMS; ++arm) {
      pthread_barrier_wait(&bar);
      const double t0 = now();
      run(me, arm);
      pthread_barrier_wait(&bar);
      if (me == 0) secs[arm][it] = now() - t0;
    }
  return NULL;
}

static void* ponger(void* arg) {
  (void)arg;
  pin(cpu[1]);
  for (uint64_t i = 1; i < 200000; i += 2) {
    wait_ge(&ping.v, i);
    atomic_store_explicit(&ping.v, i + 1, memory_order_release);
  }
  return NULL;
}
static double round_trip_ns(void) {  // cpu[0] -> cpu[1] -> cpu[0] on one cache line, median of 5 runs
  double best[5];
  for (int run = 0; run < 5; ++run) {
    atomic_store(&ping.v, 0);
    pthread_t t;
    pthread_create(&t, NULL, ponger, NULL);
    pin(cpu[0]);
    const double t0 = now();
    for (uint64_t i = 0; i < 200000; i += 2) {
      atomic_store_explicit(&ping.v, i + 1, memory_order_release);
      wait_ge(&ping.v, i + 2);
    }
    best[run] = (now() - t0) / 100000 * 1e9;
    pthread_join(t, NULL);
  }
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (best[j] < best[i]) {
        const double x = best[i];
        best[i] = best[j], best[j] = x;
      }
  return best[2];
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc > 1) iters = atoi(argv[1]);
  if (argc > 2) kSlot = (size_t)atoi(argv[2]) << 10;
  if (argc > 3 && sscanf(argv[3], "%d,%d", &cpu[0], &cpu[1]) != 2) return 2;
  if (argc > 4) kOut = (size_t)atoi(argv[4]) << 20, kIn = kOut / 2;
  const int huge = argc > 5 && strcmp(argv[5], "huge") == 0;
  if (argc > 5 && !huge && strcmp(argv[5], "small") != 0) {
    fprintf(stderr, "pages is small or huge\n");
    return 2;
  }
  if (iters < 1 || iters > 1024 || kSlot < 4096 || kIn == 0 || kIn % kSlot != 0) {
    fprintf(stderr, "iters in 1..1024, slot_kib a power of two >= 4, out_mib a multiple of 2 slots\n");
    return 2;
  }
  slots = aligned_alloc(4096, 4 * kSlot);
  const size_t align = huge ? 2 << 20 : 4096;  // both sizes are multiples of 2 MiB when pages=huge
  for (int r = 0; r < 2; ++r) {
    in[r] = aligned_alloc(align, (kIn + align - 1) / align * align);
    out[r] = aligned_alloc(align, (kOut + align - 1) / align * align);
    madvise(in[r], kIn, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    madvise(out[r], kOut, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  const double rt_before = round_trip_ns();
  pthread_barrier_init(&bar, NULL, 2);
  pthread_t t[2];
  for (long r = 0; r < 2; ++r) pthread_create(&t[r], NULL, thread, (void*)r);
  for (int r = 0; r < 2; ++r) pthread_join(t[r], NULL);
  const double rt_after = round_trip_ns();
  printf("# all_gather_model: 2 threads on cpus %d,%d, output %zu MiB per rank, slot %zu KiB, %d calls per arm, %s pages\n",
         cpu[0], cpu[1], kOut >> 20, kSlot >> 10, iters, huge ? "huge" : "small");
  printf("# cache-line round trip between the cpus: %.0f ns before, %.0f ns after\n", rt_before, rt_after);
  printf("| arm | median ms | fastest-slowest ms | written GB/s (both ranks, median) |\n|---|---|---|---|\n");
  for (int arm = 0; arm < NARMS; ++arm) {
    qsort(secs[arm], iters, sizeof(double), by_value);
    const double med = secs[arm][iters / 2];
    printf("| %s | %.2f | %.2f-%.2f | %.1f |\n", kName[arm], med * 1e3, secs[arm][0] * 1e3, secs[arm][iters - 1] * 1e3,
           2.0 * kOut / med / 1e9);
  }
  return 0;
}
