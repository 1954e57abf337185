// A read-only memory mapping of a whole file. Move-only RAII owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dsv4 {

// Opens `path` read-only without blocking (a FIFO or device never stalls the caller) and returns
// its descriptor (close-on-exec, blocking mode restored), or NotFound / PermissionDenied /
// InvalidArgument ("is a directory", "is not a regular file") naming the path.
absl::StatusOr<int> OpenRegularFile(const std::string& path);

class MappedFile {
 public:
  // Maps `path` read-only. Empty files map to an empty span (data() may be null).
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace dsv4
