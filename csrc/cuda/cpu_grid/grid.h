// The CPU grid: what layer 2's CUDA source uses of CUDA, for the host C++ compiler, so that the same
// kernels and launchers run without a GPU (RINGZERO_CPU_GRID builds only; the headers in include/
// stand in for <cuda_runtime.h>, <cuda_bf16.h> and <cuda_fp16.h>). CI proves the kernels' logic and
// their memory ordering between ranks and blocks here; it says nothing of their speed.
//
// [Note: the CPU grid's execution model]
// - A block is an OS thread; every block of a launch runs at once (the protocols spin on each other,
//   so they need co-residency, as on the GPU). Ranks launched from different host threads (PeerComm)
//   are different grids running at once; simulated ranks (SimWorld) are one grid.
// - The CUDA threads of a block are fibers of that OS thread, switched cooperatively at __syncthreads,
//   at every poll of a flag (load_acquire_sys: a spinning wait always lets the block's other threads
//   and, once a whole round only polled, the other blocks' OS threads run), and, with chaos on, at
//   random sync points in a random order. Why not an OS thread per CUDA thread: 8 ranks x 8 blocks x
//   512 threads is 32768 threads on 2 cores; fibers cost a few ns per switch, and keeping blocks as
//   OS threads keeps the races that matter (between ranks and blocks) truly concurrent, where the
//   hardware's memory order and ThreadSanitizer both see them.
// - Memory order, never stronger than PTX gives: .cg loads and stores are plain accesses (a missing
//   flag makes them a data race), ld.acquire.sys / st.release.sys are C++ acquire loads / release
//   stores, volatile flag reads and atomicCAS/atomicAdd are relaxed atomics, __threadfence_system is a
//   seq_cst fence. __syncthreads is the block's barrier (a release by every arriving thread, an
//   acquire by every leaving one). Under ThreadSanitizer every fiber is a TSan thread of its own and
//   switches carry no synchronisation, so a missing __syncthreads is reported as a race too. TSan
//   does not model fences (gcc warns): the kernels' one __threadfence_system orders the timeout record
//   for the host, which reads it after the launch's threads have joined, so nothing rests on it there.
// - __shared__ is thread_local: one copy per block's OS thread, shared by its fibers.
// - Streams are asynchronous in-order queues, each with a worker thread of its own (runtime.cpp):
//   launches, async copies and sets, graph launches, event records and waits are queued and the
//   caller returns at once; a launch's configuration error still returns from the call, as CUDA's.
//   An event record is a marker in the queue; cudaStreamWaitEvent holds the stream until the record
//   that was the event's latest at the call has run. Stream 0 is the legacy default stream: its work
//   waits for the work queued before on every blocking stream, and theirs for its (non-blocking
//   streams are exempt). There is one per host thread, since a host thread stands for a process of
//   its own (PeerComm's ranks). cudaMemcpy and cudaMemset are legacy-stream work; a copy to the host
//   returns complete, others return at once. cudaFree synchronises the device first, as CUDA's does.
//   Host waits and queued waits abort after 300 s, naming the call. With chaos on, a worker pauses a
//   random while before each item, so work on other streams overtakes it. A stream under capture
//   records its work into a graph that cudaGraphLaunch queues (one stream only: an event record or
//   wait on a capturing stream is refused). Kernels on different streams run at once with no limit
//   of multiprocessors between them. The "device" has RINGZERO_CPU_GRID_SMS multiprocessors (default
//   64) holding one block each per launch: resident-block arithmetic and clamping run as on a GPU.
//
// [Note: device memory on the CPU grid]
// What a GPU forbids and the grid makes fail, so that a test on the grid sees it (runtime.cpp):
// - Host code may not touch device memory. cudaMalloc's memory is a mapping of its own that is
//   inaccessible (PROT_NONE) from the moment a host synchronisation (cudaStreamSynchronize,
//   cudaDeviceSynchronize, cudaEventSynchronize, a cudaMemcpy to the host, cudaFree) finds no device
//   work running until a stream's worker starts its next item (a kernel, an async copy or set). A
//   host read or write then faults, and the grid's SIGSEGV handler names the allocation and exits with
//   status 86. While device work runs, and until the host next synchronises, the memory is open to
//   every thread (protection is per process, and this CPU has no per-thread protection keys), so a
//   host access in that window is not caught: the guard is sure where tests read their results, after
//   a synchronisation. cudaHostAlloc's memory is host memory and stays readable.
// - IPC follows CUDA's rules between "processes": a handle is only of an allocation's base; the
//   process that allocated may not open its own handle (cudaErrorDeviceUninitialized, the driver's
//   invalid context); a process may hold one open mapping of a handle (a second open is
//   cudaErrorAlreadyMapped, as drivers before reference-counted opens answer; ringzero opens each
//   peer once, which is right on both); a handle of freed memory does not open
//   (cudaErrorMapBufferObjectFailed); only an open mapping closes. A host thread is a process of its
//   own unless it says otherwise (set_process).
// - An opened handle is a second mapping of the same pages at another address (mremap), as another
//   process gets, and closing it leaves its addresses reserved and inaccessible, so a kernel that still
//   uses a closed mapping faults at once, named by the handler. Under ThreadSanitizer the opened
//   pointer is the allocation's own (TSan keys races by address: an alias would hide every race
//   between a rank and the peers that write into its memory), so there a closed mapping stays usable:
//   the plain build proves that rule.
#pragma once
#ifndef RINGZERO_CPU_GRID
#error "cuda/cpu_grid/grid.h is the CPU grid's; build with -DRINGZERO_CPU_GRID"
#endif

