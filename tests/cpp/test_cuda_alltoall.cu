// Fuzz of the all-to-all(v) kernel (csrc/cuda/alltoall.cu) against a host reference that moves the same
// bytes (compared exactly, byte for byte, guard bytes past each output included): random world (1-8),
// staging size, blocks per rank, dtype (all eight: the kernel moves elements of 1, 2, 4 or 8 bytes), even
// and uneven splits with zero-length blocks (dense, sparse, one hot sender), counts of 0, 1, primes and
// near multiples of the staging slot and of its chunks, totals up to several staging buffers per rank,
// input and output 0, 2, 4, 8 or 12 bytes past an aligned address (torch views with a storage offset),
// and now and then counts past the buffers (a negative count, counts past the input, blocks past the
// output), which the kernel cuts as alltoall.cu says. The count tables live in device memory; the host
// launches without reading them. A world's cases run back to back with no synchronisation between them,
// so the count table and the staging carry over between launches, as in a real run.
//   RINGZERO_FUZZ_SEED=<n> RINGZERO_FUZZ_CASES=<n> build/cpp/test_cuda_alltoall   (the seed is printed)
// Without a CUDA device it prints SKIP and exits 77 (ctest's SKIP_RETURN_CODE).
// On the CPU grid (cpu_grid_test_cuda_alltoall) each world also draws a block size and chaos, and every
// other world has real ranks (a PeerComm per host thread, peers opened by IPC handle) that run the world's
// cases back to back without a join, so ranks drift across launches, as test_cuda_fuzz.cu's do.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
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

constexpr unsigned char kUnwritten = 0xA5;  // every output byte before the launch
constexpr size_t kGuardBytes = 64;          // past each output's end: must stay kUnwritten

// Byte i of rank q's input in a case (salt): no two cases, ranks or positions alike.
unsigned char input_byte(uint32_t salt, int q, size_t i) {
  uint64_t h = (static_cast<uint64_t>(salt) << 40) ^ (static_cast<uint64_t>(q) << 34) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<unsigned char>(h);
}

struct World {
  PeerConfig cfg;
  int n;
  unsigned block_threads = 0;  // CPU grid: the block size of every launch (0: the kernels' own)
  bool real_ranks = false;     // CPU grid: PeerComm per host thread instead of SimWorld
};

struct Case {
  DType dtype;
  std::vector<std::vector<int64_t>> counts;  // counts[q][p]: what rank q's table says it sends to p
  std::vector<size_t> in_elems, out_elems;   // the buffers' sizes
  size_t in_offset, out_offset;              // bytes past an aligned allocation
  const char* splits;                        // how the counts were drawn (for the report)
};

const DType kDTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I8, DType::U8, DType::I32, DType::I64};
const size_t kPrimes[] = {2, 3, 13, 1031, 4099};

World random_world(std::mt19937_64& g) {
  World w;
  w.n = 1 + static_cast<int>(g() % 8);
  // Small buffers more often: a rank's input then spans several staging slots within the cases' sizes.
  const size_t stagings[] = {64u << 10, 64u << 10, 128u << 10, 256u << 10, 1u << 20};
  w.cfg.staging_bytes = stagings[g() % 5];
  const int blocks[] = {1, 2, 3, 4, 8, 16, 32};
  w.cfg.max_blocks = blocks[g() % 7];
  w.cfg.ring_channels = 1;  // unused here; 1 always fits
  w.cfg.timeout_s = static_cast<double>(env_u64("RINGZERO_FUZZ_TIMEOUT_S", 60));  // the mutation check uses 5
#if defined(RINGZERO_CPU_GRID)
  const unsigned threads[] = {kThreads, kThreads, 8, 33, 64, 96, 127, 200};  // at least kMaxRanks
  w.block_threads = threads[g() % 8];
  w.real_ranks = g() % 2 == 0;
  if (w.real_ranks) w.cfg.max_blocks = std::min(w.cfg.max_blocks, 8);  // every rank's grid runs at once
#endif
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer every CUDA thread is a thread of its own, made anew at each launch, and this
  // kernel always runs max_blocks blocks per rank: 8 ranks x 8 blocks x 64 threads took a minute a world.
  w.cfg.max_blocks = std::min(w.cfg.max_blocks, 2);
#endif
  return w;
}

