// Element-wise reduction kernels for the CPU: the arithmetic of every collective.
// The loops are compiled three times (baseline x86-64, x86-64-v3 = AVX2+F16C+FMA, x86-64-v4 = AVX-512)
// and one table is chosen at first use from the running CPU, so the binary runs on any x86-64.
#pragma once
#include "types.h"

namespace ringzero {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]), sources combined in index order.
// 16-bit floats accumulate in float32 and round once. divisor > 1 divides the result (Avg at the last
// write; integers truncate toward zero as NCCL does). dst may alias any source (element-wise).
// Bytes moved: (nsrc + 1) * count * dtype_size.
// op must be Sum, Min, Max or Prod: callers turn Avg into Sum plus divisor.
void reduce_n(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
              int divisor);

// dst[i] /= divisor (the Avg epilogue where the last write was not a reduction).
void divide_inplace(void* dst, size_t count, DType dtype, int divisor);

// Block quantization (ZeRO++: python/ringzero/parallel/data_parallel/quantize.py gives the format): n
// float32 values in blocks of `block` (a multiple of 8), each block as signed `bits`-bit integers (8 or 4;
// 4 bits packed two per byte, q + 8 in the low nibble first) in q (ceil(n / block) * block * bits / 8
// bytes, zero-padded) and one float32 scale (max |x| / (2^(bits-1) - 1)) in scales. A block holding a
// non-finite value gets a NaN scale.
void quantize_blocks(const float* x, size_t n, int bits, size_t block, uint8_t* q, float* scales);
// out[i] = q[i] * scale of its block, for the n values quantize_blocks wrote.
void dequantize_blocks(const uint8_t* q, const float* scales, size_t n, int bits, size_t block, float* out);

// The instruction set the table was built for: "avx512", "avx2" or "baseline".
const char* reduce_isa();

// Kernel table for one instruction set (defined once per ISA translation unit).
struct ReduceTable {
  void (*reduce_n)(void*, const void* const*, int, size_t, DType, ReduceOp, int);
  void (*divide_inplace)(void*, size_t, DType, int);
  void (*quantize_blocks)(const float*, size_t, int, size_t, uint8_t*, float*);
  void (*dequantize_blocks)(const uint8_t*, const float*, size_t, int, size_t, float*);
};

}  // namespace ringzero
