// Single copy between a host's ranks (layer 1): [Note: single copy between a host's ranks] in
// shm_single_copy.cpp.
#pragma once
#include <cstddef>

namespace ringzero {

// The blocks (bytes per rank) that an all-gather reads straight from its peers: from kSingleCopyMinBytes
// up to, not including, kSingleCopyEndBytes, where two ranks' staged all-gather takes over with streaming
// stores for its output (the Note says why both).
constexpr size_t kSingleCopyMinBytes = 64 << 10;
constexpr size_t kSingleCopyEndBytes = 8 << 20;

}  // namespace ringzero