// One block's count: 0, 1, a prime, or near a multiple of a unit the kernel streams by.
size_t random_count(std::mt19937_64& g, const std::vector<size_t>& units, size_t pack) {
  const int pick = static_cast<int>(g() % 10);
  if (pick == 0) return 0;
  if (pick == 1) return 1;
  if (pick == 2) return kPrimes[g() % 5];
  const size_t unit = units[g() % units.size()];
  const long delta = static_cast<long>(g() % (2 * pack + 3)) - static_cast<long>(pack + 1);
  const long c = static_cast<long>((1 + g() % 3) * unit) + delta;
  return c < 0 ? 0 : static_cast<size_t>(c);
}

Case random_case(std::mt19937_64& g, const World& w) {
  Case c;
  const int n = w.n;
  c.dtype = kDTypes[g() % 8];
  const size_t es = dtype_size(c.dtype), pack = 16 / es;
  const size_t slot = (w.cfg.staging_bytes - kAllToAllHeaderBytes) / es / pack * pack;
  const size_t chunk = std::max(pack, std::min(static_cast<size_t>(kThreads) * 16 / es, slot / w.cfg.max_blocks / pack * pack));
  const std::vector<size_t> units = {slot / n, slot, chunk, pack, slot / (2 * n) + chunk};
  const size_t offsets[] = {0, 0, 0, 2, 4, 8, 12};  // aligned about half the time, as most tensors are
  c.in_offset = offsets[g() % 7];
  c.out_offset = offsets[g() % 7];
  if (c.in_offset % es) c.in_offset = 0;
  if (c.out_offset % es) c.out_offset = 0;
  // A rank's input stays under 4 staging buffers and 1 MiB (160 KiB under ThreadSanitizer: still 3
  // slices at 64 KiB of staging), the grid being slow; unaligned buffers take scalar copies, and a
  // 1-byte element moves one byte a step: less there.
#if defined(__SANITIZE_THREAD__)
  constexpr size_t kMostBytes = 160u << 10;
#else
  constexpr size_t kMostBytes = 1u << 20;
#endif
  size_t most = std::min<size_t>(4 * w.cfg.staging_bytes, kMostBytes) / es;
  if (c.in_offset || c.out_offset) most /= 4;
  if (es == 1) most /= 2;
  c.counts.assign(n, std::vector<int64_t>(n, 0));
  const int kind = static_cast<int>(g() % 4);
  c.splits = kind == 0 ? "even" : kind == 1 ? "uneven" : kind == 2 ? "sparse" : "hot-sender";
  if (kind == 0) {
    const size_t each = std::min(random_count(g, units, pack), most / n);
    for (auto& row : c.counts) std::fill(row.begin(), row.end(), static_cast<int64_t>(each));
  } else {
    const int hot = static_cast<int>(g() % n);
    for (int q = 0; q < n; ++q) {
      for (int p = 0; p < n; ++p) {
        const bool zero = (kind == 2 && g() % 3 != 0) || (kind == 3 && q != hot && g() % 2 == 0);
        c.counts[q][p] = zero ? 0 : static_cast<int64_t>(random_count(g, units, pack));
      }
      size_t sum = 0;
      for (int64_t v : c.counts[q]) sum += static_cast<size_t>(v);
      if (sum > most)  // scale the row down, zeros stay zeros
        for (int64_t& v : c.counts[q]) v = static_cast<int64_t>(static_cast<size_t>(v) * most / sum);
    }
  }
  c.in_elems.assign(n, 0);
  c.out_elems.assign(n, 0);
  for (int q = 0; q < n; ++q)
    for (int p = 0; p < n; ++p) {
      c.in_elems[q] += static_cast<size_t>(c.counts[q][p]);
      c.out_elems[p] += static_cast<size_t>(c.counts[q][p]);
    }
  if (g() % 8 == 0) {  // counts past the buffers: the kernel must keep to them
    c.splits = "cut";
    const int q = static_cast<int>(g() % n), p = static_cast<int>(g() % n);
    c.in_elems[q] -= std::min<size_t>(c.in_elems[q], g() % 4099);
    c.out_elems[p] -= std::min<size_t>(c.out_elems[p], g() % 4099);
    if (g() % 2 == 0) c.counts[g() % n][g() % n] = -1 - static_cast<int64_t>(g() % 1000);
  }
  return c;
}

