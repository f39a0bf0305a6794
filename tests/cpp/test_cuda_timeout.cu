// A rank that never arrives, on simulated ranks (one GPU, no torch): a launch of all ranks but one must
// end within about the timeout (no hang), leave the CUDA context usable (no trap), and its record must
// name the missing rank, for every algorithm, including the ring, where most ranks wait for a rank
// that is itself waiting (the stuck_on chain). Reference: the rank left out of the launch.
// Without a CUDA device it prints SKIP and exits 77 (ctest's SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "cuda/peer_comm.h"
#include "cuda_test_util.h"

using namespace ringzero;
using namespace ringzero::cuda;
using namespace ringzero::test;

namespace {

constexpr double kTimeoutS = 0.5;

// One world of `n` ranks' staging buffers and signal blocks, as SimWorld makes them, so that a launch
// can leave a rank out (SimWorld always launches all of them).
struct BareWorld {
  PeerTable table{};
  TimeoutRecord record;
  std::vector<void*> allocations;
  BareWorld(int n, size_t staging_bytes) {
    table.nranks = n;
    table.staging_bytes = staging_bytes;
    for (int q = 0; q < n; ++q) {
      void* sig = nullptr;
      void* stage = nullptr;
      CUDA_OK(cudaMalloc(&sig, sizeof(Signal)));
      CUDA_OK(cudaMemset(sig, 0, sizeof(Signal)));
      CUDA_OK(cudaMalloc(&stage, staging_bytes));
      allocations.push_back(sig);
      allocations.push_back(stage);
      table.signal[q] = static_cast<Signal*>(sig);
      table.staging[q] = static_cast<char*>(stage);
    }
    CUDA_OK(cudaDeviceSynchronize());
    table.status = record.device();
    table.claim = &table.signal[0]->timeout_claim;
  }
  ~BareWorld() {
    for (void* p : allocations) cudaFree(p);
  }
};

void missing_rank(Coll coll, Algo algo, int n, int absent, cudaStream_t s) {
  PeerConfig cfg;
  cfg.staging_bytes = 256u << 10;
  cfg.ring_channels = 2;
  cfg.max_blocks = 4;
  cfg.timeout_s = kTimeoutS;
  BareWorld w(n, cfg.staging_bytes);
  const size_t count = 100003;  // several slices: the missing rank is missed at the first barrier
  const size_t in_n = coll == Coll::ReduceScatter ? n * count : count;
  const size_t out_n = coll == Coll::AllGather ? n * count : count;
  std::vector<void*> bufs;
  std::vector<RankBuffers> ranks;
  for (int q = 0; q < n; ++q) {
    if (q == absent) continue;
    void *in = nullptr, *out = nullptr;
    CUDA_OK(cudaMalloc(&in, in_n * 4));
    CUDA_OK(cudaMemset(in, 0, in_n * 4));
    CUDA_OK(cudaMalloc(&out, out_n * 4));
    bufs.push_back(in);
    bufs.push_back(out);
    ranks.push_back(RankBuffers{in, out, q});
  }
  CUDA_OK(cudaStreamSynchronize(nullptr));  // the sets are legacy-stream work; s is a non-blocking stream
  const auto t0 = std::chrono::steady_clock::now();
  run_collective(coll, cfg, w.table, ranks.data(), static_cast<int>(ranks.size()), count, DType::F32, ReduceOp::Sum,
                 algo, s);
  const cudaError_t e = cudaStreamSynchronize(s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string label = "coll " + std::to_string(static_cast<int>(coll)) + " algo " +
                            std::to_string(static_cast<int>(algo)) + " n=" + std::to_string(n) + " absent " +
                            std::to_string(absent);
  CHECK(e == cudaSuccess, "%s: the kernel failed (%s) instead of returning early", label.c_str(), cudaGetErrorString(e));
  // One timeout per wait chain, plus the grace of the stuck_on chain; far from a hang.
  CHECK(took < 20 * kTimeoutS + 5, "%s: took %.1f s with a %.1f s timeout", label.c_str(), took, kTimeoutS);
  const RunStatus* st = w.record.timed_out();
  CHECK(st != nullptr, "%s: no timeout recorded", label.c_str());
  if (st) CHECK(st->culprit == absent, "%s: names rank %d (waited for %d), not the absent %d", label.c_str(), st->culprit,
                st->peer, absent);
  bool threw = false;
  try {
    w.record.check(kTimeoutS);
  } catch (const CommTimeoutError& err) {
    threw = std::strstr(err.what(), ("rank " + std::to_string(absent) + " never arrived").c_str()) != nullptr;
    if (!threw) std::fprintf(stderr, "%s: message does not name rank %d: %s\n", label.c_str(), absent, err.what());
  }
  CHECK(threw, "%s: check() did not throw CommTimeoutError naming the absent rank", label.c_str());
  for (void* p : bufs) CUDA_OK(cudaFree(p));
}

// After the timeouts the context still works: a fresh SimWorld all-reduce is correct.
void context_still_usable(cudaStream_t s) {
  PeerConfig cfg;
  cfg.staging_bytes = 256u << 10;
  cfg.ring_channels = 2;
  cfg.max_blocks = 4;
  cfg.timeout_s = 30;
  const int n = 3;
  const size_t count = 70001;
  SimWorld sim(n, cfg);
  std::vector<std::unique_ptr<DevBuf>> bufs;
  std::vector<const void*> ins;
  std::vector<void*> outs;
  for (int q = 0; q < n; ++q) {
    std::vector<char> h(count * 4);
    for (size_t i = 0; i < count; ++i) put(h, i, DType::I32, q + 1);
    bufs.emplace_back(new DevBuf(count * 4));
    bufs.back()->upload(h);
    ins.push_back(bufs.back()->p);
    bufs.emplace_back(new DevBuf(count * 4));
    outs.push_back(bufs.back()->p);
  }
  for (Algo a : {Algo::OneShot, Algo::TwoShot, Algo::Ring}) {
    sim.run(Coll::AllReduce, ins, outs, count, DType::I32, ReduceOp::Sum, a, s);
    CUDA_OK(cudaStreamSynchronize(s));
    sim.check();
    for (int q = 0; q < n; ++q) {
      std::vector<char> got(count * 4);
      CUDA_OK(cudaMemcpy(got.data(), outs[q], count * 4, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += get(got, i, DType::I32) != 6;
      CHECK(bad == 0, "after the timeouts, algo %d rank %d: %zu wrong", static_cast<int>(a), q, bad);
    }
  }
}

}  // namespace

int main() {
  skip_without_gpu("test_cuda_timeout");
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (Algo a : {Algo::OneShot, Algo::TwoShot, Algo::Ring}) {
    missing_rank(Coll::AllReduce, a, 2, 1, s);
    missing_rank(Coll::AllReduce, a, 4, 2, s);
  }
  missing_rank(Coll::ReduceScatter, Algo::Ring, 3, 0, s);
  missing_rank(Coll::AllGather, Algo::Ring, 5, 3, s);
  context_still_usable(s);
  CUDA_OK(cudaStreamDestroy(s));
  return finish();
}
