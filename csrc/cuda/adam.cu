// Fused Adam/AdamW and the sum-of-squares pass on the GPU, over many tensors per launch.
//
// Work split: the tensors of a launch are cut into chunks of kAdamChunkElems; a grid sized to fill
// the GPU once (occupancy x SMs) walks the chunks block-stride, so one launch covers 32 tensors of
// any sizes and a single huge tensor alike. Each block scans forward through the tensor table to its
// chunk's tensor; chunk indices only grow within a block, so the scan costs at most one step per
// tensor per block.
// Cost per element: each operand read once and written once (28 B/param for float32 everything);
// no shared memory and no synchronisation between blocks. Scalars may come from device memory (lr,
// the step of the launch or of each tensor, inv_scale, clip_coef, found_inf), so a step needs no
// host synchronisation and can be captured in a CUDA graph.
// Invariant: every element is computed by exactly one thread from the values read at the start of
// the launch; results do not depend on the grid (the same bits for any SM count).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/adam.h"
#include "cuda/portable.cuh"

namespace ringzero {
namespace {

constexpr int kThreads = 256;
// Elements per thread per pass: one 16-byte load of float32 (8 bytes of 16-bit) per operand, four
// operands in flight per thread: the memory-level parallelism a bandwidth-bound kernel needs.
constexpr int kVec = 4;
static_assert(kAdamChunkElems % kVec == 0, "a chunk starts on a Pack boundary");

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

// kVec consecutive elements moved as one aligned load or store.
template <class T> struct alignas(sizeof(T) * kVec) Pack { T v[kVec]; };

// Where the chunks of a launch's tensors start: tensor k owns chunks [chunk_begin[k], chunk_begin[k+1]).
struct ChunkMap {
  int64_t count[kAdamTensorsPerLaunch];
  int32_t chunk_begin[kAdamTensorsPerLaunch + 1];
  int32_t tensors;
};

struct AdamLaunchTable {
  void* param[kAdamTensorsPerLaunch];
  const void* grad[kAdamTensorsPerLaunch];
  void* exp_avg[kAdamTensorsPerLaunch];
  void* exp_avg_sq[kAdamTensorsPerLaunch];
  void* max_exp_avg_sq[kAdamTensorsPerLaunch];  // null: no AMSGrad for that tensor
  void* param_out[kAdamTensorsPerLaunch];       // null: no 16-bit copy
  const float* step[kAdamTensorsPerLaunch];     // null: the launch's step
  uint32_t packed;                              // bit k: tensor k's operands are aligned for Pack loads
  ChunkMap map;
};

struct SumSquaresLaunchTable {
  const void* x[kAdamTensorsPerLaunch];
  DType dtype[kAdamTensorsPerLaunch];
  ChunkMap map;
};

// The launch-wide coefficients of one tensor's step (torch.optim.AdamW's formulas, bias corrections
// in float32 on the device).
struct StepCoeffs {
  float grad_scale, l2, decay, step_size, inv_bc2_sqrt;
};

__device__ __forceinline__ StepCoeffs coeffs_for(const AdamHostScalars& h, float lr, float step, float inv_scale,
                                                 float clip) {
  StepCoeffs c;
  c.grad_scale = inv_scale * clip * (h.maximize ? -1.0f : 1.0f);
  c.l2 = h.adamw ? 0.0f : h.weight_decay;
  c.decay = h.adamw ? 1.0f - lr * h.weight_decay : 1.0f;
  c.step_size = lr / (1.0f - powf(h.beta1, step));
  c.inv_bc2_sqrt = rsqrtf(1.0f - powf(h.beta2, step));
  return c;
}

// One element's update; returns the new parameter. m, v, vmax are updated in place.
__device__ __forceinline__ float adam_update(const AdamHostScalars& h, const StepCoeffs& c, float p, float g_raw,
                                             float& m, float& v, float* vmax) {
  const float g = g_raw * c.grad_scale + c.l2 * p;
  m = m + (1.0f - h.beta1) * (g - m);
  v = h.beta2 * v + (1.0f - h.beta2) * g * g;
  float vd = v;
  if (vmax) {
    vd = fmaxf(*vmax, v);
    *vmax = vd;
  }
  return p * c.decay - c.step_size * m / (sqrtf(vd) * c.inv_bc2_sqrt + h.eps);
}

// Advances k to the tensor that owns chunk c (c never decreases within a block).
__device__ __forceinline__ int tensor_of(const ChunkMap& map, int c, int k) {
  while (c >= map.chunk_begin[k + 1]) ++k;
  return k;
}

template <class P, class G, class M>
__device__ void adam_chunk_scalar(const AdamLaunchTable& t, int k, size_t begin, size_t end, DType out_dtype,
                                  const AdamHostScalars& h, const StepCoeffs& c) {
  P* param = static_cast<P*>(t.param[k]);
  const G* grad = static_cast<const G*>(t.grad[k]);
  M* exp_avg = static_cast<M*>(t.exp_avg[k]);
  M* exp_avg_sq = static_cast<M*>(t.exp_avg_sq[k]);
  M* vmax_buf = static_cast<M*>(t.max_exp_avg_sq[k]);
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float m = to_f(exp_avg[i]), v = to_f(exp_avg_sq[i]);
    float vmax = vmax_buf ? to_f(vmax_buf[i]) : 0.0f;
    const float pn = adam_update(h, c, to_f(param[i]), to_f(grad[i]), m, v, vmax_buf ? &vmax : nullptr);
    exp_avg[i] = from_f<M>(m);
    exp_avg_sq[i] = from_f<M>(v);
    if (vmax_buf) vmax_buf[i] = from_f<M>(vmax);
    param[i] = from_f<P>(pn);
    if (t.param_out[k]) store_f(t.param_out[k], out_dtype, i, pn);
  }
}

// The same over [begin, end) with end - begin a multiple of kVec and every operand Pack-aligned.
template <class P, class G, class M>
__device__ void adam_chunk_packed(const AdamLaunchTable& t, int k, size_t begin, size_t end, DType out_dtype,
                                  const AdamHostScalars& h, const StepCoeffs& c) {
  Pack<P>* param = cuda::pack_base(static_cast<Pack<P>*>(t.param[k]));
  const Pack<G>* grad = cuda::pack_base(static_cast<const Pack<G>*>(t.grad[k]));
  Pack<M>* exp_avg = cuda::pack_base(static_cast<Pack<M>*>(t.exp_avg[k]));
  Pack<M>* exp_avg_sq = cuda::pack_base(static_cast<Pack<M>*>(t.exp_avg_sq[k]));
  Pack<M>* vmax_buf = static_cast<Pack<M>*>(t.max_exp_avg_sq[k]);
  if (vmax_buf) vmax_buf = cuda::pack_base(vmax_buf);
  for (size_t j = begin / kVec + threadIdx.x; j < end / kVec; j += blockDim.x) {
    Pack<P> p = param[j];
    const Pack<G> g = grad[j];
    Pack<M> m = exp_avg[j], v = exp_avg_sq[j], vm{};
    if (vmax_buf) vm = vmax_buf[j];
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      float mf = to_f(m.v[u]), vf = to_f(v.v[u]), vmf = vmax_buf ? to_f(vm.v[u]) : 0.0f;
      const float pn = adam_update(h, c, to_f(p.v[u]), to_f(g.v[u]), mf, vf, vmax_buf ? &vmf : nullptr);
      m.v[u] = from_f<M>(mf);
      v.v[u] = from_f<M>(vf);
      if (vmax_buf) vm.v[u] = from_f<M>(vmf);
      p.v[u] = from_f<P>(pn);
      if (t.param_out[k]) store_f(t.param_out[k], out_dtype, j * kVec + u, pn);
    }
    param[j] = p;
    exp_avg[j] = m;
    exp_avg_sq[j] = v;
    if (vmax_buf) vmax_buf[j] = vm;
  }
}

