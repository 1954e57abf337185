// A weight as the checkpoint stores it, handed to a backend (Backend::CreateStoredWeight), which
// keeps the format or converts it: tensors the release keeps in BF16/F32 arrive as fp32 values,
// FP8 block-scaled matrices and MXFP4 experts as their bytes and scales (dsv4-model.md §12,
// kernels/quant_weights.h). The CPU reference dequantises; the CUDA backend keeps them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quant_weights.h"
#include "worker/model/tensor.h"

namespace dsv4 {

enum class WeightFormat : uint8_t {
  kDense,     // fp32 values in `dense` (F32, BF16 or F16 in the file)
  kFp8Block,  // e4m3 bytes [rows, cols] in `data`, fp32 block scales in `scale_f32`
  kMxfp4,     // nibbles [rows, cols / 2] in `data`, UE8M0 [rows, cols / 32] in `scale_e8m0`
};
std::string_view WeightFormatName(WeightFormat f);  // "dense", "fp8", "mxfp4"

struct StoredWeight {
  std::string name;  // canonical name, for errors and logs
  WeightFormat format = WeightFormat::kDense;
  Shape shape;       // logical; a matrix is [..., rows, cols] (leading dims stacked as rows)
  HostTensor dense;  // kDense
  std::vector<uint8_t> data;
  std::vector<float> scale_f32;     // kFp8Block: [parts * ceil(part_rows / br), ceil(cols / bc)]
  std::vector<uint8_t> scale_e8m0;  // kMxfp4: [rows, cols / 32]
  int32_t block_rows = 0, block_cols = 0;
  int64_t part_rows = 0;            // kFp8Block: rows of one stacked part (0 = all rows)

  int64_t rows() const;  // product of all dims but the last
  int64_t cols() const;  // the last dim
  // Bytes the format holds (values or codes, and scales).
  size_t bytes() const;
  // Views for the reference and the kernels (valid while this object lives and is unchanged).
  Fp8Matrix fp8() const;
  Mxfp4Matrix mxfp4() const;
};

// A synthetic matrix in a released format (kernels/quant_synthetic.h): FP8 (`format` kFp8Block,
// one scale for every block) or MXFP4, values from SyntheticUniform(seed, i, lo, hi).
StoredWeight SyntheticStoredWeight(QuantFormat format, Shape shape, uint64_t seed, float lo,
                                   float hi, int32_t block_rows, int32_t block_cols,
                                   int64_t part_rows);

// The fp32 values of `w` (dense: its own; quantised: exact dequantisation).
absl::StatusOr<HostTensor> Dequantize(const StoredWeight& w);

// Parts of one format stacked along dim 0 into `shape` (routed experts: per expert w1 then w3, then
// the next expert). Dense parts concatenate their values, MXFP4 parts their bytes and per-row
// scales, FP8 parts their bytes and scale grids (each part's grid restarts: part_rows = the parts'
// rows). The parts must agree on format, columns, block shape and rows.
absl::StatusOr<StoredWeight> StackParts(std::vector<StoredWeight> parts, Shape shape);

}  // namespace dsv4