std::string describe(const World& w, const Case& c) {
  char buf[256];
  size_t most = 0;
  for (size_t e : c.in_elems) most = std::max(most, e);
  std::snprintf(buf, sizeof buf, "world=%d staging=%zu max_blocks=%d %s splits=%s largest input=%zu offsets=%zu/%zu%s threads=%u",
                w.n, w.cfg.staging_bytes, w.cfg.max_blocks, dtype_name(c.dtype), c.splits, most, c.in_offset,
                c.out_offset, w.real_ranks ? " real-ranks" : "", w.block_threads);
  return buf;
}

// Rank r's expected output bytes (out_elems[r] * es + kGuardBytes), the cuts of alltoall.cu included.
std::vector<unsigned char> reference(const Case& c, int r, uint32_t salt) {
  const int n = static_cast<int>(c.counts.size());
  const size_t es = dtype_size(c.dtype);
  std::vector<std::vector<size_t>> cut(n, std::vector<size_t>(n, 0));  // counts as the kernel reads them
  for (int q = 0; q < n; ++q) {
    size_t total = 0;
    for (int p = 0; p < n; ++p) {
      const size_t v = c.counts[q][p] > 0 ? static_cast<size_t>(c.counts[q][p]) : 0;
      cut[q][p] = std::min(v, c.in_elems[q] - total);
      total += cut[q][p];
    }
  }
  std::vector<unsigned char> want(c.out_elems[r] * es + kGuardBytes, kUnwritten);
  size_t at = 0;
  for (int q = 0; q < n; ++q) {
    size_t from = 0;
    for (int p = 0; p < r; ++p) from += cut[q][p];
    const size_t len = at >= c.out_elems[r] ? 0 : std::min(cut[q][r], c.out_elems[r] - at);
    for (size_t b = 0; b < len * es; ++b) want[at * es + b] = input_byte(salt, q, from * es + b);
    at += cut[q][r];
  }
  return want;
}

// The ranks of a world: simulated (one SimWorld, one grid) or, on the CPU grid, real (one PeerComm per
// rank, each run from its own host thread as each process would, peers opened by IPC handle).
struct Ranks {
  std::unique_ptr<SimWorld> sim;
  std::vector<std::unique_ptr<PeerComm>> real;
  explicit Ranks(const World& w) {
    if (!w.real_ranks) {
      sim.reset(new SimWorld(w.n, w.cfg));
      return;
    }
#if defined(RINGZERO_CPU_GRID)
    // Rank q's setup and teardown act for process q + 1 (IPC's rules: no rank opens its own handle).
    std::vector<std::string> handles;
    for (int q = 0; q < w.n; ++q) {
      cpu_grid::set_process(q + 1);
      real.emplace_back(new PeerComm(q, w.n, w.cfg));
      handles.push_back(real.back()->ipc_handle());
    }
    for (int q = 0; q < w.n; ++q) {
      cpu_grid::set_process(q + 1);
      real[q]->open_peers(handles);
    }
    cpu_grid::set_process(0);
#endif
  }
  ~Ranks() {
#if defined(RINGZERO_CPU_GRID)
    for (size_t q = 0; q < real.size(); ++q) {
      cpu_grid::set_process(q + 1);
      real[q].reset();
    }
    cpu_grid::set_process(0);
#endif
  }
  void check() const {
    if (sim) return sim->check();
    for (auto& r : real) r->check();
  }
};

// One case's device buffers: every rank's input, output (with its guard) and count table, filled.
struct CaseBufs {
  std::vector<std::unique_ptr<DevBuf>> ins, outs, counts;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  std::vector<const int64_t*> count_ptrs;
};

