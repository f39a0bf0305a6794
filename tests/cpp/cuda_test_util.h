// Host-side helpers of the CUDA C++ tests (test_cuda.cu, test_cuda_fuzz.cu, test_cuda_timeout.cu): a
// counting CHECK, element values of every CUDA dtype as double, device buffers, and the skip of a
// machine without a GPU (exit 77, ctest's SKIP_RETURN_CODE).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/types.h"
#include "cuda_ok.h"

namespace ringzero::test {

inline int g_failures = 0, g_checks = 0;
#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    ++::ringzero::test::g_checks;                                        \
    if (!(cond)) {                                                       \
      if (++::ringzero::test::g_failures < 30) {                         \
        std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
        std::fprintf(stderr, __VA_ARGS__);                               \
        std::fprintf(stderr, "\n");                                      \
      }                                                                  \
    }                                                                    \
  } while (0)

// Exits 77 (ctest: skipped) when no CUDA device is visible; `what` says which test skipped.
inline void skip_without_gpu(const char* what) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device; %s needs a GPU (benchmarks/gpu_check.sh runs it)\n", what);
    std::exit(77);
  }
}

// Prints the totals and returns main's exit code.
inline int finish() {
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

// ---- host <-> device values of every dtype, as double ----
inline void put(std::vector<char>& buf, size_t i, DType t, double v) {
  char* p = buf.data();
  switch (t) {
    case DType::F32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::BF16: reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(static_cast<float>(v)); break;
    case DType::F16: reinterpret_cast<__half*>(p)[i] = __float2half(static_cast<float>(v)); break;
    case DType::I32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::I64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    default: break;
  }
}
inline double get(const std::vector<char>& buf, size_t i, DType t) {
  const char* p = buf.data();
  switch (t) {
    case DType::F32: return reinterpret_cast<const float*>(p)[i];
    case DType::BF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(reinterpret_cast<const __half*>(p)[i]);
    case DType::I32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    default: return 0;
  }
}
// The reference's single rounding to the storage type (the kernels accumulate in fp32, round once).
inline double round_to(DType t, double v) {
  std::vector<char> b(8);
  put(b, 0, t, v);
  return get(b, 0, t);
}
inline bool integral(DType t) { return t == DType::I32 || t == DType::I64; }

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t b) : bytes(b) { CUDA_OK(cudaMalloc(&p, b ? b : 16)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  // Complete on return: a host-to-device cudaMemcpy is legacy-stream work that may still be in flight
  // when it returns, and work on a non-blocking stream (or another host thread's) is not ordered after it.
  void upload(const std::vector<char>& h) {
    CUDA_OK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaStreamSynchronize(nullptr));
  }
  std::vector<char> download() const {
    std::vector<char> h(bytes ? bytes : 1);
    CUDA_OK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace ringzero::test
