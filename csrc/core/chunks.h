// Chunk arithmetic shared by the shared-memory, ring and CUDA schedules: how `count` elements split into
// `parts` chunks, and how a long buffer streams through a bounded staging slot in slices.
#pragma once
#include <algorithm>
#include <cstddef>

namespace ringzero {

// Chunk boundaries are rounded to whole cache lines (64 B) so that two ranks never write the same line
// and the vector loops start aligned. The last chunks may be short or empty.
constexpr size_t kChunkAlignBytes = 64;

struct Range {
  size_t offset;
  size_t count;
};

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

inline size_t round_up(size_t a, size_t m) { return ceil_div(a, m) * m; }

// Chunk `index` of `parts` over `count` elements of `elem_bytes` each.
inline Range chunk_range(size_t count, int parts, int index, size_t elem_bytes) {
  const size_t align = std::max<size_t>(1, kChunkAlignBytes / elem_bytes);
  const size_t chunk = round_up(ceil_div(count, static_cast<size_t>(parts)), align);
  const size_t off = std::min(count, chunk * static_cast<size_t>(index));
  return {off, std::min(chunk, count - off)};
}

// Number of slices needed to stream `count` elements through a slot of `slot_elems`: at least one, so
// that a zero-length collective still synchronises (and checks fingerprints) like any other.
inline size_t num_slices(size_t count, size_t slot_elems) {
  return std::max<size_t>(1, ceil_div(count, slot_elems));
}

inline Range slice_range(size_t count, size_t slot_elems, size_t slice) {
  const size_t off = std::min(count, slice * slot_elems);
  return {off, std::min(slot_elems, count - off)};
}

}  // namespace ringzero
