// Single copy between a host's ranks (layer 1): [Note: single copy between a host's ranks] in
// shm_single_copy.cpp.
#pragma once
#include <cstddef>

namespace ringzero {

// The blocks (bytes per rank) that an all-gather reads straight from its peers are the selector's
// (select.h): from single_copy_min_bytes up to, not including, single_copy_end_bytes, where two ranks'
// staged all-gather takes over with streaming stores for its output, unless every rank's input lies on huge
// pages (the Note says why each).

// Whether [p, p + bytes) of this process lies on huge pages (transparent or hugetlb), all but at most a
// third of it (its ragged ends): asked of the kernel's page tables (PAGEMAP_SCAN on /proc/self/pagemap, Linux 6.7+);
// false where the kernel cannot say.
bool on_huge_pages(const void* p, size_t bytes);

}  // namespace ringzero
