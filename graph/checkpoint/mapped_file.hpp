#pragma once
/// \file mapped_file.hpp
/// A whole file mapped read-only into memory (POSIX mmap, no copy): the pages
/// are the kernel's page cache, read on first touch. Checkpoint tensors are
/// views into such a mapping, so loading a model never holds a second copy of
/// it on the host.
///
/// Thread-safety: immutable once made; any thread may read data() while a
/// shared_ptr to it lives. The mapping is removed when the last one goes.
/// Another process truncating the file while it is mapped makes reads past
/// the new end fault (SIGBUS): that is the OS's contract for mmap, and why
/// checkpoints are opened read-only and never written in place.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/error.hpp"

namespace ag::models {

class mapped_file {
 public:
  /// Maps `path` read-only. Errors (invalid_argument, naming the path): the
  /// file cannot be opened or stat'ed, is not a regular file, or the mapping
  /// fails. An empty file maps to size() 0 and data() null.
  static expected<std::shared_ptr<const mapped_file>> open(const std::string& path);
  /// Bytes held in memory instead of a file (parsers' fuzz targets and tests):
  /// path() is `origin`.
  static std::shared_ptr<const mapped_file> from_bytes(std::vector<std::byte> bytes, std::string origin);

  ~mapped_file();
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }
  /// Hints the kernel to read [offset, offset + bytes) ahead (madvise
  /// WILLNEED); a no-op for in-memory bytes or out-of-range requests. Errors
  /// are ignored: it is only a hint.
  void prefetch(std::size_t offset, std::size_t bytes) const noexcept;

 private:
  mapped_file() = default;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;          // munmap on destruction
  std::vector<std::byte> owned_; // from_bytes
  std::string path_;
};

}  // namespace ag::models