CaseBufs prepare(const Case& c, uint32_t salt) {
  const int n = static_cast<int>(c.counts.size());
  const size_t es = dtype_size(c.dtype);
  CaseBufs b;
  for (int q = 0; q < n; ++q) {
    const size_t in_bytes = c.in_elems[q] * es, out_bytes = c.out_elems[q] * es + kGuardBytes;
    b.ins.emplace_back(new DevBuf(in_bytes + c.in_offset));
    std::vector<char> h(in_bytes + c.in_offset);
    for (size_t i = 0; i < in_bytes; ++i) h[c.in_offset + i] = static_cast<char>(input_byte(salt, q, i));
    b.ins.back()->upload(h);
    b.outs.emplace_back(new DevBuf(out_bytes + c.out_offset));
    b.outs.back()->upload(std::vector<char>(out_bytes + c.out_offset, static_cast<char>(kUnwritten)));
    b.counts.emplace_back(new DevBuf(n * sizeof(int64_t)));
    std::vector<char> t(n * sizeof(int64_t));
    std::memcpy(t.data(), c.counts[q].data(), t.size());
    b.counts.back()->upload(t);
    b.in_ptrs.push_back(static_cast<char*>(b.ins.back()->p) + c.in_offset);
    b.out_ptrs.push_back(static_cast<char*>(b.outs.back()->p) + c.out_offset);
    b.count_ptrs.push_back(static_cast<const int64_t*>(b.counts.back()->p));
  }
  return b;  // DevBuf::upload returns complete: the launches on other streams see the fills
}

// Every rank's output of a finished case, byte for byte; false on a mismatch.
bool verify(const World& w, const Case& c, uint32_t salt, const CaseBufs& b) {
  const size_t es = dtype_size(c.dtype);
  bool ok = true;
  for (int r = 0; r < w.n; ++r) {
    const std::vector<unsigned char> want = reference(c, r, salt);
    std::vector<unsigned char> got(want.size());
    CUDA_OK(cudaMemcpy(got.data(), b.out_ptrs[r], got.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i] && bad++ == 0) first = i;
    CHECK(bad == 0, "%s rank %d: %zu bytes wrong, first at byte %zu (element %zu%s): got 0x%02x want 0x%02x",
          describe(w, c).c_str(), r, bad, first, first / es, first >= c.out_elems[r] * es ? ", in the guard" : "",
          bad ? got[first] : 0, bad ? want[first] : 0);
    ok = ok && bad == 0;
  }
  return ok;
}

