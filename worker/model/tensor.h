// Tensor: a non-owning view {data, dtype, shape} of contiguous row-major memory that belongs to a
// Backend (host memory for the CPU backend, device memory for CUDA). Model code passes Tensors
// between backend ops and never dereferences `data` itself, so the same model code drives every
// backend.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "kernels/quant_weights.h"

namespace dsv4 {

constexpr int kMaxTensorRank = 4;

struct Shape {
  std::array<int64_t, kMaxTensorRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    for (int64_t v : d) dims[rank++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i) {
      if (dims[i] != o.dims[i]) return false;
    }
    return true;
  }
  std::string ToString() const {
    return "[" + absl::StrJoin(dims.begin(), dims.begin() + rank, ", ") + "]";
  }
};

// A quantised weight's scales and layout (kernels/quant_weights.h; dtype kF8E4M3 for kFp8Block,
// kI8 for kMxfp4).
struct QuantInfo {
  QuantFormat format = QuantFormat::kNone;
  void* scale = nullptr;      // kFp8Block: fp32 grid; kMxfp4: UE8M0 [rows, cols / 32]
  int32_t block_rows = 0, block_cols = 0;
  int64_t part_rows = 0;      // kFp8Block: rows of one stacked part (its grid restarts)
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;  // the logical shape (a quantised matrix [..., rows, cols] holds rows x cols values)
  QuantInfo quant;

  bool empty() const { return data == nullptr; }
  bool quantized() const { return quant.format != QuantFormat::kNone; }
  int64_t numel() const { return shape.numel(); }
  int64_t dim(int i) const { return shape[i]; }
  size_t nbytes() const {
    return quant.format == QuantFormat::kMxfp4 ? static_cast<size_t>(numel()) / 2
                                               : static_cast<size_t>(numel()) * DTypeSize(dtype);
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Same memory, another shape with the same element count.
  Tensor View(Shape s) const {
    Tensor t = *this;
    t.shape = s;
    return t;
  }
  // Rows [begin, begin+count) along dim 0.
  Tensor Rows(int64_t begin, int64_t count) const {
    Tensor t = *this;
    const int64_t row = shape.rank > 0 && shape[0] > 0 ? numel() / shape[0] : 0;
    t.data = static_cast<char*>(data) + begin * row * DTypeSize(dtype);
    t.shape.dims[0] = count;
    return t;
  }
};

// Host memory handed to a backend when weights are created: fp32 or int32 values.
struct HostTensor {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<float> f32;
  std::vector<int32_t> i32;
  const void* data() const {
    return dtype == DType::kI32 ? static_cast<const void*>(i32.data())
                                : static_cast<const void*>(f32.data());
  }
};

}  // namespace dsv4