#include <math.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <type_traits>

// ---- keywords ------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local  // one per block: a block is one OS thread ([Note] above)

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

namespace ringzero::cpu_grid {

struct Coords {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
};
// The coordinates of the running CUDA thread (a fiber); relaxed atomic: the block's scheduler writes
// it between fibers, which ThreadSanitizer sees as different threads.
extern thread_local std::atomic<const Coords*> t_coords;
inline const Coords& coords() { return *t_coords.load(std::memory_order_relaxed); }

// The block barrier (pred: __syncthreads_or) and the warp barrier of the calling thread.
int sync_block(int pred);
void sync_warp();
// A poll of a flag: the thread yields to its block's other threads (and the block to other blocks
// when nothing else moves). Called before every acquire load, so a spinning wait never starves.
void poll_point();
// A synchronisation point (release store, atomic, barrier entry): with chaos on, maybe a yield or a
// short stall, to vary interleavings. No-op outside a kernel.
void sync_point();
// Scratch for warp shuffles: one slot per thread of the running block.
uint64_t* shuffle_slots();

// Test controls (not CUDA): chaos (0: off; otherwise the seed of random yields, stalls and fiber order;
// RINGZERO_CPU_GRID_CHAOS sets it at start), and a block size that replaces every launch's block size
// (0: none; RINGZERO_CPU_GRID_THREADS), to run the kernels with odd block sizes.
void set_chaos(uint64_t seed);
uint64_t chaos_seed();
void set_block_threads(unsigned threads);
unsigned block_threads();
// The process the calling host thread acts for, as far as IPC's rules go ([Note: device memory on the
// CPU grid]): 0 (the default) makes each host thread a process of its own; a rank's threads that
// should share one process (its setup thread, its launching threads, its teardown) set the same id.
void set_process(uint64_t id);
// Kernels launched so far, by full name (template arguments included), and how often.
std::map<std::string, uint64_t> launched_kernels();
// Writes launched_kernels() to RINGZERO_CPU_GRID_KERNEL_LOG (one "count<TAB>name" line each) when set.
void write_kernel_log();

}  // namespace ringzero::cpu_grid

#define threadIdx (::ringzero::cpu_grid::coords().thread_idx)
#define blockIdx (::ringzero::cpu_grid::coords().block_idx)
#define blockDim (::ringzero::cpu_grid::coords().block_dim)
#define gridDim (::ringzero::cpu_grid::coords().grid_dim)

inline void __syncthreads() { ::ringzero::cpu_grid::sync_block(0); }
inline int __syncthreads_or(int pred) { return ::ringzero::cpu_grid::sync_block(pred != 0); }
inline void __threadfence_system() {
  ::ringzero::cpu_grid::sync_point();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// Warp shuffle (xor): every lane of the warp must call it (full warps only, as the kernels use it).
template <class T> inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of up to 8 bytes");
  using namespace ::ringzero::cpu_grid;
  uint64_t* slots = shuffle_slots();
  const unsigned tid = threadIdx.x;
  uint64_t mine = 0;
  std::memcpy(&mine, &v, sizeof(T));
  slots[tid] = mine;
  sync_warp();
  const unsigned src = tid ^ static_cast<unsigned>(lane_mask);
  const uint64_t got = src < blockDim.x ? slots[src] : mine;
  sync_warp();  // every lane has read before any lane's next shuffle overwrites its slot
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

// A GPU faults on a load or store whose address is not a multiple of its size ("misaligned address",
// the kernel and its context lost); x86 does not, so the grid checks: a misaligned access aborts the
// test at once, naming the address and the width, whatever code the compiler made of it.
namespace ringzero::cpu_grid {
[[noreturn]] void misaligned_access(const void* p, size_t width, const char* what);
}
template <class T> inline void check_aligned_access(const T* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) ringzero::cpu_grid::misaligned_access(p, alignof(T), what);
}

