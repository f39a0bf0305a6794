// Device-side building blocks shared by every CUDA kernel of layer 2: element traits (16-bit floats
// accumulate in float32), 16-byte packs, the element-wise reduction over up to kMaxRanks sources,
// system-scope flags, and waits that end (a timeout is recorded and the kernel returns, never traps).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>

#include "cuda/peer_types.h"
#include "cuda/portable.cuh"
#include "cuda/schedule.h"

namespace ringzero::cuda {

constexpr int kPackBytes = 16;  // one 128-bit load or store per thread and source

// ---- element traits ------------------------------------------------------------------------------
// Integers accumulate in their own type with wrap-around (unsigned arithmetic, defined behaviour), so
// Avg divides the wrapped sum exactly as the CPU kernels and torch do.
template <class T> struct Elem {
  using Acc = T;
  static __device__ __forceinline__ Acc load(T v) { return v; }
  static __device__ __forceinline__ T store(Acc a) { return a; }
};
template <> struct Elem<__nv_bfloat16> {
  using Acc = float;
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float a) { return __float2bfloat16_rn(a); }
};
template <> struct Elem<__half> {
  using Acc = float;
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float a) { return __float2half_rn(a); }
};

template <class A> struct Unsigned { using type = A; };
template <> struct Unsigned<int8_t> { using type = uint32_t; };  // promote: no signed int overflow
template <> struct Unsigned<uint8_t> { using type = uint32_t; };
template <> struct Unsigned<int32_t> { using type = uint32_t; };
template <> struct Unsigned<int64_t> { using type = uint64_t; };

template <class A> __device__ __forceinline__ constexpr bool is_int() { return A(1) / A(2) == A(0); }

// The four element operators (Avg is Sum plus a divisor at the final write). Min/Max use the same
// comparisons as the CPU kernels so both paths agree on every input, NaN included.
struct SumOp {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) {
    if constexpr (is_int<A>()) {
      using U = typename Unsigned<A>::type;
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) {
    if constexpr (is_int<A>()) {
      using U = typename Unsigned<A>::type;
      return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
struct MinOp {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return b < a ? b : a; }
};
struct MaxOp {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return a < b ? b : a; }
};

template <class A> __device__ __forceinline__ A divide(A a, int divisor) {
  return a / static_cast<A>(divisor);  // integers truncate toward zero, as NCCL and the CPU path do
}

// ---- 16-byte packs -------------------------------------------------------------------------------
template <class T> struct alignas(kPackBytes) Pack {
  static constexpr int N = kPackBytes / sizeof(T);
  T v[N];
};

// Loads bypass L1 (.cg): staging and FIFO slots are rewritten by peers inside one kernel, and a stale
// L1 line must never be read after a flag said the new data is there.
template <class T> __device__ __forceinline__ Pack<T> load_pack(const T* p) {
  uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p));
  Pack<T> out;
  memcpy(&out, &raw, kPackBytes);
  return out;
}
// One element through L2 only, for the scalar tail (same reason as load_pack).
template <class T> __device__ __forceinline__ T load_cg(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "element size");
  T out;
  if constexpr (sizeof(T) == 1) {
    unsigned char r = __ldcg(reinterpret_cast<const unsigned char*>(p));
    memcpy(&out, &r, 1);
  } else if constexpr (sizeof(T) == 2) {
    unsigned short r = __ldcg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&out, &r, 2);
  } else if constexpr (sizeof(T) == 4) {
    unsigned int r = __ldcg(reinterpret_cast<const unsigned int*>(p));
    memcpy(&out, &r, 4);
  } else {
    unsigned long long r = __ldcg(reinterpret_cast<const unsigned long long*>(p));
    memcpy(&out, &r, 8);
  }
  return out;
}
template <class T> __device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) {
  uint4 raw;
  memcpy(&raw, &v, kPackBytes);
  __stcg(reinterpret_cast<uint4*>(p), raw);
}

