// The CPU selector (layer 1): every choice of how a shared-memory collective runs (which algorithm, staged
// or direct, how its copies store) is made here, from the call's arguments and from facts every rank holds
// alike, and every threshold it compares a byte count against sits in one table, kCpuThresholds.
//
// [Note: the CPU selector]
// The algorithms (shm_collectives.cpp, allreduce_*.cpp, shm_window.cpp, shm_single_copy.cpp,
// shm_alltoall.cpp) run the plan they are handed; none of them compares a size against a threshold to
// choose (tests/house/test_structure.py checks it). A plan depends only on the op's arguments (the same on
// every rank), on the placement probe's verdict and the single-copy vote (read alike by every rank), and on
// this rank's own settings where they change no protocol (set_stage_streaming): so every rank of a call
// takes the same path, which the slot protocol needs (a rank staging while a peer reads directly would
// hang or corrupt). Adding a CPU all-reduce algorithm: one new file and one line in
// RINGZERO_CPU_ALL_REDUCE_ALGOS (types.h); docs/design.md shows it. The CUDA side's thresholds are
// cuda::PeerConfig's (csrc/cuda/peer_types.h); Python's between hosts are transports.py's.
#pragma once
#include <cstddef>
#include <cstdint>

#include "types.h"

namespace ringzero {

// Every threshold of the CPU plans, with the measurement that set it (benchmarks/RESULTS.md, by section).
struct CpuThresholds {
  size_t one_shot_max_bytes;
  size_t registered_min_bytes;
  size_t single_copy_min_bytes;
  size_t single_copy_end_bytes;
  size_t registered_stream_bytes;
  size_t stage_stream_min_bytes;
  uint64_t stage_reprobe_calls;
  uint64_t stage_reprobe_bytes;
  size_t a2a_stream_own_bytes;
};

inline constexpr CpuThresholds kCpuThresholds = {
    // one_shot_max_bytes: the all-reduce's one-shot up to here (and within one slot), the two-shot above:
    // one synchronisation against the two-shot's 1/n share of the reduction ("CPU collectives: ringzero
    // against gloo (issue 2)"; `ringzero bench` under each RINGZERO_ALLREDUCE_ALGO repeats it).
    64 << 10,
    // registered_min_bytes: a tensor from ringzero.empty is read from the peers' regions from here on;
    // below, one staged slice's single synchronisation beats the direct path's two or three ("Registered
    // tensors (issue 47)": 14.0 against 17.8 us at 64 KiB in place).
    64 << 10,
    // single_copy_min_bytes: an all-gather block (an all-to-all's largest block) read from the peers'
    // inputs with process_vm_readv from here on; below, one staged slice is as fast with one
    // synchronisation ("Single copy and run-to-run spread (issue 47)").
    64 << 10,
    // single_copy_end_bytes: from here on a block is read directly only when every rank's input lies on
    // huge pages, and two ranks' staged all-gather writes its output with streaming stores and probes the
    // placement ("The slow mode was the host's placement (issue 47)", the all-gather's boundary at 8 MiB;
    // "Huge pages: the single copy past 8 MiB per rank (issue 47)").
    8 << 20,
    // registered_stream_bytes: a registered all-gather's block, or a registered reduce-scatter's output,
    // of this much is written with streaming stores: the output is past the last-level cache ("Registered
    // tensors (issue 47)").
    16 << 20,
    // stage_stream_min_bytes: two ranks' staged all-reduce, reduce-scatter and all-gather (the whole
    // buffer) stage with streaming stores from here on while the probe says two last-level caches ("The
    // slow mode was the host's placement (issue 47)").
    64 << 10,
    // stage_reprobe_calls, stage_reprobe_bytes: such calls probe the placement again after this many calls
    // or bytes since the last probe; the host moves the vCPUs within seconds (same section).
    32,
    64 << 20,
    // a2a_stream_own_bytes: an all-to-all's own block of this much is copied with streaming stores ("All-to-all,
    // gather and scatter ours, and expert parallelism (issue 69)": the own block streamed from 4 MiB).
    4 << 20,
};

// How a copy stores: through the cache, or with non-temporal stores past it (copy_streaming).
enum class CopyMode : int32_t { Cached = 0, Streaming = 1 };

// Where a call's bytes go: through the staging slots, straight from the peers' registered regions, or
// read from the peers' inputs with process_vm_readv (single copy; it may still fall back to staged).
enum class CpuPath : int32_t { Staged = 0, Registered = 1, SingleCopy = 2 };

// The collectives whose plan the selector makes.
enum class CpuOp : int32_t { AllReduce = 0, ReduceScatter = 1, AllGather = 2 };

// The single-copy vote so far, the same on every rank (ShmComm::single_copy()).
enum class SingleCopyVote : int32_t { Untested = 0, On = 1, Off = 2 };

// The facts of a call the plan is made from.
struct CpuCall {
  CpuOp op;
  // All-reduce: the tensor; reduce-scatter: the whole input (nranks blocks); all-gather: one rank's block.
  size_t bytes;
  int nranks;
  size_t slot_bytes;
  bool in_place = false;          // in == out (the registered all-reduce needs it)
  bool registered = false;        // the input lies in a window of this communicator (window_wanted said look)
  AllReduceAlgo requested = AllReduceAlgo::Auto;
  int stage_stream_mode = 2;      // ShmComm::set_stage_streaming
  bool other_cache = false;       // the last placement verdict: the peer on another last-level cache
  SingleCopyVote single_copy = SingleCopyVote::Untested;
};

struct CpuPlan {
  CpuPath path = CpuPath::Staged;
  AllReduceAlgo algo = AllReduceAlgo::Auto;  // all-reduce: the schedule (staged); Auto elsewhere
  CopyMode stage = CopyMode::Cached;          // how the staged path fills the slots (before any re-probe)
  CopyMode out = CopyMode::Cached;            // how the output is written (staged all-gather, registered)
  bool probe_first_slice = false;             // staged all-gather: probe the placement at its first slice
  bool reprobe = false;                       // the staged path may re-probe the placement (reprobe_due)
  bool huge_pages_only = false;               // single copy: read directly only if every input is on huge pages
};

// The schedule Auto picks for an all-reduce of `bytes` with slots of `slot_bytes`.
AllReduceAlgo choose_all_reduce(size_t bytes, size_t slot_bytes);
// Whether a call should look for its input in a registered window (a lookup that may raise for another
// group's window): the plan takes the registered path exactly when this holds and a window is found.
bool window_wanted(const CpuCall& call);
// The call's plan.
CpuPlan select_plan(const CpuCall& call);

// Whether a call of `bytes` (as CpuCall::bytes counts the staged buffer) stages with streaming stores
// at its start, and whether it takes part in the placement's re-probing at all.
CopyMode stage_copy(int nranks, size_t bytes, int stage_stream_mode, bool other_cache);
bool stage_probe_applies(int nranks, size_t bytes);
// Whether such a call probes again: the first one, or after kCpuThresholds' calls or bytes since the last.
bool reprobe_due(bool probed_before, uint64_t calls_since, uint64_t bytes_since);

// The all-to-all's choices, made in two steps: before its first slice (from this rank's own counts) and
// after it (from the whole count matrix, the same on every rank).
// Whether the first slice stages each block's first piece: not when single copy is on for good and this
// rank holds a block (`own_largest_bytes`, more than one slot piece) that only single copy moves.
bool a2a_stage_first(SingleCopyVote vote, bool own_largest_spans_slices, size_t own_largest_bytes);
// Whether the blocks past the first piece are read from the peers directly (the vote may still refuse).
bool a2a_single_copy(SingleCopyVote vote, size_t slices, size_t largest_bytes);
CopyMode a2a_own_copy(size_t own_bytes);

}  // namespace ringzero
