// Block quantization on the GPU (layer 2: CUDA runtime only): ZeRO++'s int8 weights and int4/int8
// gradients. The format is the CPU kernels' (csrc/core/reduce.h quantize_blocks; the layout and the
// error bound: python/ringzero/parallel/data_parallel/quantize.py), and the results are the same bit for
// bit: the same float32 operations, each correctly rounded (no contraction into FMAs), and rounding to
// nearest-even.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ringzero::cuda {

// Bytes of one packed row of n values: the integers of ceil(n / block) whole blocks, then their float32
// scales.
inline size_t quantized_row_bytes(size_t n, int bits, size_t block) {
  const size_t nblk = (n + block - 1) / block;
  return nblk * block * static_cast<size_t>(bits) / 8 + 4 * nblk;
}

// out (rows x quantized_row_bytes(n), 4-byte aligned) = each row of x (rows x n float32, contiguous)
// block-quantized. bits: 8 or 4; block: a positive multiple of 8. cudaErrorInvalidValue otherwise.
cudaError_t launch_quantize_blocks(const float* x, size_t rows, size_t n, int bits, size_t block, uint8_t* out,
                                   cudaStream_t stream);

// out (rows x n float32) = the values of launch_quantize_blocks' rows in `packed`.
cudaError_t launch_dequantize_blocks(const uint8_t* packed, size_t rows, size_t n, int bits, size_t block, float* out,
                                     cudaStream_t stream);

}  // namespace ringzero::cuda
