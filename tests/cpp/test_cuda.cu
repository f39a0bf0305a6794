// C++ tests of layers 2-3 on one GPU, against a host reference computed in double/int64 (integer-valued
// inputs keep float sums exact, so results must match exactly; random floats use a stated tolerance):
// the reduction kernel; one-shot, two-shot and ring all-reduce, ring reduce-scatter and all-gather with
// N = 2, 3, 4, 8 simulated ranks; CUDA-graph capture and replay; the ring driver over the loopback
// transport. Without a CUDA device it prints SKIP and exits 77 (ctest's SKIP_RETURN_CODE).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/peer_comm.h"
#include "cuda/reduce.h"
#include "cuda_test_util.h"
#include "nccl/ring_driver.h"
#include "nccl/transport.h"

using namespace ringzero;
using namespace ringzero::cuda;
using namespace ringzero::test;

// Small nonzero integers in [-3, 3] varying with rank and position: every sum and product of up to
// 8 of them is exact in float32 (|x| <= 3^8 = 6561 < 2^24).
static double value(int rank, size_t i) {
  const int v = static_cast<int>((i * 5 + static_cast<size_t>(rank) * 3) % 7) - 3;
  return v == 0 ? 1 : v;
}

static double reference(ReduceOp op, int n, size_t i, DType t, int salt = 0) {
  double acc = value(0 + salt, i);
  for (int r = 1; r < n; ++r) {
    const double v = value(r + salt, i);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) acc = integral(t) ? std::trunc(acc / n) : acc / n;
  return round_to(t, acc);
}

static std::vector<char> host_values(int rank, size_t n, DType t) {
  std::vector<char> h(n * dtype_size(t) + 8);
  for (size_t i = 0; i < n; ++i) put(h, i, t, value(rank, i));
  return h;
}

static const DType kDTypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
static const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod};

// ---- the reduction kernel ----
static void test_reduce_kernel() {
  for (DType t : kDTypes)
    for (ReduceOp op : kOps)
      for (int nsrc : {1, 2, 3, 8})
        for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(1031), size_t(300007)})
          for (size_t shift : {size_t(0), size_t(1)}) {  // shift 1: misaligned pointers, scalar path
            const size_t es = dtype_size(t);
            std::vector<std::unique_ptr<DevBuf>> srcs;
            std::vector<const void*> ptrs;
            for (int s = 0; s < nsrc; ++s) {
              srcs.emplace_back(new DevBuf((count + shift) * es));
              std::vector<char> h = host_values(s, count, t);
              // element i of the source is value(s, i), placed at position shift + i
              std::vector<char> placed((count + shift) * es + 8);
              std::memcpy(placed.data() + shift * es, h.data(), count * es);
              srcs.back()->upload(placed);
              ptrs.push_back(static_cast<char*>(srcs.back()->p) + shift * es);
            }
            DevBuf dst((count + shift) * es);
            void* d = static_cast<char*>(dst.p) + shift * es;
            const int divisor = op == ReduceOp::Avg ? nsrc : 1;
            CUDA_OK(launch_reduce(d, ptrs.data(), nsrc, count, t, op, divisor, nullptr));
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<char> h = dst.download();
            std::vector<char> got(h.begin() + shift * es, h.end());
            got.resize(count * es + 8);
            size_t bad = 0;
            for (size_t i = 0; i < count; ++i)
              if (get(got, i, t) != reference(op, nsrc, i, t)) ++bad;
            CHECK(bad == 0, "reduce %s %s nsrc=%d count=%zu shift=%zu: %zu wrong", dtype_name(t), op_name(op), nsrc,
                  count, shift, bad);
          }
}

// ---- simulated ranks ----
static PeerConfig small_config() {
  PeerConfig cfg;
  cfg.staging_bytes = 256u << 10;  // small, so larger counts stream through several slices
  cfg.ring_channels = 4;
  cfg.max_blocks = 8;
  cfg.timeout_s = 60;
  return cfg;
}

