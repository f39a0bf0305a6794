// C++ tests of the core without torch: every reduction table against a scalar float64/int64 reference,
// and every shared-memory collective with N ranks as threads of one process against the same reference.
// Integer-valued inputs keep every sum exact, so results must match exactly.
#include <sys/mman.h>
#include <sys/utsname.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/chunks.h"
#include "core/errors.h"
#include "core/half.h"
#include "core/reduce.h"
#include "core/shm_comm.h"
#include "core/shm_single_copy.h"
#include "test_util.h"
#include "core/shm_p2p.h"

using namespace ringzero;

namespace ringzero {
const ReduceTable* reduce_table_baseline();
const ReduceTable* reduce_table_avx2();
const ReduceTable* reduce_table_avx512();
}  // namespace ringzero

// Small integers in [-3, 3] \ {0} (uint8: [0, 3]) varying with both rank and position; sums stay exact
// in every dtype, products may wrap in 8 bits (the reference wraps the same way).
static double value(int rank, size_t i, DType t) {
  const int v = static_cast<int>((i * 5 + static_cast<size_t>(rank) * 3) % 7) - 3;
  if (t == DType::U8) return static_cast<double>((v + 3) % 4);
  return v == 0 ? 1 : v;
}

static double wrap_to(DType t, double v) {
  switch (t) {
    case DType::I8: return static_cast<int8_t>(static_cast<int64_t>(v));
    case DType::U8: return static_cast<uint8_t>(static_cast<int64_t>(v));
    default: return v;
  }
}

static double reference(ReduceOp op, int nranks, size_t i, DType t) {
  double acc = value(0, i, t);
  for (int r = 1; r < nranks; ++r) {
    const double v = value(r, i, t);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  acc = wrap_to(t, acc);
  if (op == ReduceOp::Avg) {
    const bool integral = t == DType::I8 || t == DType::U8 || t == DType::I32 || t == DType::I64;
    acc = integral ? std::trunc(acc / nranks) : acc / nranks;
    if (t == DType::BF16) acc = bf16_to_f32(f32_to_bf16(static_cast<float>(acc)));
    if (t == DType::F16) acc = static_cast<float>(static_cast<_Float16>(static_cast<float>(acc)));
    if (t == DType::F32) acc = static_cast<float>(acc);
  }
  return acc;
}

static const DType kDTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                DType::I8,  DType::U8,  DType::I32,  DType::I64};
static const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod};

static void test_reduce_tables() {
  std::vector<std::pair<const char*, const ReduceTable*>> tables = {{"baseline", reduce_table_baseline()}};
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
    tables.push_back({"avx2", reduce_table_avx2()});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    tables.push_back({"avx512", reduce_table_avx512()});
#endif
  for (auto [name, table] : tables) {
    for (DType t : kDTypes)
      for (ReduceOp op : kOps)
        for (int nsrc : {1, 2, 3, 5})
          for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(1031)}) {
            const size_t es = dtype_size(t);
            std::vector<std::vector<char>> in(nsrc, std::vector<char>(count * es + 1));
            std::vector<const void*> srcs;
            for (int r = 0; r < nsrc; ++r) {
              for (size_t i = 0; i < count; ++i) put(in[r].data(), i, t, value(r, i, t));
              srcs.push_back(in[r].data());
            }
            std::vector<char> out(count * es + 1);
            const ReduceOp base = op == ReduceOp::Avg ? ReduceOp::Sum : op;
            table->reduce_n(out.data(), srcs.data(), nsrc, count, t, base, op == ReduceOp::Avg ? nsrc : 1);
            for (size_t i = 0; i < count; ++i) {
              const double want = reference(op, nsrc, i, t), got = get(out.data(), i, t);
              if (got != want) {
                CHECK(false, "%s reduce %s %s nsrc=%d count=%zu i=%zu: got %g want %g", name, dtype_name(t),
                      op_name(op), nsrc, count, i, got, want);
                break;
              }
            }
          }
  }
  // bf16 rounding: round to nearest even, NaN stays NaN.
  CHECK(f32_to_bf16(1.0f + 1.0f / 256) == f32_to_bf16(1.0f), "bf16 ties go to even");
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))), "bf16 keeps NaN");
  std::printf("reduce tables: %zu ISAs checked, dispatch picked %s\n", tables.size(), reduce_isa());
}

