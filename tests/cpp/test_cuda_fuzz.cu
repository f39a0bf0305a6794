// Fuzz of the peer-memory collectives on simulated ranks (one GPU), against a host reference in double
// (exact: inputs are small integers, so every sum, product and average rounds once, as the kernels do):
// random world (2-8), staging size, ring channels, blocks, dtype, op, algorithm, in-place-ness and the
// buffers' offset from an aligned address (0, 2, 4, 8, 12 bytes: torch views with a storage offset), and
// counts around multiples of the staging slot, the two-shot slot, the ring slice and the ring
// iteration (plus 0, 1 and primes), for all-reduce, reduce-scatter and all-gather. Several cases run
// on one world, so flags and staging carry over between launches and kernels, as in a real run.
// This would have caught issue 15 (the one-shot/two-shot staging race at the last, shorter slice).
//   RINGZERO_FUZZ_SEED=<n> RINGZERO_FUZZ_CASES=<n> build/cpp/test_cuda_fuzz   (the seed is printed)
// Without a CUDA device it prints SKIP and exits 77 (ctest's SKIP_RETURN_CODE).
// The same source runs on the CPU grid (cpu_grid_test_cuda_fuzz, every CI run), where each world also
// draws a block size (512 as on the GPU, or an odd one: the kernels take blockDim from the launch),
// chaos (random yields and stalls at every sync point, seeded from the fuzz seed) and, for every
// other world, real ranks instead of simulated ones: one PeerComm per host thread, each launching its
// own grid, peer memory opened through the IPC handles as on a node. A real-rank world runs its cases
// as one sequence per rank thread, back to back with random pauses and no join between cases, so ranks
// drift across launches as DDP's collectives make them (every output checked after all ranks finish).
#include <cuda_runtime.h>

#include <chrono>
#include <exception>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/peer_comm.h"
#include "cuda_test_util.h"

#if defined(RINGZERO_CPU_GRID)
#include <thread>
#endif

using namespace ringzero;
using namespace ringzero::cuda;
using namespace ringzero::test;

namespace {

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

// A small integer of rank `rank` at position i, different in every case (salt): [-3, 3] without 0,
// or {-2, -1, 1, 2} for products (so that products of 8 stay exact in bfloat16 and float16 too).
double value(uint32_t salt, int rank, size_t i, ReduceOp op) {
  uint64_t h = (static_cast<uint64_t>(salt) << 40) ^ (static_cast<uint64_t>(rank) << 32) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  if (op == ReduceOp::Prod) {
    const int v = static_cast<int>(h % 4);
    return v < 2 ? v - 2 : v - 1;
  }
  const int v = static_cast<int>(h % 7) - 3;
  return v == 0 ? 1 : v;
}

// op over ranks 0..n-1 of value(salt, r, i), finished as the kernels finish it: Avg divides in float32
// for floating types (fp32 accumulation, one division) and truncates for integers; one rounding to t.
double reference(uint32_t salt, int n, size_t i, DType t, ReduceOp op) {
  double acc = value(salt, 0, i, op);
  for (int r = 1; r < n; ++r) {
    const double v = value(salt, r, i, op);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg)
    acc = integral(t) ? std::trunc(acc / n) : static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  return round_to(t, acc);
}

struct World {
  PeerConfig cfg;
  int n;
  unsigned block_threads = 0;  // CPU grid: the block size of every launch (0: the kernels' own)
  bool real_ranks = false;     // CPU grid: PeerComm per host thread instead of SimWorld
};

struct Case {
  Coll coll;
  Algo algo;
  DType dtype;
  ReduceOp op;
  size_t count;
  bool in_place;  // all-reduce only
  size_t offset;  // bytes from a 256-byte-aligned allocation to every rank's input and output, as a torch
                  // view with a storage offset has: 0, 2, 4, 8 or 12, a multiple of the element size
};

const DType kDTypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod};
const size_t kPrimes[] = {2, 3, 13, 1031, 4099, 65537, 100003};