// Loads and stores through L2 (.cg): plain accesses here (the flags order them, or nothing does).
template <class T> inline T __ldcg(const T* p) {
  check_aligned_access(p, "__ldcg");
  return *p;
}
template <class T> inline void __stcg(T* p, T v) {
  check_aligned_access(p, "__stcg");
  *p = v;
}

// Bit casts of float32 (atomicAdd's CAS loop, the 16-bit conversions below).
namespace ringzero::cpu_grid {
inline uint32_t f32_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float f32_of_bits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}  // namespace ringzero::cpu_grid

// Device atomics: relaxed, as CUDA's atomicCAS/atomicAdd are.
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  ::ringzero::cpu_grid::sync_point();
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
inline float atomicAdd(float* p, float v) {
  ::ringzero::cpu_grid::sync_point();
  using ::ringzero::cpu_grid::f32_bits, ::ringzero::cpu_grid::f32_of_bits;
  uint32_t old = __atomic_load_n(reinterpret_cast<uint32_t*>(p), __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(reinterpret_cast<uint32_t*>(p), &old, f32_bits(f32_of_bits(old) + v), false,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return f32_of_bits(old);  // the value before the add, as CUDA's atomicAdd returns
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// ---- bfloat16 and float16: storage types, round-to-nearest-even conversions -----------------------
struct alignas(2) __nv_bfloat16 {
  uint16_t bits;
};
struct alignas(2) __half {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  return ::ringzero::cpu_grid::f32_of_bits(static_cast<uint32_t>(h.bits) << 16);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t x = ::ringzero::cpu_grid::f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((x >> 16) | 0x40)};  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return {static_cast<uint16_t>(x >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu, x;
  if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    x = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    x = sign;
  } else {  // subnormal: normalise
    uint32_t e = 113;
    while (!(mant & 0x400u)) mant <<= 1, --e;
    x = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return ::ringzero::cpu_grid::f32_of_bits(x);
}
inline __half __float2half_rn(float f) {
  const uint32_t x = ::ringzero::cpu_grid::f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
  if (exp == 0xff) return {static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u))};
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return {static_cast<uint16_t>(sign | 0x7c00u)};  // overflow: infinity
  if (e <= 0) {                                                   // subnormal or zero
    if (e < -10) return {sign};
    const uint32_t m = mant | 0x800000u;
    const int shift = 14 - e;
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return {static_cast<uint16_t>(sign | h)};
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return {static_cast<uint16_t>(sign | h)};
}
inline __half __float2half(float f) { return __float2half_rn(f); }

// ---- the runtime API subset layer 2, layer 3's loopback driver and the C++ tests use ------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorDeviceUninitialized = 201,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorAlreadyMapped = 208,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorCooperativeLaunchTooLarge = 720,
  cudaErrorNotReady = 600,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2;
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 1;

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
struct cudaIpcMemHandle_t {
  char reserved[64];
};

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemset(void* p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p);
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void* p);
template <class K>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, K, int, size_t) {
  *blocks = 1;  // one resident block per multiprocessor ([Note] above)
  return cudaSuccess;
}

namespace ringzero::cpu_grid {

// Runs (or, on a stream under capture, records) `body` once per CUDA thread of a grid x block launch.
cudaError_t launch(const char* kernel, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body);
// Queues host work on a stream (its worker runs it in order), or into the graph under capture.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work);
// Sets what cudaGetLastError returns next (this host thread), and returns e.
cudaError_t record_error(cudaError_t e);
// The emulated device's multiprocessors (RINGZERO_CPU_GRID_SMS), one resident block each.
int multiprocessors();

template <auto K> const char* kernel_name() { return __PRETTY_FUNCTION__; }

}  // namespace ringzero::cpu_grid
