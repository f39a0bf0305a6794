// The element-wise reduction kernel of layer 2 on its own: what the NCCL ring driver runs between
// steps, and what the benchmark measures against the device-to-device copy bandwidth.
#pragma once
#include <cuda_runtime.h>

#include "core/types.h"

namespace ringzero::cuda {

// dst[i] = op(srcs[0][i], ..., srcs[nsrc-1][i]) on `stream`, sources combined in index order; 16-bit
// floats accumulate in float32; divisor > 1 divides the result (Avg: pass Sum or Avg with divisor).
// 1 <= nsrc <= kMaxRanks; dst may alias a source. dtype: float32, bfloat16, float16, int32, int64.
// Bytes moved: (nsrc + 1) * count * dtype_size.
cudaError_t launch_reduce(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                          int divisor, cudaStream_t stream);

}  // namespace ringzero::cuda