// Runs a world's cases back to back (no synchronisation between launches), then checks every output.
// Simulated ranks: one launch per case on `s`. Real ranks (CPU grid): each rank's host thread launches
// all cases on its own legacy stream, a short pause after one case in four, so ranks drift.
// Returns how many cases failed; throws when a launch or a wait failed (the world is unusable then).
int run_world(Ranks& ranks, const World& w, const std::vector<Case>& cases, uint32_t first_salt, uint64_t pause_seed,
              cudaStream_t s) {
  std::vector<CaseBufs> bufs;
  for (size_t k = 0; k < cases.size(); ++k) bufs.push_back(prepare(cases[k], first_salt + static_cast<uint32_t>(k)));
  if (ranks.sim) {
    for (size_t k = 0; k < cases.size(); ++k)
      ranks.sim->all_to_all(bufs[k].in_ptrs, cases[k].in_elems, bufs[k].out_ptrs, cases[k].out_elems,
                            bufs[k].count_ptrs, cases[k].dtype, s);
    CUDA_OK(cudaStreamSynchronize(s));
  } else {
#if defined(RINGZERO_CPU_GRID)
    std::vector<std::thread> threads;
    std::vector<std::string> errors(ranks.real.size());
    for (size_t q = 0; q < ranks.real.size(); ++q)
      threads.emplace_back([&, q] {
        std::mt19937_64 pause(pause_seed * 131 + q);
        try {
          for (size_t k = 0; k < cases.size(); ++k) {
            const Case& c = cases[k];
            ranks.real[q]->all_to_all(bufs[k].in_ptrs[q], c.in_elems[q], bufs[k].out_ptrs[q], c.out_elems[q],
                                      bufs[k].count_ptrs[q], c.dtype, nullptr);
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
#endif
  }
  ranks.check();  // a wait that ran out throws CommTimeoutError
  int failed = 0;
  for (size_t k = 0; k < cases.size(); ++k)
    if (!verify(w, cases[k], first_salt + static_cast<uint32_t>(k), bufs[k])) {
      ++failed;
      std::printf("FAILED case %u: %s\n", first_salt + static_cast<uint32_t>(k) - 1, describe(w, cases[k]).c_str());
    }
  return failed;
}

}  // namespace

int main() {
  skip_without_gpu("test_cuda_alltoall");
  const uint64_t seed = env_u64("RINGZERO_FUZZ_SEED", static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch().count()));
  const uint64_t cases = env_u64("RINGZERO_FUZZ_CASES", 150);
  std::printf("test_cuda_alltoall: seed %" PRIu64 ", %" PRIu64 " cases (RINGZERO_FUZZ_SEED=%" PRIu64
              " RINGZERO_FUZZ_CASES=%" PRIu64 " repeats this run)\n", seed, cases, seed, cases);
#if defined(RINGZERO_CPU_GRID)
  // As test_cuda_fuzz: chaos on unless RINGZERO_CPU_GRID_CHAOS says otherwise, and a fixed block size from
  // RINGZERO_CPU_GRID_THREADS replaces the drawn ones (the ThreadSanitizer run keeps blocks small).
  if (!std::getenv("RINGZERO_CPU_GRID_CHAOS")) cpu_grid::set_chaos(seed * 2 + 1);
  const bool fixed_threads = cpu_grid::block_threads() != 0;
  std::printf("test_cuda_alltoall: CPU grid, chaos seed %" PRIu64 "%s\n", cpu_grid::chaos_seed(),
              fixed_threads ? ", fixed block size" : "");
#endif
  std::fflush(stdout);
  std::mt19937_64 g(seed);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr uint64_t kCasesPerWorld = 6;
  uint64_t done = 0, failed = 0, multi_slice = 0, with_zero = 0, cut = 0;
  while (done < cases) {
    World w = random_world(g);
#if defined(RINGZERO_CPU_GRID)
    if (fixed_threads) w.block_threads = cpu_grid::block_threads();
    cpu_grid::set_block_threads(w.block_threads);
#endif
    std::vector<Case> seq;
    for (uint64_t k = 0; k < kCasesPerWorld && done + k < cases; ++k) {
      seq.push_back(random_case(g, w));
      const Case& c = seq.back();
      const size_t slot = (w.cfg.staging_bytes - kAllToAllHeaderBytes) / dtype_size(c.dtype);
      bool zero_block = false;
      for (const auto& row : c.counts)
        for (int64_t v : row) zero_block = zero_block || v <= 0;
      multi_slice += *std::max_element(c.in_elems.begin(), c.in_elems.end()) > slot;
      with_zero += zero_block;
      cut += std::strcmp(c.splits, "cut") == 0;
    }
    const uint64_t pause_seed = g();
    try {
      Ranks ranks(w);
      failed += run_world(ranks, w, seq, static_cast<uint32_t>(done + 1), pause_seed, s);
    } catch (const std::exception& e) {
      std::printf("cases %" PRIu64 "-%" PRIu64 " raised: %s\n", done, done + seq.size() - 1, e.what());
      CHECK(false, "%zu cases, first %s, raised", seq.size(), describe(w, seq[0]).c_str());
      failed += seq.size();
    }
    done += seq.size();
  }
  CUDA_OK(cudaStreamDestroy(s));
  std::printf("test_cuda_alltoall: %" PRIu64 " cases (%" PRIu64 " in several staging slices, %" PRIu64
              " with a zero-length block, %" PRIu64 " with counts past the buffers), %" PRIu64 " failed (seed %" PRIu64
              ")\n", cases, multi_slice, with_zero, cut, failed, seed);
  return finish();
}
