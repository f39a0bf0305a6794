// The staging schedule of the one-shot and two-shot kernels, checked on the host (no GPU, no nvcc):
// the kernels' own slice arithmetic (csrc/cuda/schedule.h) replayed for many counts, slots, block
// counts, pack sizes and worlds, against three rules the kernels rely on:
//   1. every element of the message goes through exactly one slice and block (reference: a count per
//      element), and no part leaves the staging slot;
//   2. reuse: what block b writes into staging in slice s+1 was touched in slice s by block b only,
//      since barrier 2 (3 for two-shot) of block b synchronises only block b of the ranks
//      ([Note: fixed slice partition] in oneshot.cu);
//   3. parts start on whole packs (16-byte loads).
// It also replays the schedule of before issue 15 (each slice split by its own length) and requires
// rule 2 to fail on the H100 case (3 ranks, n = 300007 floats, 256 KiB staging, 8 blocks), printing
// the overwrite: the root cause, shown without a GPU.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/schedule.h"

using namespace ringzero::cuda;

namespace {

int g_failures = 0, g_checks = 0;
#define EXPECT(cond, ...)                             \
  do {                                                \
    ++g_checks;                                       \
    if (!(cond) && ++g_failures < 20) {               \
      std::fprintf(stderr, "FAIL line %d: ", __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);              \
      std::fprintf(stderr, "\n");                     \
    }                                                 \
  } while (0)

struct Range {
  size_t lo, hi;  // staging elements [lo, hi)
};
struct Part {
  size_t off;                 // the slice's first element in the message
  std::vector<Range> ranges;  // staging ranges the block writes and reads in this slice
};
// schedule[s][b]: block b's part of slice s.
using Schedule = std::vector<std::vector<Part>>;

// One-shot: staging [lo, hi) of the slice; fixed = the kernel's schedule, else the one before issue 15.
Schedule one_shot(size_t count, size_t slot, int nblocks, size_t pack, bool fixed) {
  Schedule sched;
  const size_t slice = fixed ? even_slice(count, slot, pack) : slot;
  for (size_t off = 0; off < count; off += slice) {
    const size_t len = count - off < slice ? count - off : slice;
    sched.emplace_back();
    for (int b = 0; b < nblocks; ++b) {
      size_t begin, end;
      block_range(fixed ? slice : len, b, nblocks, pack, &begin, &end);
      const size_t lo = begin < len ? begin : len, hi = end < len ? end : len;
      sched.back().push_back(Part{off, {Range{lo, hi}}});
    }
  }
  return sched;
}

// Two-shot: chunk k's sub-range of every chunk of the slice, k = 0..n-1.
Schedule two_shot(size_t count, size_t slot, int nblocks, size_t pack, int n, bool fixed) {
  Schedule sched;
  const size_t slice = fixed ? even_slice(count, slot, n * pack) : slot;
  for (size_t off = 0; off < count; off += slice) {
    const size_t len = count - off < slice ? count - off : slice;
    const size_t chunk = fixed ? slice / n : (len + n * pack - 1) / (n * pack) * pack;
    sched.emplace_back();
    for (int b = 0; b < nblocks; ++b) {
      size_t b0, b1;
      block_range(chunk, b, nblocks, pack, &b0, &b1);
      Part part{off, {}};
      for (int k = 0; k < n; ++k) {
        const size_t lo = k * chunk + b0, hi = k * chunk + b1;
        part.ranges.push_back(lo >= len ? Range{len, len} : Range{lo, hi < len ? hi : len});
      }
      sched.back().push_back(part);
    }
  }
  return sched;
}

struct Owned {
  size_t lo, hi, block;
};

// Non-empty ranges of one slice with their block, sorted (blocks of one slice own disjoint ranges).
std::vector<Owned> owned(const std::vector<Part>& slice) {
  std::vector<Owned> v;
  for (size_t b = 0; b < slice.size(); ++b)
    for (const Range& r : slice[b].ranges)
      if (r.lo < r.hi) v.push_back(Owned{r.lo, r.hi, b});
  std::sort(v.begin(), v.end(), [](const Owned& x, const Owned& y) { return x.lo < y.lo; });
  return v;
}

// The first reuse conflict (rule 2), as text, or "" when there is none.
std::string reuse_conflict(const Schedule& sched) {
  for (size_t s = 1; s < sched.size(); ++s) {
    const std::vector<Owned> before = owned(sched[s - 1]);
    for (const Owned& w : owned(sched[s])) {
      auto it = std::upper_bound(before.begin(), before.end(), w.lo,
                                 [](size_t lo, const Owned& r) { return lo < r.hi; });
      for (; it != before.end() && it->lo < w.hi; ++it)
        if (it->block != w.block) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "slice %zu block %zu writes staging [%zu, %zu) while block %zu of slice %zu "
                        "may still read [%zu, %zu)", s, w.block, w.lo, w.hi, it->block, s - 1, it->lo, it->hi);
          return buf;
        }
    }
  }
  return "";
}

