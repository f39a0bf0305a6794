// The few primitives through which layer 2's kernels reach the hardware, with two back ends: the GPU
// (nvcc: PTX flags, the global timer, <<<>>> launches) and the CPU grid (RINGZERO_CPU_GRID: C++
// atomics no stronger than the PTX they stand for, fibers and OS threads; cuda/cpu_grid/grid.h says
// how). The kernels use these and CUDA's own names (threadIdx, __syncthreads, __ldcg, atomicCAS ...),
// which the CPU grid defines too: one kernel source, two back ends.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(RINGZERO_CPU_GRID)
#include <chrono>
#endif

// A device function kept out of line (GCC's own headers use __noinline__ as an attribute name, so the
// CPU grid cannot define that word).
#if !defined(RINGZERO_CPU_GRID)
#define RINGZERO_NOINLINE __noinline__
#else
#define RINGZERO_NOINLINE __attribute__((noinline))
#endif

namespace ringzero::cuda {

#if !defined(RINGZERO_CPU_GRID)

// Release store / acquire load, system scope: the flags between ranks (peer memory) and blocks.
__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// A volatile read: relaxed, for a word that only says "give up" (it orders nothing).
__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) { return *reinterpret_cast<const volatile uint32_t*>(p); }
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The base of an array read and written in whole packs (p[j] for Pack* p): the GPU faults on a pack
// whose address is not a multiple of its alignment; the grid checks the base (every p[j] keeps its
// alignment) and aborts at once.
template <class T> __device__ __forceinline__ T* pack_base(T* p) { return p; }

// Kernel<<<grid, block, 0, stream>>>(args...): the one launch form of layer 2.
template <auto Kernel, class... Args>
inline cudaError_t launch_kernel(dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  Kernel<<<grid, block, 0, stream>>>(args...);
  return cudaGetLastError();
}

#else  // the CPU grid

inline void store_release_sys(uint64_t* p, uint64_t v) {
  cpu_grid::sync_point();
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
inline uint64_t load_acquire_sys(const uint64_t* p) {
  cpu_grid::poll_point();
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
inline uint32_t load_volatile(const uint32_t* p) {
  cpu_grid::poll_point();
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
inline uint64_t global_timer_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

template <class T> inline T* pack_base(T* p) {
  check_aligned_access(p, "a pack array");
  return p;
}

template <auto Kernel, class... Args>
inline cudaError_t launch_kernel(dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  return cpu_grid::launch(cpu_grid::kernel_name<Kernel>(), grid, block, stream, [=]() { Kernel(args...); });
}

#endif

}  // namespace ringzero::cuda
