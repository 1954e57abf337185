// WeightSlice: the part of a tensor one tensor-parallel rank owns (a contiguous range along one
// dimension), and the slicing of host tensors and stored (FP8 / MXFP4) weights to it.
//
// A quantised weight keeps its format when the range falls on its blocks (FP8: block_rows rows or
// block_cols columns; MXFP4: any rows, columns in 32s); otherwise the slice is dequantised and
// comes back dense (exact values, more bytes), so every split of every config works.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/model/tensor.h"

namespace dsv4 {

struct WeightSlice {
  int dim = -1;        // -1: the whole tensor
  int64_t begin = 0;   // first index along `dim`
  int64_t size = 0;    // indices along `dim`
  bool whole() const { return dim < 0; }
  static WeightSlice Along(int dim, int64_t begin, int64_t size) { return {dim, begin, size}; }
};

// Whether [begin, begin + size) of an extent falls on blocks of `block` (the last block may be
// partial): where a quantised weight can be cut without leaving its format.
bool OnBlocks(int64_t begin, int64_t size, int64_t extent, int64_t block);

// `shape` with `slice` applied; InvalidArgument when the slice is outside it.
absl::StatusOr<Shape> SlicedShape(Shape shape, const WeightSlice& slice, const std::string& name);

// The slice of an f32 or i32 host tensor (any rank).
absl::StatusOr<HostTensor> SliceHost(const HostTensor& t, const WeightSlice& slice,
                                     const std::string& name);

// The slice of a stored weight: dense ones as SliceHost; FP8 (one part) and MXFP4 matrices in
// their format when the slice is block-aligned, dequantised otherwise.
absl::StatusOr<StoredWeight> SliceStored(StoredWeight w, const WeightSlice& slice);

}  // namespace dsv4