World random_world(std::mt19937_64& g) {
  World w;
  w.n = 2 + static_cast<int>(g() % 7);
  const size_t stagings[] = {64u << 10, 128u << 10, 256u << 10, 1u << 20};
  w.cfg.staging_bytes = stagings[g() % 4];
  // ring_slot_bytes >= 4096: channels <= staging / (kRingSteps * 4096)
  const int most_channels = static_cast<int>(w.cfg.staging_bytes / (kRingSteps * 4096));
  w.cfg.ring_channels = 1 + static_cast<int>(g() % std::min(most_channels, 8));
  const int blocks[] = {1, 2, 3, 4, 8, 16, 32};
  w.cfg.max_blocks = blocks[g() % 7];
  w.cfg.timeout_s = static_cast<double>(env_u64("RINGZERO_FUZZ_TIMEOUT_S", 60));  // the mutation check uses 5
#if defined(RINGZERO_CPU_GRID)
  // Odd sizes, and sizes below a warp; at least kMaxRanks (block_barrier gives a thread to each rank).
  const unsigned threads[] = {kThreads, kThreads, 8, 33, 64, 96, 127, 200};
  w.block_threads = threads[g() % 8];
  w.real_ranks = g() % 2 == 0;
  if (w.real_ranks) w.cfg.max_blocks = std::min(w.cfg.max_blocks, 8);  // every rank's grid runs at once
#endif
  return w;
}

// A count near a multiple of a unit the kernels stream by, or a special size.
size_t random_count(std::mt19937_64& g, const World& w, const Case& c) {
  const size_t es = dtype_size(c.dtype), pack = 16 / es;
  const size_t slot = w.cfg.staging_bytes / es;
  const size_t ring_slice = ring_slot_bytes(w.cfg.staging_bytes, w.cfg.ring_channels) / es;
  const size_t units[] = {slot, slot / (w.n * pack) * (w.n * pack), ring_slice, ring_slice * w.cfg.ring_channels,
                          ring_slice * w.cfg.ring_channels * w.n};
  if (g() % 5 == 0) {
    const int pick = static_cast<int>(g() % 9);
    return pick == 0 ? 0 : pick == 1 ? 1 : kPrimes[pick - 2];
  }
  const size_t unit = units[g() % 5];
  const size_t k = 1 + g() % 4;
  const long delta = static_cast<long>(g() % (2 * pack + 3)) - static_cast<long>(pack + 1);
  long count = static_cast<long>(k * unit) + delta;
  // Keep a case's host work bounded: at most ~2M elements per rank in any buffer.
  const long most = static_cast<long>((2u << 20) / (c.coll == Coll::AllReduce ? 1 : w.n));
  if (count > most) count = most - static_cast<long>(g() % 97);
  return count < 0 ? 0 : static_cast<size_t>(count);
}

Case random_case(std::mt19937_64& g, const World& w) {
  Case c;
  const int kind = static_cast<int>(g() % 6);  // all-reduce half the time: three algorithms
  c.coll = kind < 3 ? Coll::AllReduce : kind < 5 ? Coll::ReduceScatter : Coll::AllGather;
  const Algo algos[] = {Algo::OneShot, Algo::TwoShot, Algo::Ring, Algo::Auto};
  c.algo = c.coll == Coll::AllReduce ? algos[g() % 4] : Algo::Ring;
  c.dtype = kDTypes[g() % 5];
  c.op = c.coll == Coll::AllGather ? ReduceOp::Sum : kOps[g() % 5];
  c.in_place = c.coll == Coll::AllReduce && g() % 2 == 0;
  c.count = random_count(g, w, c);
  const size_t offsets[] = {0, 0, 0, 2, 4, 8, 12};  // aligned half the time, as most tensors are
  c.offset = offsets[g() % 7];
  if (c.offset % dtype_size(c.dtype) != 0) c.offset = 0;
  // A misaligned buffer takes the scalar loop, many times slower on the grid (most under ThreadSanitizer,
  // where 2M elements at 6 ranks outran a 5 s kernel timeout): such cases stay under 2^17 + 4099
  // elements, still several staging slices for the smaller staging sizes.
  if (c.offset != 0 && c.count > (1u << 17)) c.count = (1u << 17) + c.count % 4099;
  return c;
}

