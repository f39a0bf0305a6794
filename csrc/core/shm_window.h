// Registered memory between a host's ranks (layer 1): [Note: registered tensors] in shm_window.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "shm_segment.h"

namespace ringzero {

// From how many bytes a collective takes a registered tensor straight from the window is the selector's
// (select.h: registered_min_bytes, window_wanted).

// One allocation of ringzero.empty: one shared-memory segment holding a region per local rank of a
// communicator, mapped by every one of them. Lives while any of this process's tensors on it does.
class ShmWindow {
 public:
  // Made by ShmComm::create_window only, which registers it.
  ShmWindow(ShmSegment seg, int rank, std::vector<int32_t> pids, size_t region_bytes, size_t stride, uint64_t id);
  ~ShmWindow();
  ShmWindow(const ShmWindow&) = delete;
  ShmWindow& operator=(const ShmWindow&) = delete;

  // Local rank q's region, at this process's address of the mapping.
  char* region(int q) const { return static_cast<char*>(seg_.data()) + static_cast<size_t>(q) * stride_; }
  size_t region_bytes() const { return region_bytes_; }
  int rank() const { return rank_; }
  int nranks() const { return static_cast<int>(pids_.size()); }
  // 1, 2, ... in creation order on the communicator that made it: the same on every local rank.
  uint64_t id() const { return id_; }
  // The processes of its local ranks, in rank order: a communicator may use the window iff its own
  // ranks are these processes in this order (whichever door made it: ringzero.* or the c10d backend).
  const std::vector<int32_t>& pids() const { return pids_; }

  // The live window of this process whose own region holds [p, p + bytes), or nullptr. Cheap when no
  // window is alive (one atomic load), else a short scan under a lock.
  static std::shared_ptr<ShmWindow> find(const void* p, size_t bytes);
  static void add(const std::shared_ptr<ShmWindow>& w);

 private:
  ShmSegment seg_;
  int rank_;
  std::vector<int32_t> pids_;
  size_t region_bytes_;
  size_t stride_;
  uint64_t id_;
};

}  // namespace ringzero