// Up to MaxSrc sources combined in index order and written to one or two destinations (the output
// and a peer's FIFO slot: NCCL's "copy-send" in one pass). Sources and destinations may alias one
// another element-wise (every thread loads a whole pack before it stores it). MaxSrc below kMaxRanks
// (the ring's 2: received slot, local input) bounds reduce_span's loops at compile time, so they unroll
// and the pointers stay in registers; a run-time-indexed array of kMaxRanks pointers would live in
// local memory, which the ring, at its register cap, cannot afford.
template <class T, int MaxSrc = kMaxRanks> struct Span {
  const T* src[MaxSrc];
  int nsrc;
  T* dst[2];
  int ndst;
};

// Applies Op over [0, len) of every source, block-wide (this block's threads only). Bytes moved:
// (nsrc + ndst) * len * sizeof(T). The vector loop needs every pointer 16-byte aligned; otherwise (a
// user tensor that is an odd view) the whole range takes the scalar loop.
template <class T, class Op, int MaxSrc>
__device__ void reduce_span(const Span<T, MaxSrc>& s, size_t len, int divisor) {
  using E = Elem<T>;
  using A = typename E::Acc;
  constexpr int N = Pack<T>::N;
  // Counts the compiler can bound when MaxSrc is small (see Span); the kMaxRanks form keeps its loops.
  constexpr bool kFew = MaxSrc < kMaxRanks;
  const int nsrc = kFew && s.nsrc > MaxSrc ? MaxSrc : s.nsrc, ndst = kFew && s.ndst > 2 ? 2 : s.ndst;
  uintptr_t misalign = 0;
  for (int i = 0; i < nsrc; ++i) misalign |= reinterpret_cast<uintptr_t>(s.src[i]);
  for (int i = 0; i < ndst; ++i) misalign |= reinterpret_cast<uintptr_t>(s.dst[i]);
  size_t vec_len = (misalign % kPackBytes == 0) ? len / N * N : 0;
  for (size_t p = static_cast<size_t>(threadIdx.x) * N; p < vec_len; p += static_cast<size_t>(blockDim.x) * N) {
    Pack<T> x = load_pack(s.src[0] + p);
    A acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = E::load(x.v[j]);
    for (int i = 1; i < nsrc; ++i) {
      Pack<T> y = load_pack(s.src[i] + p);
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] = Op::apply(acc[j], E::load(y.v[j]));
    }
    Pack<T> out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = E::store(divisor > 1 ? divide(acc[j], divisor) : acc[j]);
    for (int i = 0; i < ndst; ++i) store_pack(s.dst[i] + p, out);
  }
  for (size_t e = vec_len + threadIdx.x; e < len; e += blockDim.x) {
    A acc = E::load(load_cg(s.src[0] + e));
    for (int i = 1; i < nsrc; ++i) acc = Op::apply(acc, E::load(load_cg(s.src[i] + e)));
    const T out = E::store(divisor > 1 ? divide(acc, divisor) : acc);
    for (int i = 0; i < ndst; ++i) s.dst[i][e] = out;
  }
}

// dst[0, len) = src[0, len), block-wide (a one-source span).
template <class T> __device__ __forceinline__ void copy_block(T* dst, const T* src, size_t len) {
  Span<T> s{};
  s.src[0] = src;
  s.nsrc = 1;
  s.dst[0] = dst;
  s.ndst = 1;
  reduce_span<T, SumOp>(s, len, 1);
}

// ---- flags ---------------------------------------------------------------------------------------
// store_release_sys, load_acquire_sys, load_volatile and global_timer_ns: cuda/portable.cuh.

