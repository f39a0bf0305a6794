// A model of the 2-rank shared-memory all-reduce at 64 MiB, without torch: two threads pinned to two
// cpus run ringzero's two-shot schedule (csrc/core/shm_collectives.cpp, all_reduce_two_shot) and variants of
// it over private in-place buffers and shared staging slots, interleaved call by call with the floor
// (`ringzero bench`'s: an in-place pass over the same buffers, both threads at once), so that the
// VM's drifting memory speed and the host's moves of the vCPUs hit every arm alike.
// It also measures the parts the floor leaves out: streaming from memory alone, the exchange between
// the cores alone, and the two interleaved in one loop, which says whether a core overlaps them.
//
//   gcc -O2 -march=native -pthread benchmarks/two_shot_model.c -o /tmp/two_shot_model   (x86-64 with AVX-512)
//   /tmp/two_shot_model [iters=40] [slot_kib=256] [cpus=0,1]
//
// Every reduction arm is checked against the exact sum before it is timed (exit status 1 if wrong).
// Times are per call (one all-reduce of 64 MiB per thread, or one pass of the probe), rank 0's rdtsc
// converted with the TSC rate measured against CLOCK_MONOTONIC; medians and ranges over `iters` calls.
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

enum { FLOOR, COPY, TWO_SHOT, STAGE_PEER_HALF, FUSED_OUT, STREAM, EXCHANGE, INTERLEAVED, NARMS };
static const char* kName[NARMS] = {
    "floor: in-place pass",   "copy to 2nd buffer",        "two-shot (ringzero)", "stage peer half only",
    "two-shot, fused out",    "stream: copy in only",      "exchange only",       "stream+exchange, one loop"};

static size_t kBytes = 64ul << 20, kSlot = 256ul << 10;
static int iters = 40, cpu[2] = {0, 1};
typedef struct {
  _Alignas(128) atomic_ulong v;
  char pad[120];
} Counter;
static Counter sig[2], done_reading[2], probe[2];
static char* slots;          // [rank][parity][kSlot]
static float* buf[2];        // each rank's tensor (input and output: in place)
static float* spare[2];      // second buffer of the copy probe
static char* xdst[2];        // private destination of the exchange probe
static char* sdst[2];        // private destination of the stream probe (the peer reads the slots)
static uint64_t ticks[NARMS][4096];
static uint64_t phase[2], slice_no[2];
static double tsc_hz;

static inline char* slot(int r, uint64_t k) { return slots + (2 * (size_t)r + (k & 1)) * kSlot; }
static inline void wait_ge(atomic_ulong* a, uint64_t v) {
  while (atomic_load_explicit(a, memory_order_acquire) < v) _mm_pause();
}
static inline void signal_(int me) { atomic_store_explicit(&sig[me].v, ++phase[me], memory_order_release); }
static inline void wait_peer(int me) { wait_ge(&sig[1 - me].v, phase[me]); }

// d = (a + b) * scale: scale 0.5 keeps the timed calls' values constant (the checks use 1).
static float scale = 1.0f;
static void add2(float* d, const float* a, const float* b, size_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_mul_ps(s, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i))));
}
static void add2_twice(float* d1, float* d2, const float* a, const float* b, size_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_mul_ps(s, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    _mm512_storeu_ps(d1 + i, x);
    _mm512_storeu_ps(d2 + i, x);
  }
}

static void all_reduce(int me, int arm) {
  const int peer = 1 - me;
  const size_t half = kSlot / 2, mo = me * half, po = peer * half;
  for (size_t off = 0; off < kBytes; off += kSlot) {
    const uint64_t k = slice_no[me]++;
    if (k >= 2) wait_ge(&done_reading[peer].v, k - 1);  // the peer is done with slice k - 2's slots
    char* in = (char*)buf[me] + off;
    char* my = slot(me, k);
    char* ps = slot(peer, k);
    if (arm == STAGE_PEER_HALF) {  // stage only the peer's half; reduce the own half from the input
      memcpy(my + po, in + po, half);
      signal_(me), wait_peer(me);
      add2_twice((float*)(in + mo), (float*)(my + mo), (float*)(in + mo), (float*)(ps + mo), half / 4);
      signal_(me), wait_peer(me);
      memcpy(in + po, ps + po, half);
    } else {  // the two-shot of shm_collectives.cpp: stage the slice, reduce the own half, copy both halves out
      memcpy(my, in, kSlot);
      signal_(me), wait_peer(me);
      if (arm == FUSED_OUT) {
        add2_twice((float*)(my + mo), (float*)(in + mo), (float*)(my + mo), (float*)(ps + mo), half / 4);
        signal_(me);
      } else {
        add2((float*)(my + mo), (float*)(my + mo), (float*)(ps + mo), half / 4);
        signal_(me);
        memcpy(in + mo, my + mo, half);
      }
      wait_peer(me);
      memcpy(in + po, ps + po, half);
    }
    atomic_store_explicit(&done_reading[me].v, k + 1, memory_order_release);
  }
}

