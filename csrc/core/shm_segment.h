// One POSIX shared-memory segment: created by one rank, opened by the others through its name, and
// unlinked as soon as every rank has it mapped, so that a killed process leaks nothing in /dev/shm.
#pragma once
#include <cstddef>
#include <string>

namespace ringzero {

class ShmSegment {
 public:
  // Creates a new segment of `bytes` with a unique name (see name()). Space is reserved up front
  // (posix_fallocate), so a full /dev/shm is an error here, never a SIGBUS later.
  static ShmSegment create(size_t bytes);
  // Maps an existing segment; `bytes` must match the creator's.
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name; the memory lives until the last mapping goes. Safe to call more than once.
  void unlink();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;
};

}  // namespace ringzero