// ---- waits that end -------------------------------------------------------------------------------
// [Note: a wait that runs out] A kernel never traps (a trap poisons the CUDA context: the process could
// not even free its memory). A wait past timeout_ns instead (1) publishes "stuck on peer" in this
// rank's Signal::stuck_on, (2) records who waited for what in the communicator's mapped RunStatus (the
// first wait to run out claims it with an atomicCAS on a device word; later ones only return), and
// (3) returns false; the block then returns (block-uniformly, through __syncthreads_or). Every other
// wait of the same communicator sees the claim within kSpinsPerCheck polls and gives up too, after
// publishing its own stuck_on (it is waiting for that peer now, whether or not its own clock has run
// out: simulated ranks share one claim, and a rank that gave up silently would be named as the
// culprit by the chain below, as the CPU grid showed for a ring of 4 with rank 2 missing), so a launch
// with a missing peer ends about timeout_ns after its first wait began; a kernel never waits on the
// host. The host reads RunStatus after the collective and raises CommTimeout naming the missing rank (peer_comm.cpp,
// comm/cuda.py); the counters of the ranks no longer agree, so the communicator refuses every later
// launch. Memory order: the record's fields, then __threadfence_system, then the code (the host reads
// the code first); stuck_on is a st.release.sys read with ld.acquire.sys by peers.
// The slow path's view of a wait that ran out, a copy the waiting thread fills in its local memory
// only when the wait runs out and hands to give_up by reference. Each other way costs the hot path:
// a pointer into the kernel's parameters, handed to a non-inlined function, makes every thread copy the
// parameters to local memory; an inlined slow path crowds the ring's loop into spills; and the struct by
// value takes about 30 argument registers at the call (benchmarks/RESULTS.md, "CUDA kernels, static").
struct StuckWait {
  Signal* signal[kMaxRanks];
  RunStatus* status;
  uint32_t* claim;
  const uint64_t* flag;
  uint64_t target, timeout_ns;
  int nranks, rank, peer;
  WaitKind what;
};

// The first rank along peer's chain of stuck_on words that is not itself stuck: in a ring, rank d+2
// waits for d+1, which waits for the dead rank d. A peer that is stuck too gives up within about the
// same time (its wait began earlier), so each hop grants it a grace (a quarter of the timeout, at most
// 100 ms) to say so before it is named.
static __device__ RINGZERO_NOINLINE int stuck_culprit(const StuckWait& w) {
  const uint64_t grace = w.timeout_ns / 4 < 100000000ull ? w.timeout_ns / 4 : 100000000ull;
  int p = w.peer;
  for (int hop = 0; hop < w.nranks; ++hop) {
    const uint64_t* word = &w.signal[p]->stuck_on;
    uint64_t s = load_acquire_sys(word);
    for (const uint64_t t0 = global_timer_ns(); s == 0 && global_timer_ns() - t0 < grace;) s = load_acquire_sys(word);
    if (s == 0 || s > static_cast<uint64_t>(w.nranks)) return p;
    if (static_cast<int>(s - 1) == w.rank) return w.peer;  // p waits for us: a cycle (different collectives)
    p = static_cast<int>(s - 1);
  }
  return w.peer;
}

// Publishes stuck_on, and records the timeout if this is the communicator's first (see the Note).
static __device__ RINGZERO_NOINLINE void give_up(const StuckWait& w) {
  store_release_sys(&w.signal[w.rank]->stuck_on, static_cast<uint64_t>(w.peer) + 1);
  if (atomicCAS(w.claim, 0u, 1u) != 0u) return;
  volatile RunStatus* st = w.status;
  const uint64_t seen = load_acquire_sys(w.flag);
  st->rank = w.rank;
  st->peer = w.peer;
  st->culprit = stuck_culprit(w);
  st->block = static_cast<int>(blockIdx.x);
  st->what = static_cast<int32_t>(w.what);
  st->flag = seen;
  st->target = w.target;
  __threadfence_system();  // the fields before the code: a host that sees the code sees them
  st->code = kTimedOut;
  __threadfence_system();
  printf("ringzero: rank %d block %d timed out waiting for rank %d (flag %llu, want %llu); returning early "
         "(the host raises CommTimeout)\n",
         w.rank, static_cast<int>(blockIdx.x), w.peer, static_cast<unsigned long long>(seen),
         static_cast<unsigned long long>(w.target));
}

