#include "worker/checkpoint/weight_source.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/checkpoint/tensor_names.h"

namespace dsv4 {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  Shape shape;
  shape.rank = static_cast<int>(s.size());
  for (size_t i = 0; i < s.size() && i < kMaxTensorRank; ++i) shape.dims[i] = s[i];
  return s.size() <= kMaxTensorRank ? shape.ToString() : "[rank > 4]";
}

bool SameShape(const std::vector<int64_t>& a, Shape b) {
  if (static_cast<int>(a.size()) != b.rank) return false;
  for (int i = 0; i < b.rank; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

template <typename T>
T ReadAt(const uint8_t* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// Scale value of block (r, c) in a scale tensor of any supported dtype.
float ScaleAt(const TensorBytes& s, int64_t i) {
  switch (s.info->dtype) {
    case DType::kF32: return ReadAt<float>(s.data, i);
    case DType::kBF16: return Bf16ToF32(ReadAt<uint16_t>(s.data, i));
    case DType::kF8E8M0: return E8M0ToF32(s.data[i]);
    default: return 0;
  }
}

bool IsScaleDType(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF8E8M0; }

}  // namespace

absl::StatusOr<WeightSource> WeightSource::Create(const Checkpoint* ckpt,
                                                  std::vector<int64_t> fp8_block) {
  WeightSource src;
  src.ckpt_ = ckpt;
  src.fp8_block_ = std::move(fp8_block);
  for (const TensorInfo& t : ckpt->tensors()) {
    auto canonical = CanonicalTensorName(t.name);
    if (!canonical.has_value()) {
      ++src.ignored_;
      continue;
    }
    auto [it, inserted] = src.index_.emplace(*canonical, &t);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensors ", it->second->name,
                                                     " and ", t.name, " both name ", *canonical));
    }
  }
  return src;
}

WeightFormat WeightSource::FormatOf(const std::string& canonical) const {
  auto it = index_.find(canonical);
  if (it == index_.end()) return WeightFormat::kDense;
  switch (it->second->dtype) {
    case DType::kF8E4M3: return WeightFormat::kFp8Block;
    case DType::kI8:
    case DType::kU8: return WeightFormat::kMxfp4;
    default: return WeightFormat::kDense;
  }
}

TensorBytes WeightSource::Read(const TensorInfo& info) {
  bytes_read_ += info.nbytes;
  return ckpt_->Bytes(info);
}

const TensorInfo* WeightSource::Lookup(const std::string& canonical) {
  auto it = index_.find(canonical);
  if (it == index_.end()) return nullptr;
  used_.insert(canonical);
  return it->second;
}

