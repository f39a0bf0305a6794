// The CPU grid's runtime API ([Note: the CPU grid's execution model] in grid.h): the subset of CUDA's
// that layer 2, layer 3's loopback driver and the C++ tests use, over host memory. Streams run their
// work at once in the calling thread; a stream under capture records it into a graph instead.
#include <cstdlib>
#include <vector>

#include "cuda/cpu_grid/grid.h"

struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};
struct CUstream_st {
  CUgraph_st* capture = nullptr;  // non-null while capturing
};
struct CUevent_st {};

namespace {
thread_local cudaError_t t_last_error = cudaSuccess;
}  // namespace

namespace ringzero::cpu_grid {

cudaError_t record_error(cudaError_t e) {
  t_last_error = e;
  return e;
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
  if (stream && stream->capture) {
    stream->capture->work.push_back(std::move(work));
  } else {
    work();
  }
  return cudaSuccess;
}

}  // namespace ringzero::cpu_grid

using ringzero::cpu_grid::enqueue;
using ringzero::cpu_grid::record_error;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error (CPU grid)";
    case cudaErrorInvalidValue: return "invalid argument (CPU grid)";
    case cudaErrorMemoryAllocation: return "out of memory (CPU grid)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (CPU grid)";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version (CPU grid)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (CPU grid)";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch (CPU grid)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (CPU grid)";
  }
  return "unknown error (CPU grid)";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : record_error(cudaErrorInvalidValue); }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return record_error(cudaErrorInvalidValue);
  *v = ringzero::cpu_grid::multiprocessors();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }  // every stream's work has run already

cudaError_t cudaMalloc(void** p, size_t bytes) {
  // Fresh device memory holds garbage: a pattern, so a read of what nobody wrote shows.
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return record_error(cudaErrorMemoryAllocation);
  std::memset(*p, 0xa5, bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s) {
  return enqueue(s, [=] { std::memset(p, v, bytes); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  return enqueue(s, [=] { std::memmove(dst, src, bytes); });
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return s && s->capture ? record_error(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (!s || s->capture) return record_error(cudaErrorInvalidValue);
  s->capture = new CUgraph_st;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  if (!s || !s->capture) return record_error(cudaErrorInvalidValue);
  *g = s->capture;
  s->capture = nullptr;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  *exec = new CUgraphExec_st{g->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  for (const auto& w : exec->work) enqueue(s, w);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
// One process: a handle carries the pointer (CPU-grid "ranks" are threads of this process).
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  std::memset(h, 0, sizeof *h);
  std::memcpy(h->reserved, &p, sizeof p);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned) {
  std::memcpy(p, h.reserved, sizeof *p);
  return *p ? cudaSuccess : record_error(cudaErrorInvalidValue);
}
cudaError_t cudaIpcCloseMemHandle(void*) { return cudaSuccess; }