// Runs fn(rank, comm) on `n` threads sharing one segment.
static void run_ranks(int n, size_t slot_bytes, double timeout_s,
                      const std::function<void(int, ShmComm&)>& fn) {
  auto root = std::make_unique<ShmComm>("", 0, n, slot_bytes, timeout_s, std::vector<int>{});
  const std::string name = root->name();
  std::atomic<int> opened{1};
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r)
    threads.emplace_back([&, r] {
      ShmComm c(name, r, n, slot_bytes, timeout_s, {});
      ++opened;
      fn(r, c);
    });
  while (opened.load() < n) std::this_thread::yield();
  root->unlink();
  fn(0, *root);
  for (auto& t : threads) t.join();
}

static void check_buffer(const char* what, const std::vector<char>& buf, size_t count, DType t,
                         const std::function<double(size_t)>& want, int rank) {
  for (size_t i = 0; i < count; ++i) {
    if (get(buf.data(), i, t) != want(i)) {
      CHECK(false, "%s %s rank %d count %zu i=%zu: got %g want %g", what, dtype_name(t), rank, count, i,
            get(buf.data(), i, t), want(i));
      return;
    }
  }
}

static void test_collectives() {
  const size_t slot_bytes = 1024;  // small, so that most sizes stream through several slices
  int cases = 0;
  for (int n = 1; n <= 5; ++n) {
    run_ranks(n, slot_bytes, 30, [&](int rank, ShmComm& c) {
      for (DType t : kDTypes) {
        const size_t es = dtype_size(t);
        for (size_t count : {size_t(0), size_t(1), size_t(61), size_t(1021), size_t(3 * slot_bytes / es + 7)}) {
          auto mine = [&](size_t i) { return value(rank, i, t); };
          std::vector<char> in(count * es + 1), out(count * es + 1);
          for (size_t i = 0; i < count; ++i) put(in.data(), i, t, mine(i));
          for (ReduceOp op : kOps) {
            for (int ai = 1; ai < kNumAllReduceAlgos; ++ai) {  // every CPU algorithm (RINGZERO_CPU_ALL_REDUCE_ALGOS)
              const AllReduceAlgo a = static_cast<AllReduceAlgo>(ai);
              std::vector<char> buf = in;  // in place
              c.all_reduce(buf.data(), buf.data(), count, t, op, a);
              check_buffer("all_reduce", buf, count, t, [&](size_t i) { return reference(op, n, i, t); }, rank);
            }
            // reduce-scatter: rank q's block holds elements i of a long input of n*count elements
            std::vector<char> rs_in(n * count * es + 1), rs_out(count * es + 1);
            for (size_t i = 0; i < n * count; ++i) put(rs_in.data(), i, t, value(rank, i, t));
            c.reduce_scatter(rs_in.data(), rs_out.data(), count, t, op);
            check_buffer("reduce_scatter", rs_out, count, t,
                         [&](size_t i) { return reference(op, n, rank * count + i, t); }, rank);
            const int root = static_cast<int>(count % n);
            std::vector<char> red_out(count * es + 1);
            c.reduce(in.data(), red_out.data(), count, t, op, root);
            if (rank == root)
              check_buffer("reduce", red_out, count, t, [&](size_t i) { return reference(op, n, i, t); }, rank);
          }
          std::vector<char> ag(n * count * es + 1);
          c.all_gather(in.data(), ag.data(), count, t);
          check_buffer("all_gather", ag, n * count, t,
                       [&](size_t i) { return value(static_cast<int>(i / std::max<size_t>(count, 1)), i % std::max<size_t>(count, 1), t); },
                       rank);
          std::vector<size_t> counts;
          size_t total = 0;
          for (int q = 0; q < n; ++q) counts.push_back((count * (q + 1)) / n), total += counts.back();
          std::vector<char> agv(total * es + 1);
          c.all_gather_v(in.data(), agv.data(), counts, t);
          size_t off = 0;
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < counts[q]; ++i)
              if (get(agv.data(), off + i, t) != value(q, i, t)) {
                CHECK(false, "all_gather_v n=%d count=%zu q=%d i=%zu", n, count, q, i);
                break;
              }
            off += counts[q];
          }
          const int root = static_cast<int>((count + 1) % n);
          std::vector<char> bc = rank == root ? in : std::vector<char>(count * es + 1);
          c.broadcast(bc.data(), count, t, root);
          check_buffer("broadcast", bc, count, t, [&](size_t i) { return value(root, i, t); }, rank);
          c.barrier();
          if (rank == 0) ++cases;
        }
      }
    });
  }
  std::printf("collectives: %d (world, dtype, count) cases checked\n", cases);
}

