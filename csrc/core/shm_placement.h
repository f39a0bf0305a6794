// Where the host runs the ranks' cores, and the copies that depend on it (internal to csrc/core/shm_*.cpp);
// the Note and the probe (ShmComm::peer_on_other_cache) are in shm_placement.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ringzero {

// Per rank: a registered two-rank all-gather of this much and more writes its output with streaming
// stores, and a registered reduce-scatter's output of this much is reduced in pieces and streamed out
// (shm_window.cpp). The staged all-gather streams its output, and probes the placement, from
// kSingleCopyEndBytes (shm_single_copy.h; [Note: where the host runs the ranks' cores]).
constexpr size_t kStreamGatherBytes = 16 << 20;

// Two ranks, a staged all-reduce, reduce-scatter or all-gather of this much and more (the whole buffer):
// on two last-level caches each rank stages its slices with streaming stores; the placement is probed
// again at such a call once kStageReprobeCalls of them or kStageReprobeBytes have run since the last
// probe ([Note: where the host runs the ranks' cores]).
constexpr size_t kStageStreamMinBytes = 64 << 10;
constexpr uint64_t kStageReprobeCalls = 32;
constexpr uint64_t kStageReprobeBytes = 64 << 20;

// Copies with non-temporal stores where the CPU has them (x86-64: SSE2), then fences them: the lines go
// to memory, not into this core's cache.
void copy_streaming(void* dst, const void* src, size_t bytes);
// A plain memcpy, with the same signature so a collective picks one of the two once.
void copy_cached(void* dst, const void* src, size_t bytes);

}  // namespace ringzero
