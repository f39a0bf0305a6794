// Fused Adam/AdamW and the sum-of-squares pass on the GPU: one grid-stride pass per element.
// Scalars may come from device memory (lr, step, inv_scale, clip_coef, found_inf), so a step needs no
// host synchronisation and can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/adam.h"

namespace ringzero {
namespace {

constexpr int kThreads = 256;
// Each thread handles kUnroll elements per grid-stride iteration so loads of several elements are in
// flight together (memory-level parallelism is what a bandwidth-bound kernel needs).
constexpr int kUnroll = 4;

__device__ __forceinline__ float load_f(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_f(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::F16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// Typed access for the operands whose dtype is a template parameter (the hot float32 path
// compiles to plain loads and stores).
template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f(float v) { return v; }
template <> __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }

// Bytes per parameter: grad sizeof(G), param 2*sizeof(P), moments 4*sizeof(M) (+2*sizeof(M) AMSGrad),
// param_out its dtype size. No shared memory, no synchronisation between blocks.
template <class P, class G, class M>
__global__ void adam_kernel(P* __restrict param, const G* __restrict grad, M* __restrict exp_avg,
                            M* __restrict exp_avg_sq, M* __restrict max_exp_avg_sq, void* __restrict param_out,
                            DType out_dtype, size_t n, AdamHostScalars h, AdamDeviceScalars d) {
  if (d.found_inf && *d.found_inf != 0.0f) return;
  const float lr = d.lr ? *d.lr : h.lr;
  const float step = d.step ? *d.step : h.step;
  const float inv_scale = d.inv_scale ? *d.inv_scale : h.inv_scale;
  const float clip = d.clip_coef ? *d.clip_coef : h.clip_coef;
  const float grad_scale = inv_scale * clip * (h.maximize ? -1.0f : 1.0f);
  const float l2 = h.adamw ? 0.0f : h.weight_decay;
  const float decay = h.adamw ? 1.0f - lr * h.weight_decay : 1.0f;
  const float step_size = lr / (1.0f - powf(h.beta1, step));
  const float inv_bc2_sqrt = rsqrtf(1.0f - powf(h.beta2, step));
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kUnroll;
  for (size_t base = static_cast<size_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < n; base += stride) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + static_cast<size_t>(u) * blockDim.x;
      if (i >= n) break;
      const float p = to_f(param[i]);
      const float g = to_f(grad[i]) * grad_scale + l2 * p;
      const float m0 = to_f(exp_avg[i]);
      const float m = m0 + (1.0f - h.beta1) * (g - m0);
      const float v = h.beta2 * to_f(exp_avg_sq[i]) + (1.0f - h.beta2) * g * g;
      float vd = v;
      if (max_exp_avg_sq) {
        vd = fmaxf(to_f(max_exp_avg_sq[i]), v);
        max_exp_avg_sq[i] = from_f<M>(vd);
      }
      const float pn = p * decay - step_size * m / (sqrtf(vd) * inv_bc2_sqrt + h.eps);
      exp_avg[i] = from_f<M>(m);
      exp_avg_sq[i] = from_f<M>(v);
      param[i] = from_f<P>(pn);
      if (param_out) store_f(param_out, out_dtype, i, pn);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// One read of x; one atomic add per block. Non-finite partial sums mean a non-finite element (a
// finite float32 square can overflow only past 1.8e19, far above any gradient).
__global__ void sum_squares_kernel(const void* __restrict x, DType t, size_t n, float* out, float* found_inf) {
  float acc = 0.0f;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = load_f(x, t, i);
    acc += v * v;
  }
  __shared__ float partial[kThreads / 32];
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) {
      if (found_inf && !isfinite(s)) *found_inf = 1.0f;
      atomicAdd(out, s);
    }
  }
}

int grid_for(size_t n, int per_thread) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Enough resident blocks to cover memory latency (8 per SM of 256 threads = full occupancy on sm_80/90),
  // never more than the work.
  const size_t want = (n + static_cast<size_t>(kThreads) * per_thread - 1) / (static_cast<size_t>(kThreads) * per_thread);
  const size_t cap = static_cast<size_t>(sms > 0 ? sms : 80) * 8;
  return static_cast<int>(want < cap ? (want > 0 ? want : 1) : cap);
}

template <class P, class G, class M>
cudaError_t launch(const AdamBuffers& b, size_t n, const AdamHostScalars& h, const AdamDeviceScalars& d,
                   cudaStream_t s) {
  adam_kernel<P, G, M><<<grid_for(n, kUnroll), kThreads, 0, s>>>(
      static_cast<P*>(b.param), static_cast<const G*>(b.grad), static_cast<M*>(b.exp_avg),
      static_cast<M*>(b.exp_avg_sq), static_cast<M*>(b.max_exp_avg_sq), b.param_out, b.out_dtype, n, h, d);
  return cudaGetLastError();
}

template <class P, class G>
cudaError_t by_moment(const AdamBuffers& b, size_t n, const AdamHostScalars& h, const AdamDeviceScalars& d,
                      cudaStream_t s) {
  if (b.moment_dtype == DType::F32) return launch<P, G, float>(b, n, h, d, s);
  if (b.moment_dtype == DType::BF16) return launch<P, G, __nv_bfloat16>(b, n, h, d, s);
  return cudaErrorInvalidValue;
}

template <class P>
cudaError_t by_grad(const AdamBuffers& b, size_t n, const AdamHostScalars& h, const AdamDeviceScalars& d,
                    cudaStream_t s) {
  switch (b.grad_dtype) {
    case DType::F32: return by_moment<P, float>(b, n, h, d, s);
    case DType::BF16: return by_moment<P, __nv_bfloat16>(b, n, h, d, s);
    case DType::F16: return by_moment<P, __half>(b, n, h, d, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t adam_step_cuda(const AdamBuffers& b, size_t count, const AdamHostScalars& h,
                           const AdamDeviceScalars& d, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (b.param_dtype) {
    case DType::F32: return by_grad<float>(b, count, h, d, stream);
    case DType::BF16: return by_grad<__nv_bfloat16>(b, count, h, d, stream);
    case DType::F16: return by_grad<__half>(b, count, h, d, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t sum_squares_cuda(const void* x, DType dtype, size_t count, float* out, float* found_inf,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) return cudaErrorInvalidValue;
  sum_squares_kernel<<<grid_for(count, 8), kThreads, 0, stream>>>(x, dtype, count, out, found_inf);
  return cudaGetLastError();
}

}  // namespace ringzero
