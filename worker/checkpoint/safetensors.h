// Safetensors checkpoints: single files and sharded directories (model.safetensors.index.json),
// memory-mapped read-only. Every header is validated before any tensor is touched: JSON shape,
// dtypes, shape x element size == byte range, ranges in bounds and non-overlapping. Corrupt or
// truncated files give InvalidArgument, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/mapped_file.h"

namespace dsv4 {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;   // byte offset into the file's data section
  uint64_t nbytes = 0;
  int file = 0;         // index into Checkpoint::files()

  int64_t numel() const;
};

// Parses and validates a safetensors file image (header and data bounds). `size` is the whole
// file size; the returned offsets are relative to the data section, which starts at
// *data_start. Pure function of its input: the fuzz target drives it directly.
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                               uint64_t* data_start);

// A read-only view of one tensor's bytes inside a mapped file.
struct TensorBytes {
  const TensorInfo* info = nullptr;
  const uint8_t* data = nullptr;  // not necessarily aligned: read with memcpy
};

// Owns the mapped files of one checkpoint. Thread-safe for concurrent reads after Open().
class Checkpoint {
 public:
  // `path` is a .safetensors file, or a directory holding model.safetensors or
  // model.safetensors.index.json (+ shards).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* Find(std::string_view name) const;
  TensorBytes Bytes(const TensorInfo& info) const;
  const std::string& path() const { return path_; }

 private:
  Checkpoint() = default;
  absl::Status AddFile(const std::string& file_path);

  std::string path_;
  std::vector<MappedFile> files_;
  std::vector<uint64_t> data_start_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
};

}  // namespace dsv4