static void run_sim(SimWorld& w, Coll coll, size_t count, DType t, ReduceOp op, Algo algo, cudaStream_t s,
                    const char* label) {
  const int n = w.nranks();
  const size_t es = dtype_size(t);
  const size_t in_n = coll == Coll::ReduceScatter ? n * count : count;
  const size_t out_n = coll == Coll::AllGather ? n * count : count;
  std::vector<std::unique_ptr<DevBuf>> ins, outs;
  std::vector<const void*> ip;
  std::vector<void*> op_;
  for (int q = 0; q < n; ++q) {
    ins.emplace_back(new DevBuf(in_n * es));
    ins.back()->upload(host_values(q, in_n, t));
    outs.emplace_back(new DevBuf(out_n * es));
    ip.push_back(ins.back()->p);
    op_.push_back(outs.back()->p);
  }
  w.run(coll, ip, op_, count, t, op, algo, s);
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<double> want(out_n);
  for (size_t i = 0; i < out_n; ++i) {
    if (coll == Coll::AllGather) want[i] = round_to(t, value(static_cast<int>(i / count), i % count));
    else if (coll == Coll::AllReduce) want[i] = reference(op, n, i, t);
  }
  // 16-bit products: the ring rounds each partial product to 16 bits (one rounding per step, as NCCL
  // does), so they get a tolerance of n roundings; everything else is exact.
  const bool rounded = (t == DType::BF16 || t == DType::F16) && op == ReduceOp::Prod;
  const double rel = n * (t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11));
  for (int q = 0; q < n; ++q) {
    std::vector<char> got = outs[q]->download();
    got.resize(out_n * es + 8);
    size_t bad = 0;
    for (size_t i = 0; i < out_n; ++i) {
      const double w_ = coll == Coll::ReduceScatter ? reference(op, n, q * count + i, t) : want[i];
      const double g = get(got, i, t);
      if (rounded ? std::fabs(g - w_) > rel * std::fabs(w_) : g != w_) ++bad;
    }
    CHECK(bad == 0, "%s n=%d coll=%d algo=%d %s %s count=%zu rank %d: %zu wrong", label, n, static_cast<int>(coll),
          static_cast<int>(algo), dtype_name(t), op_name(op), count, q, bad);
  }
}

static void test_simulated() {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  for (int n : {2, 3, 4, 8}) {
    SimWorld w(n, small_config());
    for (DType t : kDTypes)
      for (ReduceOp op : kOps)
        for (size_t count : {size_t(1), size_t(13), size_t(1031), size_t(100003)}) {
          // The large size (several staging slices) for a subset only: the host reference is slow.
          if (count > 2000 && !(op == ReduceOp::Sum && (t == DType::F32 || t == DType::BF16 || t == DType::I64)))
            continue;
          // Algorithms alternate on the same world: the flags carry over between kinds of kernels.
          for (Algo a : {Algo::OneShot, Algo::TwoShot, Algo::Ring, Algo::Auto})
            run_sim(w, Coll::AllReduce, count, t, op, a, s, "all_reduce");
          run_sim(w, Coll::ReduceScatter, count, t, op, Algo::Ring, s, "reduce_scatter");
        }
    for (DType t : kDTypes)
      for (size_t count : {size_t(1), size_t(13), size_t(1031), size_t(100003)})
        run_sim(w, Coll::AllGather, count, t, ReduceOp::Sum, Algo::Ring, s, "all_gather");
  }
  CUDA_OK(cudaStreamDestroy(s));
}