template <class P, class G, class M>
__global__ void __launch_bounds__(kThreads) adam_multi_kernel(AdamLaunchTable t, DType out_dtype, AdamHostScalars h,
                                                              AdamDeviceScalars d) {
  if (d.found_inf && *d.found_inf != 0.0f) return;  // a skipped step writes nothing
  const float lr = d.lr ? *d.lr : h.lr;
  const float inv_scale = d.inv_scale ? *d.inv_scale : h.inv_scale;
  const float clip = d.clip_coef ? *d.clip_coef : h.clip_coef;
  const float launch_step = d.step ? *d.step : h.step;
  int k = 0;
  for (int c = blockIdx.x; c < t.map.chunk_begin[t.map.tensors]; c += gridDim.x) {
    k = tensor_of(t.map, c, k);
    const StepCoeffs co = coeffs_for(h, lr, t.step[k] ? *t.step[k] : launch_step, inv_scale, clip);
    const size_t begin = static_cast<size_t>(c - t.map.chunk_begin[k]) * kAdamChunkElems;
    const size_t end = min(begin + kAdamChunkElems, static_cast<size_t>(t.map.count[k]));
    if (t.packed & (1u << k)) {
      // = begin + (end - begin) / kVec * kVec, since begin is a multiple of kVec; derived from end, which
      // the tail needs anyway, rather than kept live across the packed loop (ptxas spilled it there).
      const size_t packed_end = end / kVec * kVec;
      adam_chunk_packed<P, G, M>(t, k, begin, packed_end, out_dtype, h, co);
      adam_chunk_scalar<P, G, M>(t, k, packed_end, end, out_dtype, h, co);
    } else {
      adam_chunk_scalar<P, G, M>(t, k, begin, end, out_dtype, h, co);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// One read of every x; one atomic add per block. Non-finite partial sums mean a non-finite element (a
// finite float32 square can overflow only past 1.8e19, far above any gradient).
__global__ void __launch_bounds__(kThreads) sum_squares_multi_kernel(SumSquaresLaunchTable t, float* out, float* found_inf) {
  float acc = 0.0f;
  int k = 0;
  for (int c = blockIdx.x; c < t.map.chunk_begin[t.map.tensors]; c += gridDim.x) {
    k = tensor_of(t.map, c, k);
    const size_t begin = static_cast<size_t>(c - t.map.chunk_begin[k]) * kAdamChunkElems;
    const size_t end = min(begin + kAdamChunkElems, static_cast<size_t>(t.map.count[k]));
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = load_f(t.x[k], t.dtype[k], i);
      acc += v * v;
    }
  }
  __shared__ float partial[kThreads / 32];
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {  // the block's warps (kThreads / 32 at launch; fewer where the CPU grid says)
    float s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) {
      if (found_inf && !isfinite(s)) *found_inf = 1.0f;
      atomicAdd(out, s);
    }
  }
}

// Blocks that fill the GPU once (resident blocks per SM x SMs), never more than the chunks. The count
// is asked once per (kernel, device) and kept: the occupancy query costs about a microsecond, at every
// launch otherwise. Keyed by the kernel's address, since kernels of one signature share this template.
template <class Kernel>
cudaError_t grid_for(Kernel kernel, int chunks, int* grid) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> full_grid;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
  int full = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = full_grid.find(key);
    if (it != full_grid.end()) full = it->second;
  }
  if (full == 0) {
    int sms = 0, per_sm = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
    if (err != cudaSuccess) return err;
    full = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    std::lock_guard<std::mutex> lock(mu);
    full_grid[key] = full;
  }
  *grid = chunks < full ? chunks : full;
  return cudaSuccess;
}