absl::StatusOr<HostTensor> WeightSource::Convert(const std::string& canonical, Shape shape) {
  const TensorInfo* info = Lookup(canonical);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint tensor ", canonical, " is missing"));
  }
  HostTensor out;
  out.dtype = DType::kF32;
  out.shape = shape;
  out.f32.resize(static_cast<size_t>(shape.numel()));
  const TensorBytes bytes = Read(*info);
  const int64_t n = shape.numel();
  auto mismatch = [&] {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor ", info->name, " (",
                                                   canonical, ") has shape ",
                                                   ShapeString(info->shape), " ",
                                                   AV(DTypeName(info->dtype)), "; expected ",
                                                   shape.ToString()));
  };
  switch (info->dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16: {
      if (!SameShape(info->shape, shape)) return mismatch();
      for (int64_t i = 0; i < n; ++i) {
        out.f32[i] = info->dtype == DType::kF32    ? ReadAt<float>(bytes.data, i)
                     : info->dtype == DType::kBF16 ? Bf16ToF32(ReadAt<uint16_t>(bytes.data, i))
                                                   : F16ToF32(ReadAt<uint16_t>(bytes.data, i));
      }
      return out;
    }
    case DType::kF8E4M3: {
      // Block-scaled FP8: W[r, c] = e4m3 · S[r / br, c / bc].
      if (!SameShape(info->shape, shape) || shape.rank != 2) return mismatch();
      const std::string scale_name = absl::StrCat(canonical, "_scale_inv");
      const TensorInfo* sinfo = Lookup(scale_name);
      if (sinfo == nullptr) {
        return absl::NotFoundError(absl::StrCat("FP8 tensor ", info->name, " has no scale (",
                                                scale_name, ")"));
      }
      const int64_t br = fp8_block_[0], bc = fp8_block_[1];
      const int64_t sr = (shape[0] + br - 1) / br, sc = (shape[1] + bc - 1) / bc;
      if (!IsScaleDType(sinfo->dtype) || !SameShape(sinfo->shape, Shape{sr, sc})) {
        return absl::InvalidArgumentError(absl::StrCat("FP8 scale ", sinfo->name, " has shape ",
                                                       ShapeString(sinfo->shape), " ",
                                                       AV(DTypeName(sinfo->dtype)), "; expected [", sr,
                                                       ", ", sc, "] of F32/BF16/F8_E8M0"));
      }
      const TensorBytes sbytes = Read(*sinfo);
      for (int64_t r = 0; r < shape[0]; ++r) {
        for (int64_t c = 0; c < shape[1]; ++c) {
          out.f32[r * shape[1] + c] = F8E4M3ToF32(bytes.data[r * shape[1] + c]) *
                                      ScaleAt(sbytes, (r / br) * sc + c / bc);
        }
      }
      return out;
    }
    case DType::kI8:
    case DType::kU8: {
      // MXFP4: [rows, cols/2] bytes, low nibble = even column; UE8M0 scale per 32 columns.
      if (shape.rank != 2 || shape[1] % 32 != 0 ||
          !SameShape(info->shape, Shape{shape[0], shape[1] / 2})) {
        return mismatch();
      }
      const std::string scale_name = absl::StrCat(canonical, "_scale_inv");
      const TensorInfo* sinfo = Lookup(scale_name);
      if (sinfo == nullptr || !IsScaleDType(sinfo->dtype) ||
          !SameShape(sinfo->shape, Shape{shape[0], shape[1] / 32})) {
        return absl::InvalidArgumentError(absl::StrCat("MXFP4 tensor ", info->name,
                                                       " needs a scale ", scale_name, " of shape [",
                                                       shape[0], ", ", shape[1] / 32, "]"));
      }
      const TensorBytes sbytes = Read(*sinfo);
      for (int64_t r = 0; r < shape[0]; ++r) {
        for (int64_t c = 0; c < shape[1]; ++c) {
          const uint8_t byte = bytes.data[r * (shape[1] / 2) + c / 2];
          const uint8_t nibble = (c % 2 == 0) ? (byte & 0xf) : (byte >> 4);
          out.f32[r * shape[1] + c] =
              E2M1ToF32(nibble) * ScaleAt(sbytes, r * (shape[1] / 32) + c / 32);
        }
      }
      return out;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor ", info->name, " has dtype ",
                                                     AV(DTypeName(info->dtype)),
                                                     "; expected a floating-point weight"));
  }
}

