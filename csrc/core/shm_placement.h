// Where the host runs the ranks' cores, and the copies that depend on it (internal to csrc/core/shm_*.cpp);
// the Note and the probe (ShmComm::peer_on_other_cache) are in shm_placement.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ringzero {

// Which copies stream, and when the placement is probed again, is the selector's (select.h:
// registered_stream_bytes, single_copy_end_bytes, stage_stream_min_bytes, stage_reprobe_calls and
// stage_reprobe_bytes in kCpuThresholds; [Note: where the host runs the ranks' cores]).

// Copies with non-temporal stores where the CPU has them (x86-64: SSE2), then fences them: the lines go
// to memory, not into this core's cache.
void copy_streaming(void* dst, const void* src, size_t bytes);
// A plain memcpy, with the same signature so a collective picks one of the two once.
void copy_cached(void* dst, const void* src, size_t bytes);

}  // namespace ringzero
