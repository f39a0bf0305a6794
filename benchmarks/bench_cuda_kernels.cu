// The CUDA benchmark without torch (layers 2-3 only), so a GPU machine whose torch has no CUDA still
// measures: device-to-device copy bandwidth, the reduction kernel at 256 MiB, and all-reduce with
// N = 2, 4, 8 simulated ranks per algorithm (nccl-tests columns), each against the floor of one shared
// HBM and L2: the graph-timed copy of the N inputs to the N outputs at the same total size (what any
// all-reduce must move; staging is the algorithm's own cost), so "of floor" can never pass 100%: a value
// above is printed as a MODEL ERROR and fails the run. Times are per call from a CUDA graph of
// back-to-back calls. benchmarks/bench_cuda.py prints the same tables through torch, with baselines.
//   build/gpu/bench_cuda_kernels [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "cuda_ok.h"
#include "cuda/peer_comm.h"
#include "cuda/reduce.h"

using namespace ringzero;
using namespace ringzero::cuda;


// Seconds per call of fn (enqueued on s), from a graph of `iters` calls replayed 3 times after a warm-up.
static double time_graph(cudaStream_t s, int iters, const std::function<void()>& fn) {
  fn();
  CUDA_OK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) fn();
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  const int reps = 3;
  CUDA_OK(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaEventRecord(b, s));
  CUDA_OK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  return ms / 1e3 / (reps * iters);
}

static std::string fmt_size(size_t b) {
  char buf[32];
  if (b >= (1u << 20)) std::snprintf(buf, sizeof buf, "%g MiB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%g KiB", b / 1024.0);
  return buf;
}

// Seconds of one graph-timed device-to-device copy of `bytes` (the floor of an all-reduce whose N inputs
// and outputs total `bytes` each way).
static double copy_seconds(cudaStream_t s, size_t bytes, int iters) {
  void *src, *dst;
  CUDA_OK(cudaMalloc(&src, bytes));
  CUDA_OK(cudaMalloc(&dst, bytes));
  CUDA_OK(cudaMemset(src, 0, bytes));
  const double t = time_graph(s, iters, [&] { CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
  CUDA_OK(cudaFree(src));
  CUDA_OK(cudaFree(dst));
  return t;
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_kernels: no CUDA device; nothing measured\n");
    return 77;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  char date[64];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("# ringzero CUDA kernel benchmark (no torch), %s\ndevice: %s, %.0f GiB, %d SMs\n", date, prop.name,
              prop.totalGlobalMem / 1073741824.0, prop.multiProcessorCount);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const size_t big = 256u << 20;
  void *a, *b, *d;
  CUDA_OK(cudaMalloc(&a, big));
  CUDA_OK(cudaMalloc(&b, big));
  CUDA_OK(cudaMalloc(&d, big));
  CUDA_OK(cudaMemset(a, 0, big));
  CUDA_OK(cudaMemset(b, 0, big));
  const double t_copy = time_graph(s, 5, [&] { CUDA_OK(cudaMemcpyAsync(d, a, big, cudaMemcpyDeviceToDevice, s)); });
  const double copy_bw = 2.0 * big / t_copy;
  std::printf("device-to-device copy bandwidth (256 MiB, read + write counted): %.0f GB/s\n", copy_bw / 1e9);

  std::printf("\n## reduction kernel (dst = a + b), 256 MiB per operand; bytes moved = 3 x size\n");
  std::printf("%9s %9s %8s %10s\n", "dtype", "time_us", "GB/s", "of copy bw");
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    const void* srcs[2] = {a, b};
    const size_t count = big / dtype_size(t);
    const double sec = time_graph(s, 5, [&] { CUDA_OK(launch_reduce(d, srcs, 2, count, t, ReduceOp::Sum, 1, s)); });
    std::printf("%9s %9.1f %8.1f %9.1f%%\n", dtype_name(t), sec * 1e6, 3.0 * big / sec / 1e9, 100 * 3.0 * big / sec / copy_bw);
  }
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaFree(d));

  std::vector<size_t> sizes = quick ? std::vector<size_t>{4u << 10, 64u << 10, 1u << 20, 64u << 20}
                                    : std::vector<size_t>{4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20,
                                                          4u << 20, 16u << 20, 64u << 20, 256u << 20};
  int model_errors = 0;
  for (int n : {2, 4, 8}) {
    PeerConfig cfg;
    cfg.staging_bytes = 64u << 20;
    SimWorld w(n, cfg);
    std::printf("\n## all-reduce, %d simulated ranks on one GPU (float32); floor = one copy of the %d inputs to the %d "
                "outputs at this size (graph-timed); of floor = floor time / time, never above 100%%\n", n, n, n);
    std::printf("%9s %10s %8s %9s %7s %7s %8s %8s\n", "size", "count", "algo", "time_us", "algbw", "busbw", "floor_us",
                "of floor");
    std::string fastest;
    for (size_t size : sizes) {
      std::vector<const void*> ins(n);
      std::vector<void*> outs(n);
      for (int q = 0; q < n; ++q) {
        void* p;
        CUDA_OK(cudaMalloc(&p, size));
        CUDA_OK(cudaMemset(p, 0, size));
        ins[q] = p;
        CUDA_OK(cudaMalloc(&outs[q], size));
      }
      const int iters = size <= (1u << 20) ? 20 : 3;
      const double floor_s = copy_seconds(s, n * size, iters);
      double best = 1e30;
      const char* best_name = "";
      const std::pair<Algo, const char*> algos[] = {{Algo::OneShot, "oneshot"}, {Algo::TwoShot, "twoshot"},
                                                    {Algo::Ring, "ring"}};
      for (const auto& entry : algos) {
        const Algo algo = entry.first;
        const char* name = entry.second;
        const double sec = time_graph(s, iters, [&] {
          w.run(Coll::AllReduce, ins, outs, size / 4, DType::F32, ReduceOp::Sum, algo, s);
        });
        const double algbw = size / sec / 1e9, ratio = floor_s / sec;
        std::printf("%9s %10zu %8s %9.1f %7.2f %7.2f %8.1f %7.1f%%%s\n", fmt_size(size).c_str(), size / 4, name,
                    sec * 1e6, algbw, algbw * 2 * (n - 1) / n, floor_s * 1e6, 100 * ratio,
                    ratio > 1.0 ? "  MODEL ERROR: faster than the floor" : "");
        model_errors += ratio > 1.0;
        if (sec < best) best = sec, best_name = name;
      }
      fastest += (fastest.empty() ? "" : ", ") + fmt_size(size) + ": " + best_name;
      for (int q = 0; q < n; ++q) {
        CUDA_OK(cudaFree(const_cast<void*>(ins[q])));
        CUDA_OK(cudaFree(outs[q]));
      }
    }
    std::printf("fastest per size (set the Auto thresholds in peer_comm.h from this): %s\n", fastest.c_str());
  }
  CUDA_OK(cudaStreamDestroy(s));
  if (model_errors) std::printf("\n%d MODEL ERROR(s): a kernel beat the floor, so the model or the timing is wrong\n",
                                model_errors);
  return model_errors ? 1 : 0;
}