// Adds tensor `count` to the map; false when the map is full or its chunk index would overflow.
bool map_add(ChunkMap& map, size_t count) {
  const size_t chunks = (count + kAdamChunkElems - 1) / kAdamChunkElems;
  const size_t next = static_cast<size_t>(map.chunk_begin[map.tensors]) + chunks;
  if (map.tensors == kAdamTensorsPerLaunch || next > INT32_MAX) return false;
  map.count[map.tensors] = static_cast<int64_t>(count);
  map.chunk_begin[++map.tensors] = static_cast<int32_t>(next);
  return true;
}

bool aligned(const void* p, size_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

template <class P, class G, class M>
cudaError_t launch_adam(const AdamLaunchTable& t, DType out_dtype, const AdamHostScalars& h, const AdamDeviceScalars& d,
                        cudaStream_t s) {
  int grid = 0;
  cudaError_t err = grid_for(adam_multi_kernel<P, G, M>, t.map.chunk_begin[t.map.tensors], &grid);
  if (err != cudaSuccess || grid == 0) return err;
  return cuda::launch_kernel<adam_multi_kernel<P, G, M>>(dim3(grid), dim3(kThreads), s, t, out_dtype, h, d);
}

template <class P, class G>
cudaError_t by_moment(const AdamLaunchTable& t, const AdamBuffers& b, const AdamHostScalars& h, const AdamDeviceScalars& d,
                      cudaStream_t s) {
  if (b.moment_dtype == DType::F32) return launch_adam<P, G, float>(t, b.out_dtype, h, d, s);
  if (b.moment_dtype == DType::BF16) return launch_adam<P, G, __nv_bfloat16>(t, b.out_dtype, h, d, s);
  return cudaErrorInvalidValue;
}

template <class P>
cudaError_t by_grad(const AdamLaunchTable& t, const AdamBuffers& b, const AdamHostScalars& h, const AdamDeviceScalars& d,
                    cudaStream_t s) {
  switch (b.grad_dtype) {
    case DType::F32: return by_moment<P, float>(t, b, h, d, s);
    case DType::BF16: return by_moment<P, __nv_bfloat16>(t, b, h, d, s);
    case DType::F16: return by_moment<P, __half>(t, b, h, d, s);
    default: return cudaErrorInvalidValue;
  }
}

// Launches one table whose tensors share the dtypes of `b`.
cudaError_t launch_table(const AdamLaunchTable& t, const AdamBuffers& b, const AdamHostScalars& h,
                         const AdamDeviceScalars& d, cudaStream_t s) {
  switch (b.param_dtype) {
    case DType::F32: return by_grad<float>(t, b, h, d, s);
    case DType::BF16: return by_grad<__nv_bfloat16>(t, b, h, d, s);
    case DType::F16: return by_grad<__half>(t, b, h, d, s);
    default: return cudaErrorInvalidValue;
  }
}

bool same_dtypes(const AdamBuffers& a, const AdamBuffers& b) {
  const bool a_out = a.param_out != nullptr, b_out = b.param_out != nullptr;
  return a.param_dtype == b.param_dtype && a.grad_dtype == b.grad_dtype && a.moment_dtype == b.moment_dtype &&
         a_out == b_out && (!a_out || a.out_dtype == b.out_dtype);
}

}  // namespace

