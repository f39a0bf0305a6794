// The CPU selector (csrc/core/select.h) against the choices the algorithms made for themselves before it
// existed, transcribed below with their literal numbers: the same plan for every call at and around each
// threshold, for 1, 2, 3, 4 and 8 ranks, every requested algorithm, placement, vote and memory kind. A
// change of a threshold or a rule fails here until this reference is changed with it, on purpose.
#include <cstdio>
#include <vector>

#include "core/select.h"
#include "test_util.h"

namespace ringzero {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// ---- the choices as the algorithms made them (shm_collectives.cpp, shm_window.cpp, shm_single_copy.cpp,
// shm_alltoall.cpp), thresholds written as numbers ----
AllReduceAlgo ref_choose(size_t bytes, size_t slot) {
  return bytes <= 64 * KiB && bytes <= slot ? AllReduceAlgo::OneShot : AllReduceAlgo::TwoShot;
}
bool ref_stage_streaming(int n, size_t bytes, int mode, bool other) {
  return n == 2 && bytes >= 64 * KiB && (mode == 1 || (mode == 2 && other));
}
bool ref_registered_gate(int n, size_t bytes) { return n != 1 && bytes >= 64 * KiB; }  // registered()'s own test

CpuPlan ref_plan(const CpuCall& c) {
  CpuPlan p;
  const int n = c.nranks;
  const auto mode = [](bool s) { return s ? CopyMode::Streaming : CopyMode::Cached; };
  switch (c.op) {
    case CpuOp::AllReduce: {
      if (c.in_place && c.requested == AllReduceAlgo::Auto && ref_choose(c.bytes, c.slot_bytes) == AllReduceAlgo::TwoShot &&
          ref_registered_gate(n, c.bytes) && c.registered) {
        p.path = CpuPath::Registered;
        return p;
      }
      p.algo = c.requested == AllReduceAlgo::Auto ? ref_choose(c.bytes, c.slot_bytes) : c.requested;
      const bool ring = p.algo == AllReduceAlgo::Ring;
      p.stage = mode(!ring && ref_stage_streaming(n, c.bytes, c.stage_stream_mode, c.other_cache));
      p.reprobe = !ring;
      return p;
    }
    case CpuOp::ReduceScatter: {
      if (ref_registered_gate(n, c.bytes) && c.registered) {
        p.path = CpuPath::Registered;
        p.out = mode(c.bytes / n >= 16 * MiB);
        return p;
      }
      p.stage = mode(ref_stage_streaming(n, c.bytes, c.stage_stream_mode, c.other_cache));
      p.reprobe = true;
      return p;
    }
    case CpuOp::AllGather: {
      if (ref_registered_gate(n, c.bytes) && c.registered) {
        p.path = CpuPath::Registered;
        p.out = mode(c.bytes >= 16 * MiB);
        return p;
      }
      if (n > 1 && c.single_copy != SingleCopyVote::Off && c.bytes >= 64 * KiB) {
        p.path = CpuPath::SingleCopy;
        p.huge_pages_only = c.bytes >= 8 * MiB;
      }
      const bool big = n == 2 && c.bytes >= 8 * MiB;
      p.out = mode(big);
      p.stage = mode(!big && ref_stage_streaming(n, n * c.bytes, c.stage_stream_mode, c.other_cache));
      p.probe_first_slice = big;
      p.reprobe = !big;
      return p;
    }
  }
  return p;
}

bool same(const CpuPlan& a, const CpuPlan& b) {
  return a.path == b.path && a.algo == b.algo && a.stage == b.stage && a.out == b.out &&
         a.probe_first_slice == b.probe_first_slice && a.reprobe == b.reprobe && a.huge_pages_only == b.huge_pages_only;
}

// Sizes at and around every threshold (and the slots'), per rank block or whole buffer as the op counts.
std::vector<size_t> boundary_sizes() {
  std::vector<size_t> out;
  for (size_t t : {size_t(0), 1 * KiB, 64 * KiB, 256 * KiB, 4 * MiB, 8 * MiB, 16 * MiB, 64 * MiB})
    for (long d : {-65, -1, 0, 1, 64})
      if (static_cast<long>(t) + d >= 0) out.push_back(static_cast<size_t>(static_cast<long>(t) + d));
  return out;
}

void test_plans() {
  int cases = 0;
  for (int n : {1, 2, 3, 4, 8})
    for (size_t slot : {1 * KiB, 64 * KiB - 1, 64 * KiB, 256 * KiB})
      for (size_t unit : boundary_sizes())
        for (CpuOp op : {CpuOp::AllReduce, CpuOp::ReduceScatter, CpuOp::AllGather})
          for (int req = 0; req < kNumAllReduceAlgos; ++req)
            for (int mode : {0, 1, 2})
              for (int flags = 0; flags < 8; ++flags)
                for (SingleCopyVote vote : {SingleCopyVote::Untested, SingleCopyVote::On, SingleCopyVote::Off}) {
                  if (op != CpuOp::AllReduce && req != 0) continue;
                  // The reduce-scatter counts its whole input: n blocks, so the block sits at the boundary too.
                  const size_t bytes = op == CpuOp::ReduceScatter ? unit * n : unit;
                  CpuCall c{op, bytes, n, slot};
                  c.requested = static_cast<AllReduceAlgo>(req);
                  c.stage_stream_mode = mode;
                  c.in_place = flags & 1;
                  c.registered = flags & 2;
                  c.other_cache = flags & 4;
                  c.single_copy = vote;
                  const CpuPlan got = select_plan(c), want = ref_plan(c);
                  CHECK(same(got, want), "op %d, %zu bytes, %d ranks, slot %zu, algo %d, mode %d, flags %d, vote %d",
                        static_cast<int>(op), bytes, n, slot, req, mode, flags, static_cast<int>(vote));
                  // The window is looked up (and may raise for another group's) exactly where it was.
                  const bool gate = ref_registered_gate(n, bytes) &&
                                    (op != CpuOp::AllReduce ||
                                     (c.in_place && req == 0 && ref_choose(bytes, slot) == AllReduceAlgo::TwoShot));
                  CHECK(window_wanted(c) == gate, "window_wanted: op %d, %zu bytes, %d ranks", static_cast<int>(op), bytes, n);
                  ++cases;
                }
  std::printf("select: %d plans as before\n", cases);
}

// A few plans spelled out: what a reader checks first.
void test_pinned() {
  CpuCall c{CpuOp::AllReduce, 64 * KiB, 2, 256 * KiB};
  CHECK(select_plan(c).algo == AllReduceAlgo::OneShot, "64 KiB all-reduce: one-shot");
  c.bytes = 64 * KiB + 1;
  CHECK(select_plan(c).algo == AllReduceAlgo::TwoShot, "64 KiB + 1 all-reduce: two-shot");
  c.in_place = c.registered = true;
  CHECK(select_plan(c).path == CpuPath::Registered, "64 KiB + 1 in place, registered: direct");
  c.bytes = 64 * KiB;
  CHECK(select_plan(c).path == CpuPath::Staged, "64 KiB in place, registered: staged one-shot");
  CpuCall g{CpuOp::AllGather, 8 * MiB - 1, 2, 256 * KiB};
  CHECK(select_plan(g).path == CpuPath::SingleCopy && !select_plan(g).huge_pages_only, "8 MiB - 1: single copy");
  g.bytes = 8 * MiB;
  CHECK(select_plan(g).huge_pages_only && select_plan(g).out == CopyMode::Streaming, "8 MiB: huge pages only, streamed");
  g.nranks = 3;
  CHECK(select_plan(g).out == CopyMode::Cached, "8 MiB, 3 ranks: output through the cache");
}

void test_reprobe_and_all_to_all() {
  for (int n : {1, 2, 3, 4, 8})
    for (size_t b : boundary_sizes())
      CHECK(stage_probe_applies(n, b) == (n == 2 && b >= 64 * KiB), "stage_probe_applies(%d, %zu)", n, b);
  for (bool probed : {false, true})
    for (uint64_t calls : {0, 31, 32, 33})
      for (uint64_t bytes : {uint64_t(0), 64 * MiB - 1, 64 * MiB})
        CHECK(reprobe_due(probed, calls, bytes) == (!probed || calls >= 32 || bytes >= 64 * MiB), "reprobe_due");
  for (SingleCopyVote v : {SingleCopyVote::Untested, SingleCopyVote::On, SingleCopyVote::Off})
    for (size_t b : boundary_sizes()) {
      for (bool spans : {false, true})
        CHECK(a2a_stage_first(v, spans, b) == !(v == SingleCopyVote::On && spans && b >= 64 * KiB), "a2a_stage_first");
      for (size_t slices : {size_t(1), size_t(2), size_t(9)})
        CHECK(a2a_single_copy(v, slices, b) == (slices > 1 && b >= 64 * KiB && v != SingleCopyVote::Off),
              "a2a_single_copy");
      CHECK((a2a_own_copy(b) == CopyMode::Streaming) == (b >= 4 * MiB), "a2a_own_copy(%zu)", b);
    }
}

}  // namespace
}  // namespace ringzero

int main() {
  ringzero::test_plans();
  ringzero::test_pinned();
  ringzero::test_reprobe_and_all_to_all();
  if (ringzero::g_failures) {
    std::printf("%d failures\n", ringzero::g_failures);
    return 1;
  }
  std::printf("all select tests passed\n");
  return 0;
}