// The parts: per slot of input, STREAM copies it in (memory to this core's cache), EXCHANGE copies a
// slot the peer has just written into a private buffer (cache to cache), INTERLEAVED does both in
// 4 KiB turns. Each writes its own slot for the peer first (a memset: the same work in every arm).
static void parts(int me, int arm) {
  const int peer = 1 - me;
  for (size_t off = 0; off < kBytes; off += kSlot) {
    const uint64_t k = slice_no[me]++;
    if (k >= 2) wait_ge(&done_reading[peer].v, k - 1);
    char* in = (char*)buf[me] + off;
    char* my = slot(me, k);
    const char* ps = slot(peer, k);
    if (arm != STREAM) memset(my, (int)k, kSlot);
    signal_(me), wait_peer(me);
    if (arm == STREAM) memcpy(sdst[me], in, kSlot);
    if (arm == EXCHANGE) memcpy(xdst[me], ps, kSlot);
    if (arm == INTERLEAVED)
      for (size_t j = 0; j < kSlot; j += 4096) {
        memcpy(sdst[me] + j, in + j, 4096);
        memcpy(xdst[me] + j, ps + j, 4096);
      }
    atomic_store_explicit(&done_reading[me].v, k + 1, memory_order_release);
  }
}

static void floor_pass(int me) {
  volatile float one = 1.0f;
  const __m512 s = _mm512_set1_ps(one);
  float* x = buf[me];
  for (size_t i = 0; i < kBytes / 4; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(s, _mm512_loadu_ps(x + i)));
}

static void run(int me, int arm) {
  if (arm == FLOOR) floor_pass(me);
  else if (arm == COPY) memcpy(spare[me], buf[me], kBytes);
  else if (arm >= STREAM) parts(me, arm);
  else all_reduce(me, arm);
  signal_(me), wait_peer(me);  // a call ends when both ranks are done
}

// Round trip of one cache line between the two cpus, ns (median of 51 runs of 200).
static double round_trip_ns(int me) {
  double best[51];
  for (int r = 0; r < 51; ++r) {
    signal_(me), wait_peer(me);
    uint64_t base = atomic_load(&probe[me].v);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 200; ++i) {
      if (me == 0) {
        atomic_store_explicit(&probe[0].v, base + i + 1, memory_order_release);
        wait_ge(&probe[1].v, base + i + 1);
      } else {
        wait_ge(&probe[0].v, base + i + 1);
        atomic_store_explicit(&probe[1].v, base + i + 1, memory_order_release);
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    best[r] = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 200;
  }
  for (int i = 1; i < 51; ++i)
    for (int j = i; j > 0 && best[j] < best[j - 1]; --j) { double t = best[j]; best[j] = best[j - 1]; best[j - 1] = t; }
  return best[25];
}
static double rt_before, rt_after;

static int check(int me, int arm) {  // rank r holds r + 1 + (i % 7): the sum is exact in float32
  scale = 1.0f;
  for (size_t i = 0; i < kBytes / 4; ++i) buf[me][i] = (float)(me + 1 + i % 7);
  signal_(me), wait_peer(me);
  run(me, arm);
  for (size_t i = 0; i < kBytes / 4; ++i)
    if (buf[me][i] != (float)(3 + 2 * (i % 7))) {
      fprintf(stderr, "%s: rank %d element %zu is %g, expected %g\n", kName[arm], me, i, buf[me][i], (double)(3 + 2 * (i % 7)));
      return 1;
    }
  return 0;
}

static void* rank_main(void* arg) {
  const int me = (int)(intptr_t)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu[me], &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) { perror("sched_setaffinity"); exit(2); }
  buf[me] = aligned_alloc(4096, kBytes);
  spare[me] = aligned_alloc(4096, kBytes);
  xdst[me] = aligned_alloc(4096, kSlot);
  sdst[me] = aligned_alloc(4096, kSlot);
  memset(sdst[me], 0, kSlot);
  memset(spare[me], 0, kBytes);
  memset(xdst[me], 0, kSlot);
  int bad = 0;
  for (int arm = TWO_SHOT; arm <= FUSED_OUT; ++arm) bad |= check(me, arm);
  if (bad) exit(1);
  double rt = round_trip_ns(me);
  if (me == 0) rt_before = rt;
  scale = 0.5f;  // equal inputs on both ranks from here on: every call leaves them unchanged
  for (size_t i = 0; i < kBytes / 4; ++i) buf[me][i] = 1.0f;
  for (int it = 0; it < iters; ++it)
    for (int a = 0; a < NARMS; ++a) {
      const int arm = (a + it) % NARMS;  // the order rotates, so no arm always follows the same one
      signal_(me), wait_peer(me);
      const uint64_t t0 = __rdtsc();
      run(me, arm);
      if (me == 0) ticks[arm][it] = __rdtsc() - t0;
    }
  rt = round_trip_ns(me);
  if (me == 0) rt_after = rt;
  return NULL;
}