// Random floats: one-shot, two-shot and ring give bitwise-identical results on every rank, within a
// stated tolerance of the float64 sum (one fp32 rounding per ring step: n * 2^-23 relative of the
// largest partial sum).
static void test_random_floats_identical() {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  std::mt19937 gen(7);
  std::normal_distribution<float> dist;
  for (int n : {3, 8}) {
    SimWorld w(n, small_config());
    const size_t count = 77777;
    std::vector<std::vector<float>> host(n, std::vector<float>(count));
    std::vector<double> sum(count, 0), mag(count, 0);
    std::vector<std::unique_ptr<DevBuf>> ins, outs;
    std::vector<const void*> ip;
    std::vector<void*> op_;
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; ++i) {
        host[q][i] = dist(gen);
        sum[i] += host[q][i];
        mag[i] += std::fabs(host[q][i]);
      }
      ins.emplace_back(new DevBuf(count * 4));
      CUDA_OK(cudaMemcpy(ins.back()->p, host[q].data(), count * 4, cudaMemcpyHostToDevice));
      outs.emplace_back(new DevBuf(count * 4));
      ip.push_back(ins.back()->p);
      op_.push_back(outs.back()->p);
    }
    for (Algo a : {Algo::OneShot, Algo::TwoShot, Algo::Ring}) {
      w.run(Coll::AllReduce, ip, op_, count, DType::F32, ReduceOp::Sum, a, s);
      CUDA_OK(cudaStreamSynchronize(s));
      std::vector<float> first(count), other(count);
      CUDA_OK(cudaMemcpy(first.data(), outs[0]->p, count * 4, cudaMemcpyDeviceToHost));
      size_t far = 0;
      for (size_t i = 0; i < count; ++i)
        if (std::fabs(first[i] - sum[i]) > n * std::ldexp(1.0, -23) * mag[i] + 1e-30) ++far;
      CHECK(far == 0, "random floats n=%d algo=%d: %zu elements beyond tolerance", n, static_cast<int>(a), far);
      for (int q = 1; q < n; ++q) {
        CUDA_OK(cudaMemcpy(other.data(), outs[q]->p, count * 4, cudaMemcpyDeviceToHost));
        CHECK(std::memcmp(first.data(), other.data(), count * 4) == 0, "n=%d algo=%d: rank %d differs from rank 0",
              n, static_cast<int>(a), q);
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(s));
}

// Capture one all-reduce per algorithm into a CUDA graph, replay it with new inputs each time.
static void test_graph_capture() {
  const int n = 4;
  const size_t count = 40009;
  SimWorld w(n, small_config());
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::unique_ptr<DevBuf>> ins, outs;
  std::vector<const void*> ip;
  std::vector<void*> op_;
  for (int q = 0; q < n; ++q) {
    ins.emplace_back(new DevBuf(count * 4));
    outs.emplace_back(new DevBuf(count * 4));
    ip.push_back(ins.back()->p);
    op_.push_back(outs.back()->p);
  }
  for (Algo a : {Algo::OneShot, Algo::TwoShot, Algo::Ring}) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    w.run(Coll::AllReduce, ip, op_, count, DType::I32, ReduceOp::Sum, a, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      for (int q = 0; q < n; ++q) ins[q]->upload(host_values(q + replay, count, DType::I32));
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (int q = 0; q < n; ++q) {
        std::vector<char> got = outs[q]->download();
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i)
          if (get(got, i, DType::I32) != reference(ReduceOp::Sum, n, i, DType::I32, replay)) ++bad;
        CHECK(bad == 0, "graph algo=%d replay %d rank %d: %zu wrong", static_cast<int>(a), replay, q, bad);
      }
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  CUDA_OK(cudaStreamDestroy(s));
}