static void test_mismatch_and_timeout() {
  run_ranks(3, 4096, 10, [&](int rank, ShmComm& c) {
    std::vector<float> buf(16, 1.0f);
    bool raised = false;
    try {
      if (rank == 1) c.broadcast(buf.data(), 16, DType::F32, 0);
      else c.all_reduce(buf.data(), buf.data(), 16, DType::F32, ReduceOp::Sum);
    } catch (const CollectiveMismatchError& e) {
      raised = std::string(e.what()).find("broadcast") != std::string::npos;
    }
    CHECK(raised, "rank %d: mismatch must raise CollectiveMismatchError naming both ops", rank);
    // The communicator stays usable after a mismatch.
    c.all_reduce(buf.data(), buf.data(), 16, DType::F32, ReduceOp::Sum);
    CHECK(buf[0] == 3.0f, "rank %d: all_reduce after mismatch gave %g", rank, buf[0]);
  });
  // Rank 2 never calls: the others time out naming it, and rank 2 then sees the abort.
  run_ranks(3, 4096, 0.3, [&](int rank, ShmComm& c) {
    std::vector<float> buf(16, 1.0f);
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
    }
    std::string msg;
    try {
      c.all_reduce(buf.data(), buf.data(), 16, DType::F32, ReduceOp::Sum);
    } catch (const CommTimeoutError& e) {
      msg = e.what();
    }
    CHECK(!msg.empty(), "rank %d: expected CommTimeoutError", rank);
    if (rank != 2) CHECK(msg.find("[2]") != std::string::npos, "rank %d message names rank 2: %s", rank, msg.c_str());
  });
  std::printf("mismatch and timeout: checked\n");
}

// Point-to-point: every ordered pair of 3 ranks (threads) exchanges messages of 0, 1, 191 and 5000
// bytes (the last ones stream through many 256-byte slots and wrap the ring), each direction on its
// own thread, every byte checked; then a size mismatch and a recv that nobody answers.
static void test_p2p() {
  constexpr int n = 3;
  constexpr size_t slot = 256;
  std::vector<std::unique_ptr<ShmP2P>> p;
  p.push_back(std::make_unique<ShmP2P>("", 0, n, slot));
  for (int r = 1; r < n; ++r) p.push_back(std::make_unique<ShmP2P>(p[0]->name(), r, n, slot));
  p[0]->unlink();
  const size_t sizes[] = {0, 1, 191, 5000, 5000};
  auto byte = [](int src, int dst, size_t k, size_t i) { return static_cast<char>((src * 31 + dst * 7 + k + i) & 255); };
  std::atomic<int> messages{0};
  std::vector<std::thread> threads;
  for (int src = 0; src < n; ++src)
    for (int dst = 0; dst < n; ++dst) {
      if (src == dst) continue;
      threads.emplace_back([&, src, dst] {
        for (size_t k = 0; k < 5; ++k) {
          std::vector<char> msg(sizes[k]);
          for (size_t i = 0; i < msg.size(); ++i) msg[i] = byte(src, dst, k, i);
          p[src]->send(msg.data(), msg.size(), dst, 10);
        }
      });
      threads.emplace_back([&, src, dst] {
        for (size_t k = 0; k < 5; ++k) {
          std::vector<char> got(sizes[k], 0);
          p[dst]->recv(got.data(), got.size(), src, 10);
          bool same = true;
          for (size_t i = 0; i < got.size(); ++i) same = same && got[i] == byte(src, dst, k, i);
          CHECK(same, "p2p %d -> %d message %zu (%zu bytes) differs", src, dst, k, sizes[k]);
          ++messages;
        }
      });
    }
  for (auto& t : threads) t.join();
  CHECK(messages == n * (n - 1) * 5, "p2p: %d messages arrived", messages.load());

  std::vector<char> buf(12);
  p[0]->send(buf.data(), 10, 1, 10);
  bool mismatch = false;
  try {
    p[1]->recv(buf.data(), 12, 0, 10);
  } catch (const CollectiveMismatchError& e) {
    mismatch = std::string(e.what()).find("expected 12 bytes") != std::string::npos;
  }
  CHECK(mismatch, "p2p: a recv of the wrong size must raise CollectiveMismatchError");
  std::string timeout;
  try {
    p[2]->recv(buf.data(), 4, 0, 0.1);
  } catch (const CommTimeoutError& e) {
    timeout = e.what();
  }
  CHECK(timeout.find("rank 0") != std::string::npos, "p2p: an unanswered recv must time out naming rank 0: %s",
        timeout.c_str());
  std::printf("p2p: %d messages checked\n", messages.load());
}

