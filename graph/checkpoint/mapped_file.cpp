#include "graph/checkpoint/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ag::models {

namespace {
error os_error(const std::string& path, const char* what, int err) {
  return error{errc::invalid_argument, path + ": " + what + ": " + std::strerror(err)};
}
}  // namespace

expected<std::shared_ptr<const mapped_file>> mapped_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return os_error(path, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return error{errc::invalid_argument, path + ": not a regular file"};
  }
  std::shared_ptr<mapped_file> f(new mapped_file());
  f->path_ = path;
  f->size_ = static_cast<std::size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return os_error(path, "cannot map", err);
    }
    f->data_ = static_cast<const std::byte*>(p);
    f->mapped_ = true;
  }
  ::close(fd);  // the mapping keeps the file
  return std::shared_ptr<const mapped_file>(std::move(f));
}

std::shared_ptr<const mapped_file> mapped_file::from_bytes(std::vector<std::byte> bytes, std::string origin) {
  std::shared_ptr<mapped_file> f(new mapped_file());
  f->owned_ = std::move(bytes);
  f->data_ = f->owned_.empty() ? nullptr : f->owned_.data();
  f->size_ = f->owned_.size();
  f->path_ = std::move(origin);
  return f;
}

mapped_file::~mapped_file() {
  if (mapped_) ::munmap(const_cast<std::byte*>(data_), size_);
}

void mapped_file::prefetch(std::size_t offset, std::size_t bytes) const noexcept {
  if (!mapped_ || offset >= size_ || bytes == 0) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t start = offset / page * page;
  const std::size_t end = std::min(size_, offset + bytes);
  // WILLNEED starts read-ahead of a file not yet in the page cache. (Faulting
  // the range in first with MADV_POPULATE_READ measured slower than the
  // copy's own faults, which the kernel already maps 16 pages at a time.)
  ::madvise(const_cast<std::byte*>(data_) + start, end - start, MADV_WILLNEED);
}

}  // namespace ag::models