absl::StatusOr<HostTensor> WeightSource::F32(const std::string& canonical, Shape shape) {
  ASSIGN_OR_RETURN(HostTensor out, Convert(canonical, shape));
  // A NaN or Inf weight poisons every logit it reaches; refuse the checkpoint at load. The scan
  // reads values the conversion just wrote (docs/cpu-engine.md has its cost).
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < out.f32.size(); ++i) {
    if (!std::isfinite(out.f32[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad > 0) {
    const auto it = index_.find(canonical);
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint tensor ", it != index_.end() ? it->second->name : canonical, " (", canonical,
        ") holds ", bad, " non-finite values (NaN or Inf; the first at flat index ", first, " is ",
        out.f32[first], "): the checkpoint is corrupt"));
  }
  return out;
}

absl::StatusOr<StoredWeight> WeightSource::Stored(const std::string& canonical, Shape shape) {
  const TensorInfo* info = Lookup(canonical);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint tensor ", canonical, " is missing"));
  }
  StoredWeight out;
  out.name = canonical;
  out.shape = shape;
  if (info->dtype == DType::kF32 || info->dtype == DType::kBF16 || info->dtype == DType::kF16) {
    ASSIGN_OR_RETURN(out.dense, F32(canonical, shape));
    return out;
  }
  const TensorBytes bytes = Read(*info);
  const int64_t rows = shape.rank == 2 ? shape[0] : 0, cols = shape.rank == 2 ? shape[1] : 0;
  auto where = [&] { return absl::StrCat("checkpoint tensor ", info->name, " (", canonical, ")"); };
  const std::string scale_name = absl::StrCat(canonical, "_scale_inv");
  const TensorInfo* sinfo = Lookup(scale_name);
  if (info->dtype == DType::kF8E4M3) {
    if (shape.rank != 2 || !SameShape(info->shape, shape)) {
      return absl::InvalidArgumentError(absl::StrCat(where(), " has shape ", ShapeString(info->shape),
                                                     "; expected ", shape.ToString()));
    }
    if (fp8_block_.size() != 2 || fp8_block_[0] < 1 || fp8_block_[1] < 1) {
      return absl::InvalidArgumentError("config.json: quantization_config.weight_block_size must be two positive sizes");
    }
    const int64_t br = fp8_block_[0], bc = fp8_block_[1];
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    if (sinfo == nullptr) {
      return absl::NotFoundError(absl::StrCat("FP8 ", where(), " has no scale (", scale_name, ")"));
    }
    if (!IsScaleDType(sinfo->dtype) || !SameShape(sinfo->shape, Shape{sr, sc})) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 scale ", sinfo->name, " has shape ", ShapeString(sinfo->shape), " ",
          AV(DTypeName(sinfo->dtype)), "; expected [", sr, ", ", sc, "] of F32/BF16/F8_E8M0 for ",
          "blocks of ", br, "x", bc));
    }
    out.format = WeightFormat::kFp8Block;
    out.block_rows = static_cast<int32_t>(br);
    out.block_cols = static_cast<int32_t>(bc);
    out.part_rows = rows;
    out.data.assign(bytes.data, bytes.data + rows * cols);
    int64_t nan_codes = 0;
    for (uint8_t b : out.data) nan_codes += (b & 0x7f) == 0x7f;
    const TensorBytes sbytes = Read(*sinfo);
    out.scale_f32.resize(static_cast<size_t>(sr * sc));
    int64_t bad_scales = 0;
    for (int64_t i = 0; i < sr * sc; ++i) {
      out.scale_f32[i] = ScaleAt(sbytes, i);
      bad_scales += !std::isfinite(out.scale_f32[i]);
    }
    if (nan_codes > 0 || bad_scales > 0) {
      return absl::InvalidArgumentError(absl::StrCat(where(), " holds ", nan_codes,
                                                     " NaN e4m3 codes and ", bad_scales,
                                                     " non-finite scales: the checkpoint is corrupt"));
    }
    return out;
  }
  if (info->dtype == DType::kI8 || info->dtype == DType::kU8) {
    if (shape.rank != 2 || cols % 32 != 0 || !SameShape(info->shape, Shape{rows, cols / 2})) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MXFP4 ", where(), " has shape ", ShapeString(info->shape), "; expected [", rows, ", ",
          cols / 2, "] bytes for ", shape.ToString(), " values (columns a multiple of 32)"));
    }
    if (sinfo == nullptr || !SameShape(sinfo->shape, Shape{rows, cols / 32}) ||
        (sinfo->dtype != DType::kF8E8M0 && sinfo->dtype != DType::kU8)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MXFP4 ", where(), " needs a scale ", scale_name, " of shape [", rows, ", ", cols / 32,
          "] F8_E8M0", sinfo == nullptr ? " (missing)" : absl::StrCat(", got ",
                                                                       ShapeString(sinfo->shape), " ",
                                                                       AV(DTypeName(sinfo->dtype)))));
    }
    out.format = WeightFormat::kMxfp4;
    out.block_rows = 1;
    out.block_cols = 32;
    out.data.assign(bytes.data, bytes.data + rows * cols / 2);
    const TensorBytes sbytes = Read(*sinfo);
    out.scale_e8m0.assign(sbytes.data, sbytes.data + rows * cols / 32);
    int64_t nan_scales = 0;
    for (uint8_t b : out.scale_e8m0) nan_scales += b == 255;
    if (nan_scales > 0) {
      return absl::InvalidArgumentError(absl::StrCat(where(), " has ", nan_scales,
                                                     " NaN scales (255): the checkpoint is corrupt"));
    }
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(where(), " has dtype ", AV(DTypeName(info->dtype)),
                                                 "; expected a floating-point weight"));
}

absl::StatusOr<HostTensor> WeightSource::I32(const std::string& canonical, Shape shape) {
  const TensorInfo* info = Lookup(canonical);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint tensor ", canonical, " is missing"));
  }
  if ((info->dtype != DType::kI64 && info->dtype != DType::kI32) || !SameShape(info->shape, shape)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor ", info->name, " has shape ",
                                                   ShapeString(info->shape), " ",
                                                   AV(DTypeName(info->dtype)), "; expected ",
                                                   shape.ToString(), " of I64 or I32"));
  }
  HostTensor out;
  out.dtype = DType::kI32;
  out.shape = shape;
  out.i32.resize(static_cast<size_t>(shape.numel()));
  const TensorBytes bytes = Read(*info);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const int64_t v = info->dtype == DType::kI64 ? ReadAt<int64_t>(bytes.data, i)
                                                 : ReadAt<int32_t>(bytes.data, i);
    if (v < INT32_MIN || v > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor ", info->name,
                                                     " holds a value outside int32: ", v));
    }
    out.i32[i] = static_cast<int32_t>(v);
  }
  return out;
}

std::vector<std::string> WeightSource::Unused() const {
  std::vector<std::string> unused;
  for (const auto& [canonical, info] : index_) {
    if (used_.count(canonical) == 0) unused.push_back(info->name);
  }
  return unused;
}

}  // namespace dsv4
