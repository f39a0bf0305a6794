// Turns the run-time (dtype, op) of a call into template arguments, once, for every launcher of layer 2.
// The CUDA path covers float32, bfloat16, float16, int32 and int64; other dtypes
// return cudaErrorInvalidValue and Python never sends them here.
#pragma once
#include <cuda_runtime.h>

#include "core/types.h"
#include "cuda/device.cuh"

namespace ringzero::cuda {

template <class T> struct Tag { using type = T; };

template <class T, class F> cudaError_t dispatch_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return f(Tag<T>{}, SumOp{});
    case ReduceOp::Min: return f(Tag<T>{}, MinOp{});
    case ReduceOp::Max: return f(Tag<T>{}, MaxOp{});
    case ReduceOp::Prod: return f(Tag<T>{}, ProdOp{});
  }
  return cudaErrorInvalidValue;
}

// f(Tag<T>, Op) -> cudaError_t, called with the element type and operator of (dtype, op).
template <class F> cudaError_t dispatch(DType dtype, ReduceOp op, F&& f) {
  switch (dtype) {
    case DType::F32: return dispatch_op<float>(op, f);
    case DType::BF16: return dispatch_op<__nv_bfloat16>(op, f);
    case DType::F16: return dispatch_op<__half>(op, f);
    case DType::I32: return dispatch_op<int32_t>(op, f);
    case DType::I64: return dispatch_op<int64_t>(op, f);
    default: return cudaErrorInvalidValue;
  }
}

// Blocks of `kernel` (kThreads each) that fit on the device at once. Every rank's blocks spin on each
// other, so a grid must never exceed this (simulated ranks share one GPU: divide by their number).
template <class K> int resident_blocks(K kernel) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess) return 0;
  return sms * per_sm;
}

// Launches Kernel<<<(nblocks, grid_y), kThreads>>>(args) after clamping nblocks to what stays resident.
// The kernel is a template argument so that each kernel caches its own occupancy.
// may_shrink = false (the ring, whose FIFO layout depends on the channel count): refuse instead.
// Co-residency: with simulated ranks, block (b, q) spins on block (b, q') of
// the same grid, so all nblocks x grid_y blocks must be on the SMs at once; nblocks x grid_y <= SMs x
// occupancy guarantees that on an otherwise idle GPU (and the ring's channel count is fixed below
// SMs / grid_y by SimWorld, one block per SM always fitting). Kernels of other streams holding SMs
// only delay the late blocks until they finish; should those never finish (they wait on us), every
// wait still ends after timeout_ns with CommTimeout, never a hang. A real rank (grid_y = 1) has no
// wait between its own blocks.
template <void (*Kernel)(CollArgs)>
cudaError_t launch_resident(CollArgs args, int grid_y, cudaStream_t stream, bool may_shrink = true) {
  static const int resident = resident_blocks(Kernel);  // same GPU model on every rank: same grid
  int limit = resident / grid_y;
  if (limit > kMaxBlocks) limit = kMaxBlocks;
  if (limit < 1) return cudaErrorCooperativeLaunchTooLarge;
  if (args.nblocks > limit) {
    if (!may_shrink) return cudaErrorCooperativeLaunchTooLarge;
    args.nblocks = limit;
  }
  if (args.nblocks < 1) args.nblocks = 1;
  return launch_kernel<Kernel>(dim3(args.nblocks, grid_y), dim3(kThreads), stream, args);
}

// The launcher of every collective kernel: K<T, Op>::kernel is the kernel for (dtype, op).
template <template <class, class> class K>
cudaError_t launch_typed(const CollArgs& args, int grid_y, DType dtype, ReduceOp op, cudaStream_t stream,
                         bool may_shrink = true) {
  return dispatch(dtype, op, [&](auto tag, auto o) {
    return launch_resident<K<typename decltype(tag)::type, decltype(o)>::kernel>(args, grid_y, stream, may_shrink);
  });
}

}  // namespace ringzero::cuda