// The single-copy all-gather ([Note: single copy between a host's ranks], csrc/core/shm_single_copy.cpp)
// against the same reference: blocks just under, at and over kCpuThresholds.single_copy_min_bytes (the first runs staged,
// the others single-copy), a prime count several times the threshold, in place and not, worlds 1-5;
// then with single copy turned off on every rank, and on rank 0 alone (its vote turns it off everywhere:
// staged throughout, never a rank staging while its peers read directly), and a mismatch between a
// rank that would read its peers directly and one that would stage.
static void test_single_copy() {
  int cases = 0;
  for (int setting : {0, 1, 2}) {  // allowed everywhere, nowhere, everywhere but on rank 0
    for (int n = 1; n <= 5; ++n) {
      run_ranks(n, 4096, 30, [&](int rank, ShmComm& c) {
        const bool allowed = setting == 0 || (setting == 2 && rank != 0);
        c.set_single_copy(allowed);
        CHECK(c.single_copy() == 0, "rank %d: single_copy() before any call is %d", rank, c.single_copy());
        for (DType t : {DType::F32, DType::BF16, DType::I64}) {
          const size_t es = dtype_size(t), at = kCpuThresholds.single_copy_min_bytes / es;
          for (size_t count : {at - 1, at, 3 * at + 7, size_t(1000003)}) {
            for (bool in_place : {false, true}) {
              std::vector<char> out(n * count * es + 1, 0x5a);
              std::vector<char> in(count * es);
              char* src = in_place ? out.data() + rank * count * es : in.data();
              for (size_t i = 0; i < count; ++i) put(src, i, t, value(rank, i, t));
              c.all_gather(src, out.data(), count, t);
              check_buffer(in_place ? "single-copy all_gather in place" : "single-copy all_gather", out, n * count, t,
                           [&](size_t i) { return value(static_cast<int>(i / count), i % count, t); }, rank);
              CHECK(out[n * count * es] == 0x5a, "rank %d: all_gather wrote past its output", rank);
              if (rank == 0) ++cases;
            }
          }
        }
        const int want = n == 1 ? 0 : setting == 0 ? 1 : 2;  // one rank gathers by memcpy: nothing to decide
        CHECK(c.single_copy() == want, "rank %d of %d: single_copy() is %d, want %d", rank, n, c.single_copy(), want);
      });
    }
  }
  run_ranks(2, 4096, 10, [&](int rank, ShmComm& c) {
    const size_t big = kCpuThresholds.single_copy_min_bytes / 4, count = rank == 0 ? big : 16;
    std::vector<float> in(count, 1.0f), out(2 * big);
    bool raised = false;
    try {
      c.all_gather(in.data(), out.data(), count, DType::F32);
    } catch (const CollectiveMismatchError&) {
      raised = true;
    }
    CHECK(raised, "rank %d: a single-copy all-gather against a staged one must raise a mismatch", rank);
    std::vector<float> again(big, static_cast<float>(rank + 1));
    c.all_gather(again.data(), out.data(), big, DType::F32);
    CHECK(out[0] == 1.0f && out[2 * big - 1] == 2.0f, "rank %d: all_gather after the mismatch gave %g, %g", rank,
          out[0], out[2 * big - 1]);
  });
  std::printf("single copy: %d (world, dtype, count, placement) cases checked, on, off, and off on one rank\n", cases);
}

// Anonymous memory on a 2 MiB boundary, advised for transparent huge pages or against them, touched.
struct Mapping {
  Mapping(size_t bytes, bool huge) : len(bytes + (2 << 20)) {
    base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(base != MAP_FAILED, "mmap of %zu bytes failed", len);
    data = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + (2 << 20) - 1) & ~uintptr_t((2 << 20) - 1));
    madvise(data, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(data, 0x5a, bytes);
  }
  ~Mapping() { munmap(base, len); }
  size_t len;
  void* base;
  char* data;
};

