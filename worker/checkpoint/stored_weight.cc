#include "worker/checkpoint/stored_weight.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/quant_ref.h"
#include "kernels/quant_synthetic.h"

namespace dsv4 {

std::string_view WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kDense: return "dense";
    case WeightFormat::kFp8Block: return "fp8";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

int64_t StoredWeight::rows() const {
  int64_t r = 1;
  for (int i = 0; i + 1 < shape.rank; ++i) r *= shape[i];
  return r;
}

int64_t StoredWeight::cols() const { return shape.rank > 0 ? shape[shape.rank - 1] : 0; }

size_t StoredWeight::bytes() const {
  switch (format) {
    case WeightFormat::kDense: return dense.f32.size() * 4 + dense.i32.size() * 4;
    case WeightFormat::kFp8Block: return data.size() + scale_f32.size() * 4;
    case WeightFormat::kMxfp4: return data.size() + scale_e8m0.size();
  }
  return 0;
}

Fp8Matrix StoredWeight::fp8() const {
  return Fp8Matrix{data.data(), scale_f32.data(), rows(), cols(), block_rows, block_cols,
                   part_rows};
}

Mxfp4Matrix StoredWeight::mxfp4() const {
  return Mxfp4Matrix{data.data(), scale_e8m0.data(), rows(), cols()};
}

StoredWeight SyntheticStoredWeight(QuantFormat format, Shape shape, uint64_t seed, float lo,
                                   float hi, int32_t block_rows, int32_t block_cols,
                                   int64_t part_rows) {
  StoredWeight w;
  w.name = "synthetic";
  w.shape = shape;
  const int64_t rows = w.rows(), cols = w.cols(), n = shape.numel();
  if (format == QuantFormat::kFp8Block) {
    w.format = WeightFormat::kFp8Block;
    w.block_rows = block_rows;
    w.block_cols = block_cols;
    w.part_rows = part_rows > 0 ? part_rows : rows;
    const float scale = SyntheticFp8Scale(lo, hi);
    w.data.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w.data[i] = SyntheticFp8Code(seed, i, lo, hi, scale);
    w.scale_f32.assign(static_cast<size_t>(w.fp8().ScaleCount()), scale);
  } else {
    w.format = WeightFormat::kMxfp4;
    w.block_rows = 1;
    w.block_cols = 32;
    w.data.resize(static_cast<size_t>(n / 2));
    w.scale_e8m0.resize(static_cast<size_t>(n / 32));
    for (int64_t g = 0; g < rows * (cols / 32); ++g) {
      w.scale_e8m0[g] = SyntheticMxfp4Group(seed, static_cast<uint64_t>(g) * 32, lo, hi,
                                            w.data.data() + g * 16);
    }
  }
  return w;
}

absl::StatusOr<HostTensor> Dequantize(const StoredWeight& w) {
  if (w.format == WeightFormat::kDense) return w.dense;
  HostTensor out;
  out.dtype = DType::kF32;
  out.shape = w.shape;
  out.f32.resize(static_cast<size_t>(w.shape.numel()));
  if (w.format == WeightFormat::kFp8Block) {
    DequantizeFp8Ref(w.fp8(), out.f32.data());
  } else {
    DequantizeMxfp4Ref(w.mxfp4(), out.f32.data());
  }
  return out;
}

absl::StatusOr<StoredWeight> StackParts(std::vector<StoredWeight> parts, Shape shape) {
  if (parts.empty()) return absl::InvalidArgumentError("StackParts: no parts");
  StoredWeight out;
  const StoredWeight& first = parts.front();
  out.name = first.name;
  out.format = first.format;
  out.shape = shape;
  out.block_rows = first.block_rows;
  out.block_cols = first.block_cols;
  int64_t rows = 0;
  for (const StoredWeight& p : parts) {
    if (p.format != first.format || p.cols() != first.cols() || p.rows() != first.rows() ||
        p.block_rows != first.block_rows || p.block_cols != first.block_cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint tensor ", p.name, " (", AV(WeightFormatName(p.format)), " ",
          p.shape.ToString(), ") cannot be stacked with ", first.name, " (",
          AV(WeightFormatName(first.format)), " ", first.shape.ToString(), ")"));
    }
    rows += p.rows();
  }
  if (rows * first.cols() != shape.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("stacking ", parts.size(), " parts of ",
                                                   first.shape.ToString(), " into ",
                                                   shape.ToString()));
  }
  if (out.format == WeightFormat::kDense) {
    out.dense.dtype = DType::kF32;
    out.dense.shape = shape;
    out.dense.f32.reserve(static_cast<size_t>(shape.numel()));
  }
  if (out.format == WeightFormat::kFp8Block) out.part_rows = first.rows();
  for (StoredWeight& p : parts) {
    if (out.format == WeightFormat::kDense) {
      out.dense.f32.insert(out.dense.f32.end(), p.dense.f32.begin(), p.dense.f32.end());
    } else {
      out.data.insert(out.data.end(), p.data.begin(), p.data.end());
      out.scale_f32.insert(out.scale_f32.end(), p.scale_f32.begin(), p.scale_f32.end());
      out.scale_e8m0.insert(out.scale_e8m0.end(), p.scale_e8m0.begin(), p.scale_e8m0.end());
    }
    p = StoredWeight{};  // release as we go (experts are large)
  }
  return out;
}

}  // namespace dsv4
