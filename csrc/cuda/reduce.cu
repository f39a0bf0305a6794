// The standalone reduction kernel: each block takes one contiguous part in whole 16-byte packs and
// streams it with reduce_span (fp32 accumulation for 16-bit types, fused divide for Avg).
// Bytes moved: (nsrc + 1) x count x element size; enough blocks to fill every SM several times so the
// loads of all sources are in flight together. Loads and stores are already 16-byte (reduce_span);
// measured 2.50 TB/s = 83% of copy bandwidth on an H100 (benchmarks/RESULTS.md), short of the 90% goal. Not tried
// yet, for want of a GPU to measure: two packs in flight per thread (unrolled loop) and plain (.ca)
// loads for user inputs that no peer rewrites during the kernel.
#include "cuda/dispatch.cuh"
#include "cuda/reduce.h"

namespace ringzero::cuda {
namespace {

struct ReduceArgs {
  const void* srcs[kMaxRanks];
  int nsrc;
  void* dst;
  size_t count;
  int divisor;
};

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) reduce_kernel(ReduceArgs a) {
  size_t begin, end;
  block_part<T>(a.count, blockIdx.x, gridDim.x, &begin, &end);
  Span<T> s{};
  for (int i = 0; i < a.nsrc; ++i) s.src[i] = static_cast<const T*>(a.srcs[i]) + begin;
  s.nsrc = a.nsrc;
  s.dst[0] = static_cast<T*>(a.dst) + begin;
  s.ndst = 1;
  reduce_span<T, Op>(s, end - begin, a.divisor);
}

// Elements per block below which more blocks only add launch cost (one pack per thread, 4 rounds).
constexpr size_t kPacksPerThread = 4;

}  // namespace

cudaError_t launch_reduce(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                          int divisor, cudaStream_t stream) {
  if (nsrc < 1 || nsrc > kMaxRanks) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  ReduceArgs a{};
  for (int i = 0; i < nsrc; ++i) a.srcs[i] = srcs[i];
  a.nsrc = nsrc;
  a.dst = dst;
  a.count = count;
  a.divisor = divisor;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const size_t bytes = count * dtype_size(dtype);
  const size_t per_block = static_cast<size_t>(kThreads) * kPackBytes * kPacksPerThread;
  size_t blocks = (bytes + per_block - 1) / per_block;
  const size_t most = static_cast<size_t>(sms > 0 ? sms : 1) * 8;  // 8 waves of blocks keep HBM busy
  if (blocks > most) blocks = most;
  return dispatch(dtype, op, [&](auto tag, auto o) {
    using T = typename decltype(tag)::type;
    return launch_kernel<reduce_kernel<T, decltype(o)>>(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream, a);
  });
}

}  // namespace ringzero::cuda
