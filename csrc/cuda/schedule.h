// The slice arithmetic of the one-shot and two-shot kernels, host and device (plain C++ without nvcc),
// so that tests/cpp/test_cuda_schedule.cpp checks on any machine the very functions the kernels use:
// which part of the staging buffer each block owns in each slice.
#pragma once
#include <cstddef>

#if defined(__CUDACC__)
#define RINGZERO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RINGZERO_HOST_DEVICE inline
#endif

namespace ringzero::cuda {

// The common length of the slices of a `count`-element message streamed through a slot of `slot`
// elements: nslices = ceil(count / slot), each ceil(count / nslices) rounded up to `multiple` (at most
// slot when slot is a multiple of it). Every slice but the last has exactly this length, so a block
// can own the same part of every slice ([Note: fixed slice partition] in oneshot.cu). count > 0.
RINGZERO_HOST_DEVICE size_t even_slice(size_t count, size_t slot, size_t multiple) {
  const size_t nslices = (count + slot - 1) / slot;
  const size_t each = (count + nslices - 1) / nslices;
  return (each + multiple - 1) / multiple * multiple;
}

// The part [begin, end) of `len` elements that block `b` of `nblocks` owns, in whole packs of `pack`
// elements, so that the same block index owns the same elements on every rank (per-block barriers
// then suffice).
RINGZERO_HOST_DEVICE void block_range(size_t len, int b, int nblocks, size_t pack, size_t* begin, size_t* end) {
  const size_t per = (len + nblocks * pack - 1) / (nblocks * pack) * pack;
  *begin = per * b < len ? per * b : len;
  *end = *begin + per < len ? *begin + per : len;
}

}  // namespace ringzero::cuda
