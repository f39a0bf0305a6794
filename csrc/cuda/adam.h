// The fused Adam/AdamW step and the sum-of-squares pass on the GPU (layer 2: CUDA runtime only).
// Launchers take raw pointers, counts, dtypes and a stream, and return the first CUDA error.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/adam.h"
#include "core/types.h"

namespace ringzero {

// Scalars that may live on the device (CUDA-graph friendly: no host read). A null pointer means
// "use the host value" in AdamHostScalars. All are float32 scalars on the same device as the buffers.
struct AdamDeviceScalars {
  const float* lr = nullptr;
  const float* step = nullptr;       // the step count after incrementing (1 on the first step)
  const float* inv_scale = nullptr;  // loss-scale reciprocal
  const float* clip_coef = nullptr;  // gradient clipping coefficient (min(1, max_norm / norm))
  const float* found_inf = nullptr;  // non-zero: the whole step is skipped
};

struct AdamHostScalars {
  float lr, beta1, beta2, eps, weight_decay, step;
  bool adamw, maximize;
  float inv_scale, clip_coef;
};

// One tensor of a multi-tensor step: its flat buffers (same contract as the CPU adam_step), its
// element count, and its own step count on the device (null: the call's step, device or host).
// Per-tensor steps let an optimizer keep torch's per-parameter `step` and still step a whole
// bucket in one launch.
struct AdamTensor {
  AdamBuffers buffers;
  size_t count;
  const float* step;
};

// Multi-tensor launch geometry (the same idea as apex's and torch's multi_tensor_apply; our numbers):
// - kAdamChunkElems = 16384 elements per unit of work: a block streams one chunk at a time, 16
//   passes of 256 threads x 4 elements; small enough that a launch's last tensor still spreads over
//   many blocks, large enough that finding a chunk's tensor (a forward scan, at most one step per
//   tensor) and its bias corrections are noise.
// - kAdamTensorsPerLaunch = 32 tensors per launch: the table of 7 pointers, a count and a chunk
//   offset per tensor is about 2.2 KB of kernel arguments, under the 4 KB every architecture and
//   driver accepts; 32 tensors of 1M elements are 0.9 GB of traffic per launch, so the ~4 us launch
//   is below 1% of it at HBM speed.
constexpr size_t kAdamChunkElems = 16384;
constexpr int kAdamTensorsPerLaunch = 32;

// One Adam step over every tensor of `tensors` (n entries): one launch per kAdamTensorsPerLaunch
// tensors of one dtype combination (params, grads, moments, param_out), empty tensors skipped. Bytes
// per parameter as on the CPU: 28 B for float32 everything; with bfloat16 grads and a bfloat16
// param_out beside a float32 master: 2 + 8 + 16 + 2 = 28 B.
cudaError_t adam_step_multi_cuda(const AdamTensor* tensors, size_t n, const AdamHostScalars& h,
                                 const AdamDeviceScalars& d, cudaStream_t stream);

// One Adam step over `count` elements of the flat buffers in `b`: adam_step_multi_cuda of one tensor.
cudaError_t adam_step_cuda(const AdamBuffers& b, size_t count, const AdamHostScalars& h,
                           const AdamDeviceScalars& d, cudaStream_t stream);

// *out += sum over every tensor of sum(x[i]^2) in float32 (block partials added atomically: order not
// deterministic), and *found_inf = 1 when some element is inf or NaN (found_inf may be null). One
// read of each x; one launch per kAdamTensorsPerLaunch tensors.
cudaError_t sum_squares_multi_cuda(const void* const* xs, const DType* dtypes, const size_t* counts, size_t n,
                                   float* out, float* found_inf, cudaStream_t stream);

}  // namespace ringzero