void check_schedule(const Schedule& sched, size_t count, size_t slot, size_t pack, const char* what) {
  std::vector<Range> covered;  // message ranges
  bool in_slot = true, aligned = true;
  for (const auto& slice : sched)
    for (const Part& p : slice)
      for (const Range& r : p.ranges) {
        in_slot = in_slot && r.hi <= slot;
        aligned = aligned && (r.lo == r.hi || (p.off + r.lo) % pack == 0);
        if (r.lo < r.hi) covered.push_back(Range{p.off + r.lo, p.off + r.hi});
      }
  std::sort(covered.begin(), covered.end(), [](const Range& x, const Range& y) { return x.lo < y.lo; });
  size_t next = 0;  // every element exactly once: the sorted ranges tile [0, count)
  bool tiled = true;
  for (const Range& r : covered) {
    tiled = tiled && r.lo == next;
    next = r.hi;
  }
  tiled = tiled && next == count;
  EXPECT(tiled, "%s count=%zu slot=%zu: the parts do not cover the message exactly once", what, count, slot);
  EXPECT(in_slot, "%s count=%zu slot=%zu: a part leaves the staging slot", what, count, slot);
  EXPECT(aligned, "%s count=%zu slot=%zu: a part starts inside a pack", what, count, slot);
  const std::string conflict = reuse_conflict(sched);
  EXPECT(conflict.empty(), "%s count=%zu slot=%zu: %s", what, count, slot, conflict.c_str());
}

}  // namespace

int main() {
  // The H100 case of issue 15, on the schedule of before the fix: rule 2 must fail, here is how.
  // Worked by hand: 256 KiB staging is 65536 floats a slice, so n = 300007 leaves a last slice 4 of
  // 37863 elements; split by its own length among 8 blocks, a block's part is 4736 (not 8192), so
  // block 4 rewrote [18944, 23680) of its staging while a slower peer's block 2 was still reducing
  // [16384, 24576) of slice 3: wrong sums from 196608 + 20480 = 217088, the first wrong index the
  // H100 run reported (benchmarks/results/h100-2026-11-22/README.md).
  const std::string old = reuse_conflict(one_shot(300007, 65536, 8, 4, false));
  EXPECT(!old.empty(), "the pre-fix one-shot schedule shows no conflict: this test cannot see the race");
  std::printf("pre-fix one-shot, 300007 floats, 256 KiB staging, 8 blocks: %s\n", old.c_str());
  // ... and two-shot at 6 ranks, 1,000,003 floats, 1 MiB staging (slot 262144 / 24 packs of 4 x 24).
  EXPECT(!reuse_conflict(two_shot(1000003, 262144 / 24 * 24, 8, 4, 6, false)).empty(),
         "the pre-fix two-shot schedule shows no conflict at 6 ranks");

  const size_t stagings[] = {64u << 10, 256u << 10, 1u << 20};
  const size_t esizes[] = {2, 4, 8};
  const int blocks[] = {1, 2, 3, 5, 8, 13, 32, 64};
  for (size_t staging : stagings)
    for (size_t es : esizes) {
      const size_t pack = 16 / es, slot = staging / es;
      std::vector<size_t> counts = {1, 2, 3, 13, 1031, 65537, 100003, 300007, 1000003};
      for (size_t k = 1; k <= 5; ++k)
        for (long d : {-static_cast<long>(pack) - 1, -1L, 0L, 1L, static_cast<long>(pack) + 1})
          counts.push_back(static_cast<size_t>(static_cast<long>(k * slot) + d));
      for (size_t count : counts)
        for (int nb : blocks) {
          check_schedule(one_shot(count, slot, nb, pack, true), count, slot, pack, "one-shot");
          for (int n = 2; n <= 8; ++n) {
            const size_t slot2 = slot / (n * pack) * (n * pack);
            check_schedule(two_shot(count, slot2, nb, pack, n, true), count, slot2, pack, "two-shot");
          }
        }
    }
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