static int cmp_u64(const void* a, const void* b) {
  const uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "iters=", 6)) iters = atoi(argv[i] + 6);
    else if (!strncmp(argv[i], "slot_kib=", 9)) kSlot = (size_t)atol(argv[i] + 9) << 10;
    else if (!strncmp(argv[i], "cpus=", 5)) sscanf(argv[i] + 5, "%d,%d", &cpu[0], &cpu[1]);
    else { fprintf(stderr, "unknown argument %s (iters=N slot_kib=K cpus=A,B)\n", argv[i]); return 2; }
  }
  if (iters < 3 || iters > 4096 || kSlot < 8192 || kSlot % 8192 || kBytes % kSlot) {
    fprintf(stderr, "iters must be in [3, 4096]; slot_kib a multiple of 8 dividing 65536\n");
    return 2;
  }
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  const uint64_t c0 = __rdtsc();
  do clock_gettime(CLOCK_MONOTONIC, &b); while ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec) < 2e8);
  tsc_hz = (__rdtsc() - c0) / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9);
  slots = aligned_alloc(4096, 4 * kSlot);
  memset(slots, 0, 4 * kSlot);
  pthread_t th[2];
  for (intptr_t r = 0; r < 2; ++r) pthread_create(&th[r], NULL, rank_main, (void*)r);
  for (int r = 0; r < 2; ++r) pthread_join(th[r], NULL);

  double med[NARMS];
  printf("# 2 ranks (threads on cpus %d,%d), 64 MiB float32 in place per rank, slots %zu KiB, %d calls of each arm\n",
         cpu[0], cpu[1], kSlot >> 10, iters);
  printf("# cache-line round trip %.0f ns before, %.0f ns after (over 150: separate L3s); TSC %.3f GHz\n",
         rt_before, rt_after, tsc_hz / 1e9);
  printf("%-26s %9s %17s %8s\n", "arm", "median ms", "range ms", "floor%");
  for (int arm = 0; arm < NARMS; ++arm) {
    qsort(ticks[arm], iters, sizeof(uint64_t), cmp_u64);
    med[arm] = ticks[arm][iters / 2] / tsc_hz * 1e3;
    printf("%-26s %9.2f %8.2f-%8.2f", kName[arm], med[arm], ticks[arm][0] / tsc_hz * 1e3,
           ticks[arm][iters - 1] / tsc_hz * 1e3);
    if (arm != FLOOR && arm < STREAM) printf(" %7.0f%%", 100 * med[FLOOR] / med[arm]);
    printf("\n");
  }
  printf("# overlap: (stream + exchange) / interleaved = %.2f (1.00: the core does them one after the other; "
         "up to 2: at once)\n", (med[STREAM] + med[EXCHANGE]) / med[INTERLEAVED]);
  return 0;
}