// Polls of a flag between two looks at the clock and the claim: a few microseconds on a GPU; on the
// CPU grid a poll yields to the block's other threads, so fewer polls per look keep the timeout
// close to timeout_ns there too.
constexpr uint32_t kSpinsPerCheck = 64;

struct Waiter {
  const PeerTable* peers;
  RunStatus* status;    // mapped host memory
  uint32_t* claim;      // device word: nonzero once a wait of this communicator has run out
  uint64_t timeout_ns;
  int rank;

  // Spins until *flag >= target (acquire, system scope): true. False when the wait ran out (recorded
  // as above) or another wait of this communicator already did. `what`/`peer` only feed the record.
  __device__ __forceinline__ bool until(const uint64_t* flag, uint64_t target, WaitKind what, int peer) const {
    if (load_acquire_sys(flag) >= target) return true;
    const uint64_t start = global_timer_ns();
    for (uint32_t spins = 1;; ++spins) {
      if (load_acquire_sys(flag) >= target) return true;
      if (spins % kSpinsPerCheck == 0) {
        if (global_timer_ns() - start > timeout_ns) {  // first: a wait that ran out says so (stuck_on)
          StuckWait w;
          for (int q = 0; q < kMaxRanks; ++q) w.signal[q] = q < peers->nranks ? peers->signal[q] : nullptr;
          w.status = status;
          w.claim = claim;
          w.flag = flag;
          w.target = target;
          w.timeout_ns = timeout_ns;
          w.nranks = peers->nranks;
          w.rank = rank;
          w.peer = peer;
          w.what = what;
          give_up(w);
          return false;
        }
        if (load_volatile(claim) != 0u) {  // another wait ran out: say whom this one waits for, then give up
          store_release_sys(&peers->signal[rank]->stuck_on, static_cast<uint64_t>(peer) + 1);
          return false;
        }
      }
    }
  }
};

// The waiter of rank `rank` in launch `a`.
__device__ __forceinline__ Waiter waiter_of(const CollArgs& a, int rank) {
  return Waiter{&a.peers, a.peers.status, a.peers.claim, a.timeout_ns, rank};
}

// Barrier between block blockIdx.x of every rank. On entry every write this block made (to its own
// staging or a peer's) is released to the whole system; on exit every peer's block has entered, so
// their earlier writes are visible here. Cost: one remote 8-byte store and one poll per peer.
// Memory order: __syncthreads orders the block's accesses before thread q's st.release.sys (release is
// cumulative over what the barrier made visible to it); thread q's ld.acquire.sys then the closing
// __syncthreads order the peers' writes before every later access of the block.
// Invariant: all ranks run the same number of barriers per block index (same nblocks, same count), so
// epoch[b] is equal on all and arrive[b][q] only grows. Only block b of each rank is synchronised:
// whatever staging a block touches after a barrier must be what block b of the peers touched before it
// (the fixed partition of oneshot.cu and twoshot.cu). Returns false (block-uniform) when a wait ran
// out: the caller returns at once.
__device__ __forceinline__ bool block_barrier(const Waiter& w) {
  Signal* self = w.peers->signal[w.rank];
  const int b = blockIdx.x;
  __syncthreads();  // the block's writes happen before thread q's release (PTX release is cumulative)
  const uint64_t target = self->epoch[b] + 1;
  bool ok = true;
  if (threadIdx.x < w.peers->nranks) {
    const int q = threadIdx.x;
    store_release_sys(&w.peers->signal[q]->arrive[b][w.rank], target);
    ok = w.until(&self->arrive[b][q], target, WaitKind::Barrier, q);
  }
  const bool failed = __syncthreads_or(!ok);
  if (threadIdx.x == 0) self->epoch[b] = target;
  return !failed;
}

// block_range (schedule.h) in whole packs of T.
template <class T> __device__ __forceinline__ void block_part(size_t len, int b, int nblocks, size_t* begin,
                                                               size_t* end) {
  block_range(len, b, nblocks, Pack<T>::N, begin, end);
}

}  // namespace ringzero::cuda