cudaError_t adam_step_multi_cuda(const AdamTensor* tensors, size_t n, const AdamHostScalars& h,
                                 const AdamDeviceScalars& d, cudaStream_t stream) {
  // Tensors are grouped by dtype combination (the kernel is typed), in their order within a group.
  std::vector<bool> done(n, false);
  for (size_t first = 0; first < n; ++first) {
    if (done[first]) continue;
    const AdamBuffers& kind = tensors[first].buffers;
    AdamLaunchTable t{};
    for (size_t i = first; i < n; ++i) {
      if (done[i] || !same_dtypes(tensors[i].buffers, kind)) continue;
      done[i] = true;
      const AdamTensor& x = tensors[i];
      if (x.count == 0) continue;
      if (t.map.tensors == kAdamTensorsPerLaunch) {
        const cudaError_t err = launch_table(t, kind, h, d, stream);
        if (err != cudaSuccess) return err;
        t = AdamLaunchTable{};
      }
      const int k = t.map.tensors;
      if (!map_add(t.map, x.count)) return cudaErrorInvalidValue;  // over 2^31 chunks (3.5e13 elements)
      const AdamBuffers& b = x.buffers;
      t.param[k] = b.param;
      t.grad[k] = b.grad;
      t.exp_avg[k] = b.exp_avg;
      t.exp_avg_sq[k] = b.exp_avg_sq;
      t.max_exp_avg_sq[k] = b.max_exp_avg_sq;
      t.param_out[k] = b.param_out;
      t.step[k] = x.step;
      const size_t m = dtype_bytes(b.moment_dtype) * kVec;
      if (aligned(b.param, dtype_bytes(b.param_dtype) * kVec) && aligned(b.grad, dtype_bytes(b.grad_dtype) * kVec) &&
          aligned(b.exp_avg, m) && aligned(b.exp_avg_sq, m) && aligned(b.max_exp_avg_sq, m))
        t.packed |= 1u << k;
    }
    if (t.map.tensors > 0) {
      const cudaError_t err = launch_table(t, kind, h, d, stream);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

cudaError_t adam_step_cuda(const AdamBuffers& b, size_t count, const AdamHostScalars& h,
                           const AdamDeviceScalars& d, cudaStream_t stream) {
  const AdamTensor one{b, count, nullptr};
  return adam_step_multi_cuda(&one, 1, h, d, stream);
}

cudaError_t sum_squares_multi_cuda(const void* const* xs, const DType* dtypes, const size_t* counts, size_t n,
                                   float* out, float* found_inf, cudaStream_t stream) {
  SumSquaresLaunchTable t{};
  auto flush = [&]() -> cudaError_t {
    int grid = 0;
    cudaError_t err = grid_for(sum_squares_multi_kernel, t.map.chunk_begin[t.map.tensors], &grid);
    if (err != cudaSuccess || grid == 0) return err;
    const cudaError_t launched =
        cuda::launch_kernel<sum_squares_multi_kernel>(dim3(grid), dim3(kThreads), stream, t, out, found_inf);
    t = SumSquaresLaunchTable{};
    return launched;
  };
  for (size_t i = 0; i < n; ++i) {
    if (dtypes[i] != DType::F32 && dtypes[i] != DType::BF16 && dtypes[i] != DType::F16) return cudaErrorInvalidValue;
    if (counts[i] == 0) continue;
    if (t.map.tensors == kAdamTensorsPerLaunch) {
      const cudaError_t err = flush();
      if (err != cudaSuccess) return err;
    }
    const int k = t.map.tensors;
    if (!map_add(t.map, counts[i])) return cudaErrorInvalidValue;
    t.x[k] = xs[i];
    t.dtype[k] = dtypes[i];
  }
  return t.map.tensors > 0 ? flush() : cudaSuccess;
}

}  // namespace ringzero
