#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "errors.h"

namespace ringzero {
namespace {

std::string errno_text(const std::string& what, int err) { return what + ": " + std::strerror(err); }

void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw CommError(errno_text("mmap of shared-memory segment " + name, errno));
  return p;
}

}  // namespace

ShmSegment ShmSegment::create(size_t bytes) {
  std::random_device rd;
  const unsigned long long tag = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
  char buf[96];
  std::snprintf(buf, sizeof(buf), "/ringzero-%d-%016llx", static_cast<int>(getpid()), tag);
  ShmSegment seg;
  seg.name_ = buf;
  int fd = shm_open(seg.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw CommError(errno_text("shm_open(" + seg.name_ + ")", errno));
  seg.linked_ = true;
  int err = 0;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) err = errno;
  if (!err) err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err) {
    close(fd);
    shm_unlink(seg.name_.c_str());
    throw CommError(errno_text("reserving " + std::to_string(bytes) + " bytes in /dev/shm for " + seg.name_ +
                                   " (lower RINGZERO_SHM_BUFFER_BYTES or enlarge /dev/shm)",
                               err));
  }
  try {
    seg.data_ = map_fd(fd, bytes, seg.name_);
  } catch (...) {
    close(fd);
    shm_unlink(seg.name_.c_str());
    throw;
  }
  close(fd);
  seg.bytes_ = bytes;
  return seg;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  ShmSegment seg;
  seg.name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw CommError(errno_text("shm_open(" + name + ") of a peer's segment", errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    throw CommError("shared-memory segment " + name + " has the wrong size: ranks disagree on "
                    "RINGZERO_SHM_BUFFER_BYTES or the world size");
  }
  seg.data_ = map_fd(fd, bytes, name);
  close(fd);
  seg.bytes_ = bytes;
  return seg;
}

ShmSegment ShmSegment::create_or_open(const std::string& name, size_t bytes, const SegmentTag& tag,
                                      const char* what) {
  if (name.empty()) {
    ShmSegment seg = create(bytes);
    std::memcpy(seg.data(), &tag, sizeof(tag));
    return seg;
  }
  ShmSegment seg = open(name, bytes);
  SegmentTag found;
  std::memcpy(&found, seg.data(), sizeof(found));
  if (found.magic != tag.magic || found.nranks != tag.nranks || found.slot_bytes != tag.slot_bytes)
    throw CommError("shared-memory segment " + name + " was made for another " + what +
                    " (world size or RINGZERO_SHM_BUFFER_BYTES differ between ranks)");
  return seg;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_) munmap(data_, bytes_);
  data_ = nullptr;
}

void ShmSegment::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace ringzero