std::string describe(const World& w, const Case& c) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "world=%d staging=%zu channels=%d max_blocks=%d coll=%d algo=%d %s %s count=%zu offset=%zu%s%s "
                "threads=%u",
                w.n, w.cfg.staging_bytes, w.cfg.ring_channels, w.cfg.max_blocks, static_cast<int>(c.coll),
                static_cast<int>(c.algo), dtype_name(c.dtype), op_name(c.op), c.count, c.offset, c.in_place ? " in-place" : "",
                w.real_ranks ? " real-ranks" : "", w.block_threads);
  return buf;
}

// The ranks of a world: simulated (one SimWorld, one grid) or, on the CPU grid, real (one PeerComm
// per rank, each run from its own host thread as each process would, peers opened by IPC handle).
struct Ranks {
  std::unique_ptr<SimWorld> sim;
  std::vector<std::unique_ptr<PeerComm>> real;
  Ranks(const World& w) {
    if (!w.real_ranks) {
      sim.reset(new SimWorld(w.n, w.cfg));
      return;
    }
#if defined(RINGZERO_CPU_GRID)
    // Rank q's setup and teardown act for process q + 1 (IPC's rules: no rank opens its own handle).
    std::vector<std::string> handles;
    for (int q = 0; q < w.n; ++q) {
      ringzero::cpu_grid::set_process(q + 1);
      real.emplace_back(new PeerComm(q, w.n, w.cfg));
      handles.push_back(real.back()->ipc_handle());
    }
    for (int q = 0; q < w.n; ++q) {
      ringzero::cpu_grid::set_process(q + 1);
      real[q]->open_peers(handles);
    }
    ringzero::cpu_grid::set_process(0);
#endif
  }
  ~Ranks() {
#if defined(RINGZERO_CPU_GRID)
    for (size_t q = 0; q < real.size(); ++q) {
      ringzero::cpu_grid::set_process(q + 1);
      real[q].reset();
    }
    ringzero::cpu_grid::set_process(0);
#endif
  }
  PeerConfig config() const { return sim ? sim->config() : real[0]->config(); }
  void run(Coll coll, const std::vector<const void*>& ins, const std::vector<void*>& outs, size_t count, DType t,
           ReduceOp op, Algo algo, cudaStream_t s) {
    if (sim) return sim->run(coll, ins, outs, count, t, op, algo, s);
#if defined(RINGZERO_CPU_GRID)
    std::vector<std::thread> threads;
    for (size_t q = 0; q < real.size(); ++q)
      threads.emplace_back([&, q] {
        real[q]->run(coll, ins[q], outs[q], count, t, op, algo, nullptr);
        CUDA_OK(cudaStreamSynchronize(nullptr));  // the rank's own legacy stream, as its process would
      });
    for (auto& th : threads) th.join();
#endif
  }
  void check() const {
    if (sim) return sim->check();
    for (auto& r : real) r->check();
  }
};

// One case's buffers: every rank's input and output, filled, at the case's offset.
struct CaseBufs {
  std::vector<std::unique_ptr<DevBuf>> ins, outs;
  std::vector<const void*> ip;
  std::vector<void*> op;
};

CaseBufs prepare(const World& w, const Case& c, uint32_t salt) {
  const int n = w.n;
  const size_t es = dtype_size(c.dtype);
  const size_t in_n = c.coll == Coll::ReduceScatter ? n * c.count : c.count;
  const size_t out_n = c.coll == Coll::AllGather ? n * c.count : c.count;
  CaseBufs b;
  for (int q = 0; q < n; ++q) {
    b.ins.emplace_back(new DevBuf(in_n * es + c.offset));
    char* in = static_cast<char*>(b.ins.back()->p) + c.offset;
    std::vector<char> h(in_n * es + 8);
    for (size_t i = 0; i < in_n; ++i) put(h, i, c.dtype, value(salt, q, i, c.op));
    CUDA_OK(cudaMemcpy(in, h.data(), in_n * es, cudaMemcpyHostToDevice));
    char* out = in;
    if (!c.in_place) {
      b.outs.emplace_back(new DevBuf(out_n * es + c.offset));
      out = static_cast<char*>(b.outs.back()->p) + c.offset;
      CUDA_OK(cudaMemset(out, 0x7f, out_n * es));  // an element never written shows
    }
    b.ip.push_back(in);
    b.op.push_back(out);
  }
  // The fills are legacy-stream work of this thread; the case runs on a non-blocking stream or on the
  // ranks' own threads, which are not ordered after it.
  CUDA_OK(cudaStreamSynchronize(nullptr));
  return b;
}

