// One POSIX shared-memory segment: created by one rank, opened by the others through its name, and
// unlinked as soon as every rank has it mapped, so that a killed process leaks nothing in /dev/shm.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringzero {

// The first bytes of every ringzero segment: what it was made for, checked by every opener.
struct SegmentTag {
  uint64_t magic;
  int32_t nranks;
  int32_t reserved;
  uint64_t slot_bytes;
};

class ShmSegment {
 public:
  // create() (empty name: writes `tag` at the start) or open() (checks the tag there, so ranks that
  // disagree on the world size or buffer size fail with a message naming `what`).
  static ShmSegment create_or_open(const std::string& name, size_t bytes, const SegmentTag& tag, const char* what);
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
