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

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  int64_t dim(int i) const { return shape[i]; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
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
