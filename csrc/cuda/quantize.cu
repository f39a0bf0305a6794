// Block quantization kernels (cuda/quantize.h): one CUDA block per quantization block at a time, blocks
// striding over every (row, block) pair of the call. A block of `block` values: each thread takes values
// threadIdx.x, + blockDim.x, ...; the block maximum of |x| and the "some value is not finite" flag are
// reduced in shared memory (both exact in any order); then every thread writes its integers (8 bits: one
// byte per value; 4 bits: one byte per pair of values) and thread 0 the scale. Any block size works (the
// CPU grid runs them with odd ones); the launcher uses kQuantThreads.
//
// The arithmetic is the CPU loops' (csrc/core/quantize_kernels.inc), so the bytes are equal: scale = amax /
// L and inv = L / amax (correctly rounded divisions), q = round-to-nearest-even(clamp(x * inv, -L, L)) with
// the product rounded on its own (mul_rn: never fused into an FMA), x' = q * scale. A block holding a NaN
// or an infinity gets a NaN scale and zero integers (8 bits) or 0x88 bytes (4 bits: q + 8 = 8, the zero).
// Bytes moved: 4 + bits/8 per value, plus 4 per block.
#include "cuda/portable.cuh"
#include "cuda/quantize.h"

#include <math.h>

namespace ringzero::cuda {
namespace {

constexpr int kQuantThreads = 128;  // per block as launched; the kernels work with any block size up to
constexpr int kMaxBlockThreads = 1024;  // CUDA's limit (the CPU grid's tests run them with other sizes)

struct QuantArgs {
  const float* x;       // quantize: rows x n values
  const uint8_t* in;    // dequantize: rows x row_bytes packed
  uint8_t* out;         // quantize: rows x row_bytes packed
  float* values;        // dequantize: rows x n values
  size_t n, block, nblk, total, qbytes, row_bytes;
};

__device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(RINGZERO_CPU_GRID)
  return a * b;  // the host compiler contracts nothing here: no add follows
#else
  return __fmul_rn(a, b);
#endif
}

// clamp(v, -level, level) rounded to the nearest integer, ties to even.
__device__ __forceinline__ int round_level(float v, float level) {
  v = v < -level ? -level : (v > level ? level : v);
#if defined(RINGZERO_CPU_GRID)
  return static_cast<int>(nearbyintf(v));  // the default rounding mode: to nearest, ties to even
#else
  return __float2int_rn(v);
#endif
}

template <int Bits>
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(QuantArgs a) {
  __shared__ float s_amax[kMaxBlockThreads];
  __shared__ int s_bad[kMaxBlockThreads];
  const float level = Bits == 8 ? 127.0f : 7.0f;
  const int t = threadIdx.x;
  for (size_t q = blockIdx.x; q < a.total; q += gridDim.x) {
    const size_t r = q / a.nblk, b = q % a.nblk;
    const float* xb = a.x + r * a.n + b * a.block;
    const size_t m = a.n - b * a.block < a.block ? a.n - b * a.block : a.block;
    uint8_t* row = a.out + r * a.row_bytes;
    uint8_t* qb = row + b * a.block * Bits / 8;
    float amax = 0.0f;
    int bad = 0;
    for (size_t i = t; i < m; i += blockDim.x) {
      const float v = xb[i];
      if (!isfinite(v)) bad = 1;
      const float av = fabsf(v);
      amax = amax > av ? amax : av;
    }
    s_amax[t] = amax;
    s_bad[t] = bad;
    __syncthreads();
    for (int width = blockDim.x; width > 1;) {  // a tree over any block size: fold the top half onto the bottom
      const int half = (width + 1) / 2;
      if (t < width - half) {
        s_amax[t] = s_amax[t] > s_amax[t + half] ? s_amax[t] : s_amax[t + half];
        s_bad[t] |= s_bad[t + half];
      }
      __syncthreads();
      width = half;
    }
    amax = s_amax[0];
    bad = s_bad[0];
    __syncthreads();  // every thread has read them before the next block's values overwrite them
    const size_t nbytes = a.block * Bits / 8;
    if (bad) {
      for (size_t j = t; j < nbytes; j += blockDim.x) qb[j] = Bits == 8 ? 0 : 0x88;
      if (t == 0) reinterpret_cast<float*>(row + a.qbytes)[b] = nanf("");
      continue;
    }
    const float inv = amax > 0.0f ? level / amax : 1.0f;
    if (Bits == 8) {
      for (size_t j = t; j < nbytes; j += blockDim.x)
        qb[j] = j < m ? static_cast<uint8_t>(static_cast<int8_t>(round_level(mul_rn(xb[j], inv), level))) : 0;
    } else {
      for (size_t j = t; j < nbytes; j += blockDim.x) {
        const size_t i = 2 * j;
        const int lo = i < m ? round_level(mul_rn(xb[i], inv), level) + 8 : 8;
        const int hi = i + 1 < m ? round_level(mul_rn(xb[i + 1], inv), level) + 8 : 8;
        qb[j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
    if (t == 0) reinterpret_cast<float*>(row + a.qbytes)[b] = amax / level;
  }
}

template <int Bits>
__global__ void __launch_bounds__(kQuantThreads) dequantize_kernel(QuantArgs a) {
  for (size_t q = blockIdx.x; q < a.total; q += gridDim.x) {
    const size_t r = q / a.nblk, b = q % a.nblk;
    const uint8_t* row = a.in + r * a.row_bytes;
    const uint8_t* qb = row + b * a.block * Bits / 8;
    const float s = reinterpret_cast<const float*>(row + a.qbytes)[b];
    const size_t m = a.n - b * a.block < a.block ? a.n - b * a.block : a.block;
    float* ob = a.values + r * a.n + b * a.block;
    for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
      int v;
      if (Bits == 8) {
        v = static_cast<int8_t>(qb[i]);
      } else {
        const int byte = qb[i / 2];
        v = ((i % 2) ? (byte >> 4) : (byte & 0xF)) - 8;
      }
      ob[i] = mul_rn(static_cast<float>(v), s);
    }
  }
}

// Blocks that fill the device once (resident blocks per SM x SMs), never more than the work; asked of the
// device at each launch (about a microsecond; the kernels stride, so fewer blocks are only slower).
template <class Kernel>
cudaError_t grid_for(Kernel kernel, size_t total, unsigned* grid) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kQuantThreads, 0);
  if (err != cudaSuccess) return err;
  const size_t full = static_cast<size_t>(sms > 0 ? sms : 1) * static_cast<size_t>(per_sm > 0 ? per_sm : 1);
  *grid = static_cast<unsigned>(total < full ? total : full);
  return cudaSuccess;
}

bool valid(int bits, size_t block) { return (bits == 8 || bits == 4) && block > 0 && block % 8 == 0; }

QuantArgs args_for(size_t rows, size_t n, int bits, size_t block) {
  QuantArgs a{};
  a.n = n;
  a.block = block;
  a.nblk = (n + block - 1) / block;
  a.total = rows * a.nblk;
  a.qbytes = a.nblk * block * static_cast<size_t>(bits) / 8;
  a.row_bytes = quantized_row_bytes(n, bits, block);
  return a;
}

template <auto Kernel>
cudaError_t launch(const QuantArgs& a, cudaStream_t stream) {
  if (a.total == 0) return cudaSuccess;
  unsigned grid = 0;
  const cudaError_t err = grid_for(Kernel, a.total, &grid);
  if (err != cudaSuccess) return err;
  return launch_kernel<Kernel>(dim3(grid), dim3(kQuantThreads), stream, a);
}

}  // namespace

cudaError_t launch_quantize_blocks(const float* x, size_t rows, size_t n, int bits, size_t block, uint8_t* out,
                                   cudaStream_t stream) {
  if (!valid(bits, block)) return cudaErrorInvalidValue;
  QuantArgs a = args_for(rows, n, bits, block);
  a.x = x;
  a.out = out;
  return bits == 8 ? launch<quantize_kernel<8>>(a, stream) : launch<quantize_kernel<4>>(a, stream);
}

cudaError_t launch_dequantize_blocks(const uint8_t* packed, size_t rows, size_t n, int bits, size_t block, float* out,
                                     cudaStream_t stream) {
  if (!valid(bits, block)) return cudaErrorInvalidValue;
  QuantArgs a = args_for(rows, n, bits, block);
  a.in = packed;
  a.values = out;
  return bits == 8 ? launch<dequantize_kernel<8>>(a, stream) : launch<dequantize_kernel<4>>(a, stream);
}

}  // namespace ringzero::cuda