// ---- the network ring driver over the loopback transport ----
// On the CPU grid with chaos on (unless RINGZERO_CPU_GRID_CHAOS says otherwise): each stream's worker
// pauses a random while before each item, so a cross-stream edge the driver left out shows.
static void test_loopback_driver() {
#if defined(RINGZERO_CPU_GRID)
  if (!std::getenv("RINGZERO_CPU_GRID_CHAOS")) ringzero::cpu_grid::set_chaos(20261129);
#endif
  for (int n : {1, 2, 3, 4, 8})
    for (DType t : {DType::I32, DType::F32, DType::BF16})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(70001)}) {
          const size_t es = dtype_size(t);
          nccl::LoopbackTransport lo;
          std::vector<std::unique_ptr<nccl::RingDriver>> drivers;
          std::vector<nccl::RingDriver*> dp;
          std::vector<cudaStream_t> streams(n);
          std::vector<std::unique_ptr<DevBuf>> ar, rs_in, rs_work, rs_out, ag_in, ag_out;
          for (int q = 0; q < n; ++q) {
            CUDA_OK(cudaStreamCreateWithFlags(&streams[q], cudaStreamNonBlocking));
            drivers.emplace_back(new nccl::RingDriver(q, n, 4096));  // small slices: many pipelined steps
            dp.push_back(drivers.back().get());
            ar.emplace_back(new DevBuf(count * es));
            ar.back()->upload(host_values(q, count, t));
            rs_in.emplace_back(new DevBuf(n * count * es));
            rs_in.back()->upload(host_values(q, n * count, t));
            rs_work.emplace_back(new DevBuf(n * count * es));
            rs_out.emplace_back(new DevBuf(count * es));
            ag_in.emplace_back(new DevBuf(count * es));
            ag_in.back()->upload(host_values(q, count, t));
            ag_out.emplace_back(new DevBuf(n * count * es));
          }
          for (int q = 0; q < n; ++q) drivers[q]->plan_all_reduce(ar[q]->p, count, t, op, streams[q]);
          nccl::run_rings(dp, lo);
          for (int q = 0; q < n; ++q)
            drivers[q]->plan_reduce_scatter(rs_in[q]->p, rs_work[q]->p, rs_out[q]->p, count, t, op, streams[q]);
          nccl::run_rings(dp, lo);
          for (int q = 0; q < n; ++q) drivers[q]->plan_all_gather(ag_in[q]->p, ag_out[q]->p, count, t, streams[q]);
          nccl::run_rings(dp, lo);
          for (int q = 0; q < n; ++q) CUDA_OK(cudaStreamSynchronize(streams[q]));
          // Partial sums of these small integers are exact in bf16 too: every result must match.
          for (int q = 0; q < n; ++q) {
            std::vector<char> a = ar[q]->download(), r = rs_out[q]->download(), g = ag_out[q]->download();
            a.resize(count * es + 8);
            r.resize(count * es + 8);
            g.resize(n * count * es + 8);
            size_t bad = 0;
            for (size_t i = 0; i < count; ++i) {
              bad += get(a, i, t) != reference(op, n, i, t);
              bad += get(r, i, t) != reference(op, n, q * count + i, t);
            }
            for (size_t i = 0; i < n * count; ++i) bad += get(g, i, t) != round_to(t, value(i / count, i % count));
            CHECK(bad == 0, "loopback n=%d %s %s count=%zu rank %d: %zu wrong", n, dtype_name(t), op_name(op), count,
                  q, bad);
          }
          drivers.clear();
          for (cudaStream_t st : streams) CUDA_OK(cudaStreamDestroy(st));
        }
}

// With arguments, only the parts they name (reduce, simulated, random_floats, graph, loopback): the
// mutation check runs the loopback driver alone.
int main(int argc, char** argv) {
  skip_without_gpu("test_cuda");
  const struct {
    const char* name;
    void (*run)();
  } parts[] = {{"reduce", test_reduce_kernel}, {"simulated", test_simulated},
               {"random_floats", test_random_floats_identical}, {"graph", test_graph_capture},
               {"loopback", test_loopback_driver}};
  for (int i = 1; i < argc; ++i) {
    bool known = false;
    for (const auto& part : parts) known = known || std::strcmp(argv[i], part.name) == 0;
    if (!known) {
      std::fprintf(stderr, "test_cuda: no part named %s\n", argv[i]);
      return 2;
    }
  }
  for (const auto& part : parts) {
    bool named = argc == 1;
    for (int i = 1; i < argc; ++i) named = named || std::strcmp(argv[i], part.name) == 0;
    if (named) part.run();
  }
  return finish();
}
