// The fused Adam/AdamW step and the sum-of-squares pass on the GPU (layer 2: CUDA runtime only).
// Launchers take raw pointers, counts, dtypes and a stream, and return the first CUDA error.
#pragma once
#include <cuda_runtime.h>

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

// One Adam step over `count` elements of the flat buffers in `b` (same contract as the CPU
// adam_step). Bytes moved per parameter as on the CPU: 28 B for float32 everything; with bfloat16
// grads and a bfloat16 param_out beside a float32 master: 2 + 8 + 16 + 2 = 28 B.
cudaError_t adam_step_cuda(const AdamBuffers& b, size_t count, const AdamHostScalars& h,
                           const AdamDeviceScalars& d, cudaStream_t stream);

// *out += sum(x[i]^2) in float32 (block partials added atomically: order not deterministic), and
// *found_inf = 1 when some element is inf or NaN (found_inf may be null). One read of x.
cudaError_t sum_squares_cuda(const void* x, DType dtype, size_t count, float* out, float* found_inf,
                             cudaStream_t stream);

}  // namespace ringzero