// A block of kCpuThresholds.single_copy_end_bytes (8 MiB) and more is read directly only when every rank's input lies on
// huge pages (on_huge_pages, csrc/core/shm_single_copy.cpp), else staged on every rank: worlds 2 and 3, every
// rank's input on huge pages, every one on small pages, and the last rank's alone on small pages; blocks of
// 8 MiB and a prime count past it (not on a 2 MiB boundary after the first), in place and not. Values distinct
// in every element and rank (int32: exact); single_copy_calls() tells which path ran. Where this kernel cannot
// tell huge pages (PAGEMAP_SCAN, Linux 6.7+; THP off), it says so and every case must have staged.
static void test_single_copy_huge_pages() {
  const size_t end = kCpuThresholds.single_copy_end_bytes / 4;
  bool tells = false;
  {
    Mapping huge(kCpuThresholds.single_copy_end_bytes, true), small(kCpuThresholds.single_copy_end_bytes, false);
    tells = on_huge_pages(huge.data, kCpuThresholds.single_copy_end_bytes);
    CHECK(!on_huge_pages(small.data, kCpuThresholds.single_copy_end_bytes), "8 MiB advised against huge pages passed as huge");
    CHECK(!on_huge_pages(small.data + 4096, 3 << 20), "3 MiB on small pages passed as huge");
    if (tells) CHECK(on_huge_pages(huge.data + 12345, kCpuThresholds.single_copy_end_bytes - 20000), "an unaligned piece of huge pages failed");
  }
  // A kernel that has PAGEMAP_SCAN (6.7+) and transparent huge pages on must tell (else the cases below would
  // pass with every one staged, whatever on_huge_pages does).
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) == 0) std::sscanf(u.release, "%d.%d", &major, &minor);
  std::string thp;
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {
    char line[128] = {};
    if (std::fgets(line, sizeof(line), f)) thp = line;
    std::fclose(f);
  }
  const bool should_tell = (major > 6 || (major == 6 && minor >= 7)) && !thp.empty() && thp.find("[never]") == std::string::npos;
  CHECK(tells || !should_tell, "Linux %d.%d with transparent huge pages (%s) but on_huge_pages saw none", major, minor,
        thp.c_str());
  if (!tells) std::printf("single copy on huge pages: this kernel does not tell huge pages apart; every case must stage\n");
  int cases = 0;
  for (int n : {2, 3}) {
    for (int setting : {0, 1, 2}) {  // all on huge pages, none, all but the last rank
      run_ranks(n, 64 << 10, 60, [&](int rank, ShmComm& c) {
        const bool huge = setting == 0 || (setting == 2 && rank != n - 1);
        for (size_t count : {end, end + 1009}) {
          for (bool in_place : {false, true}) {
            Mapping out(n * count * 4 + 4, huge), in(count * 4, huge);
            int32_t* o = reinterpret_cast<int32_t*>(out.data);
            int32_t* src = in_place ? o + rank * count : reinterpret_cast<int32_t*>(in.data);
            for (size_t i = 0; i < count; ++i) src[i] = static_cast<int32_t>((rank << 24) + i);
            o[n * count] = -7;
            const uint64_t before = c.single_copy_calls();
            c.all_gather(src, o, count, DType::I32);
            size_t bad = n * count;
            for (size_t i = 0; i < n * count && bad == n * count; ++i)
              if (o[i] != static_cast<int32_t>(((i / count) << 24) + i % count)) bad = i;
            CHECK(bad == n * count, "rank %d of %d (setting %d, count %zu, in place %d): element %zu is %d", rank, n,
                  setting, count, in_place, bad, bad < n * count ? o[bad] : 0);
            CHECK(o[n * count] == -7, "rank %d: all_gather wrote past its output", rank);
            const uint64_t want = setting == 0 && tells ? 1 : 0;
            CHECK(c.single_copy_calls() - before == want, "rank %d of %d (setting %d, count %zu): %llu direct reads, want %llu",
                  rank, n, setting, count, static_cast<unsigned long long>(c.single_copy_calls() - before),
                  static_cast<unsigned long long>(want));
            if (rank == 0) ++cases;
          }
        }
      });
    }
  }
  std::printf("single copy on huge pages: %d cases checked (%s)\n", cases,
              tells ? "read directly where every rank was on huge pages" : "all staged: the kernel cannot tell");
}

int main() {
  test_reduce_tables();
  test_collectives();
  test_single_copy();
  test_single_copy_huge_pages();
  test_mismatch_and_timeout();
  test_p2p();
  if (g_failures) {
    std::printf("%d failures\n", g_failures);
    return 1;
  }
  std::printf("all core tests passed\n");
  return 0;
}