// Every rank's output of a finished case against the host reference; false on a mismatch.
bool verify(const World& w, const Case& c, uint32_t salt, const CaseBufs& b) {
  const int n = w.n;
  const size_t es = dtype_size(c.dtype);
  const size_t out_n = c.coll == Coll::AllGather ? n * c.count : c.count;
  bool ok = true;
  for (int q = 0; q < n; ++q) {
    std::vector<char> got(out_n * es + 8);
    CUDA_OK(cudaMemcpy(got.data(), b.op[q], out_n * es, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    double first_got = 0, first_want = 0;
    for (size_t i = 0; i < out_n; ++i) {
      double want;
      if (c.coll == Coll::AllGather) want = round_to(c.dtype, value(salt, static_cast<int>(i / c.count), i % c.count, c.op));
      else if (c.coll == Coll::ReduceScatter) want = reference(salt, n, q * c.count + i, c.dtype, c.op);
      else want = reference(salt, n, i, c.dtype, c.op);
      const double v = get(got, i, c.dtype);
      if (v != want) {
        if (bad++ == 0) first = i, first_got = v, first_want = want;
      }
    }
    CHECK(bad == 0, "%s rank %d: %zu wrong, first at %zu: got %g want %g", describe(w, c).c_str(), q, bad, first,
          first_got, first_want);
    ok = ok && bad == 0;
  }
  return ok;
}

// Runs one case on `sim` and checks every rank's output; returns false on a mismatch.
bool run_case(Ranks& sim, const World& w, const Case& c, uint32_t salt, cudaStream_t s) {
  CaseBufs b = prepare(w, c, salt);
  sim.run(c.coll, b.ip, b.op, c.count, c.dtype, c.op, c.algo, s);
  CUDA_OK(cudaStreamSynchronize(s));
  sim.check();  // a wait that ran out throws CommTimeoutError
  return verify(w, c, salt, b);
}

#if defined(RINGZERO_CPU_GRID)
// Ranks that drift, as DDP's back-to-back collectives make them: each rank's thread runs the whole
// sequence of cases without waiting for its peers between them (after one case in four a pause of up
// to 1 ms, its own), so a rank starts case k+1 while a peer is still in case k; every output is checked
// after all ranks finish. Returns how many cases failed.
int run_drifting(Ranks& ranks, const World& w, const std::vector<Case>& cases, uint32_t first_salt,
                 uint64_t pause_seed) {
  std::vector<CaseBufs> bufs;
  for (size_t k = 0; k < cases.size(); ++k) bufs.push_back(prepare(w, cases[k], first_salt + static_cast<uint32_t>(k)));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(ranks.real.size());
  for (size_t q = 0; q < ranks.real.size(); ++q)
    threads.emplace_back([&, q] {
      std::mt19937_64 pause(pause_seed * 131 + q);
      try {
        for (size_t k = 0; k < cases.size(); ++k) {
          const Case& c = cases[k];
          ranks.real[q]->run(c.coll, bufs[k].ip[q], bufs[k].op[q], c.count, c.dtype, c.op, c.algo, nullptr);
          // Mostly straight on (a rank that finished races into the next launch while a slower peer,
          // stalled by the chaos, is still in this one), now and then a pause of up to 1 ms.
          const uint64_t r = pause();
          if (r % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(r / 4 % 1000));
        }
      } catch (const std::exception& e) {
        errors[q] = e.what();
      }
      CUDA_OK(cudaStreamSynchronize(nullptr));  // the rank's launches ran on its own legacy stream
    });
  for (auto& th : threads) th.join();
  for (size_t q = 0; q < errors.size(); ++q)
    if (!errors[q].empty()) throw std::runtime_error("rank " + std::to_string(q) + ": " + errors[q]);
  ranks.check();
  int failed = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    if (!verify(w, cases[k], first_salt + static_cast<uint32_t>(k), bufs[k])) {
      ++failed;
      std::printf("FAILED drifting case %zu of %zu: %s\n", k, cases.size(), describe(w, cases[k]).c_str());
    }
  }
  return failed;
}
#endif

}  // namespace

