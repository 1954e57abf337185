#include "worker/checkpoint/weight_slice.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4 {
namespace {

// Copies the [outer, size, inner] sub-block at `begin` of an [outer, full, inner] array of
// `elem`-byte elements.
template <typename T>
std::vector<T> CopyRange(const std::vector<T>& src, int64_t outer, int64_t full, int64_t inner,
                         int64_t begin, int64_t size) {
  std::vector<T> out(static_cast<size_t>(outer * size * inner));
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + o * size * inner, src.data() + (o * full + begin) * inner,
                static_cast<size_t>(size * inner) * sizeof(T));
  }
  return out;
}

struct Split {
  int64_t outer = 1, full = 0, inner = 1;
};
Split SplitAt(const Shape& s, int dim) {
  Split p;
  for (int i = 0; i < dim; ++i) p.outer *= s[i];
  p.full = s[dim];
  for (int i = dim + 1; i < s.rank; ++i) p.inner *= s[i];
  return p;
}

}  // namespace

bool OnBlocks(int64_t begin, int64_t size, int64_t extent, int64_t block) {
  return block > 0 && begin % block == 0 && (size % block == 0 || begin + size == extent);
}

absl::StatusOr<Shape> SlicedShape(Shape shape, const WeightSlice& slice, const std::string& name) {
  if (slice.whole()) return shape;
  if (slice.dim >= shape.rank || slice.begin < 0 || slice.size < 1 ||
      slice.begin + slice.size > shape[slice.dim]) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": slice [", slice.begin, ", ", slice.begin + slice.size, ") of dim ", slice.dim,
        " is outside its shape ", shape.ToString()));
  }
  shape.dims[slice.dim] = slice.size;
  return shape;
}

absl::StatusOr<HostTensor> SliceHost(const HostTensor& t, const WeightSlice& slice,
                                     const std::string& name) {
  ASSIGN_OR_RETURN(Shape shape, SlicedShape(t.shape, slice, name));
  if (slice.whole()) return t;
  const Split p = SplitAt(t.shape, slice.dim);
  HostTensor out{t.dtype, shape, {}, {}};
  if (t.dtype == DType::kI32) {
    out.i32 = CopyRange(t.i32, p.outer, p.full, p.inner, slice.begin, slice.size);
  } else {
    out.f32 = CopyRange(t.f32, p.outer, p.full, p.inner, slice.begin, slice.size);
  }
  return out;
}

absl::StatusOr<StoredWeight> SliceStored(StoredWeight w, const WeightSlice& slice) {
  ASSIGN_OR_RETURN(Shape shape, SlicedShape(w.shape, slice, w.name));
  if (slice.whole()) return w;
  if (w.format == WeightFormat::kDense) {
    ASSIGN_OR_RETURN(w.dense, SliceHost(w.dense, slice, w.name));
    w.shape = shape;
    return w;
  }
  const bool matrix = w.shape.rank == 2 && (w.format != WeightFormat::kFp8Block ||
                                           w.part_rows == 0 || w.part_rows == w.rows());
  const int64_t align = slice.dim == 0 ? w.block_rows : w.block_cols;
  const bool aligned = matrix && OnBlocks(slice.begin, slice.size, w.shape[slice.dim], align);
  if (!aligned) {
    // Off the blocks: the exact values, dense.
    ASSIGN_OR_RETURN(HostTensor values, Dequantize(w));
    StoredWeight d;
    d.name = w.name;
    d.format = WeightFormat::kDense;
    d.shape = shape;
    ASSIGN_OR_RETURN(d.dense, SliceHost(values, slice, w.name));
    return d;
  }
  const int64_t rows = w.shape[0], cols = w.shape[1];
  StoredWeight out;
  out.name = w.name;
  out.format = w.format;
  out.shape = shape;
  out.block_rows = w.block_rows;
  out.block_cols = w.block_cols;
  if (w.format == WeightFormat::kFp8Block) {
    const int64_t br = w.block_rows, bc = w.block_cols;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    if (slice.dim == 0) {
      out.data = CopyRange(w.data, 1, rows, cols, slice.begin, slice.size);
      out.scale_f32 = CopyRange(w.scale_f32, 1, sr, sc, slice.begin / br,
                                (slice.size + br - 1) / br);
    } else {
      out.data = CopyRange(w.data, rows, cols, 1, slice.begin, slice.size);
      out.scale_f32 = CopyRange(w.scale_f32, sr, sc, 1, slice.begin / bc,
                                (slice.size + bc - 1) / bc);
    }
    out.part_rows = shape[0];
    return out;
  }
  // MXFP4: nibbles [rows, cols / 2], scales [rows, cols / 32].
  if (slice.dim == 0) {
    out.data = CopyRange(w.data, 1, rows, cols / 2, slice.begin, slice.size);
    out.scale_e8m0 = CopyRange(w.scale_e8m0, 1, rows, cols / 32, slice.begin, slice.size);
  } else {
    out.data = CopyRange(w.data, rows, cols / 2, 1, slice.begin / 2, slice.size / 2);
    out.scale_e8m0 = CopyRange(w.scale_e8m0, rows, cols / 32, 1, slice.begin / 32, slice.size / 32);
  }
  return out;
}

}  // namespace dsv4