int main() {
  skip_without_gpu("test_cuda_fuzz");
  const uint64_t seed = env_u64("RINGZERO_FUZZ_SEED", static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch().count()));
  const uint64_t cases = env_u64("RINGZERO_FUZZ_CASES", 300);
  std::printf("test_cuda_fuzz: seed %" PRIu64 ", %" PRIu64 " cases (RINGZERO_FUZZ_SEED=%" PRIu64
              " RINGZERO_FUZZ_CASES=%" PRIu64 " repeats this run)\n", seed, cases, seed, cases);
#if defined(RINGZERO_CPU_GRID)
  // Chaos on unless RINGZERO_CPU_GRID_CHAOS says otherwise (0: off); a fixed block size from
  // RINGZERO_CPU_GRID_THREADS replaces the drawn ones (the ThreadSanitizer run keeps blocks small).
  if (!std::getenv("RINGZERO_CPU_GRID_CHAOS")) ringzero::cpu_grid::set_chaos(seed * 2 + 1);
  const bool fixed_threads = ringzero::cpu_grid::block_threads() != 0;
  std::printf("test_cuda_fuzz: CPU grid, chaos seed %" PRIu64 "%s (interleavings of OS threads are not "
              "reproducible; the cases are)\n",
              ringzero::cpu_grid::chaos_seed(), fixed_threads ? ", fixed block size" : "");
#endif
  std::fflush(stdout);
  std::mt19937_64 g(seed);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr uint64_t kCasesPerWorld = 6;
  uint64_t done = 0, failed = 0;
  while (done < cases) {
    World w = random_world(g);
#if defined(RINGZERO_CPU_GRID)
    if (fixed_threads) w.block_threads = ringzero::cpu_grid::block_threads();
    ringzero::cpu_grid::set_block_threads(w.block_threads);
#endif
    Ranks sim(w);
    w.cfg = sim.config();  // ring channels as SimWorld kept them (at most SMs / ranks)
#if defined(RINGZERO_CPU_GRID)
    if (w.real_ranks) {  // every real-rank world: its cases back to back, the ranks drifting
      std::vector<Case> seq;
      for (uint64_t k = 0; k < kCasesPerWorld && done + k < cases; ++k) {
        Case c = random_case(g, w);
        // Every case's buffers live at once here: large ones stay under 2^18 elements.
        if (c.count > (1u << 18)) c.count = (1u << 18) + c.count % 4099;
        seq.push_back(c);
      }
      try {
        failed += run_drifting(sim, w, seq, static_cast<uint32_t>(done + 1), g());
      } catch (const std::exception& e) {
        std::printf("drifting sequence at case %" PRIu64 " raised: %s\n", done, e.what());
        CHECK(false, "drifting sequence of %zu cases, first %s, raised", seq.size(), describe(w, seq[0]).c_str());
        ++failed;
      }
      done += seq.size();
      continue;
    }
#endif
    for (uint64_t k = 0; k < kCasesPerWorld && done < cases; ++k, ++done) {
      const Case c = random_case(g, w);
      bool ok = false, world_dead = false;
      try {
        ok = run_case(sim, w, c, static_cast<uint32_t>(done + 1), s);
      } catch (const std::exception& e) {  // a wait that ran out: this world's flags no longer agree
        std::printf("case %" PRIu64 " raised: %s\n", done, e.what());
        CHECK(false, "%s raised", describe(w, c).c_str());
        world_dead = true;
      }
      if (!ok) {
        ++failed;
        std::printf("FAILED case %" PRIu64 ": %s\n", done, describe(w, c).c_str());
      }
      if (world_dead) {
        ++done;
        break;
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(s));
  std::printf("test_cuda_fuzz: %" PRIu64 " cases, %" PRIu64 " failed (seed %" PRIu64 ")\n", cases, failed, seed);
  return finish();
}
