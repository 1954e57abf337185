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

// The part of a tensor viewed as [rows, cols] (cols = all but the first dim) that a cut keeps:
// rows [r0, r1) and columns [c0, c1). A cut along dim 0 keeps whole rows; along the last dim of a
// matrix, a column range. Any other cut is not a region (the caller reads all and cuts after).
struct Region {
  int64_t rows = 0, cols = 0;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  int64_t n() const { return (r1 - r0) * (c1 - c0); }
};

bool RegionOf(Shape shape, const WeightSlice& cut, Region* out) {
  Region g;
  g.rows = shape.rank > 0 ? shape[0] : 1;
  g.cols = g.rows > 0 ? shape.numel() / g.rows : 0;
  g.r1 = g.rows;
  g.c1 = g.cols;
  if (!cut.whole()) {
    if (cut.begin < 0 || cut.size < 1 || cut.dim >= shape.rank ||
        cut.begin + cut.size > shape[cut.dim]) {
      return false;
    }
    if (cut.dim == 0) {
      g.r0 = cut.begin;
      g.r1 = cut.begin + cut.size;
    } else if (cut.dim == 1 && shape.rank == 2) {
      g.c0 = cut.begin;
      g.c1 = cut.begin + cut.size;
    } else {
      return false;
    }
  }
  *out = g;
  return true;
}

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

TensorBytes WeightSource::Read(const TensorInfo& info, int64_t bytes) {
  bytes_read_ += static_cast<uint64_t>(bytes);
  return ckpt_->Bytes(info);
}

const TensorInfo* WeightSource::Lookup(const std::string& canonical) {
  auto it = index_.find(canonical);
  if (it == index_.end()) return nullptr;
  used_.insert(canonical);
  return it->second;
}

absl::StatusOr<HostTensor> WeightSource::Convert(const std::string& canonical, Shape shape,
                                                 const WeightSlice& cut) {
  const TensorInfo* info = Lookup(canonical);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint tensor ", canonical, " is missing"));
  }
  Region g;
  if (!RegionOf(shape, cut, &g)) {
    // Not a row or column range: all of it, then the cut.
    ASSIGN_OR_RETURN(HostTensor all, Convert(canonical, shape, WeightSlice{}));
    return SliceHost(all, cut, canonical);
  }
  ASSIGN_OR_RETURN(const Shape kept, SlicedShape(shape, cut, canonical));
  HostTensor out;
  out.dtype = DType::kF32;
  out.shape = kept;
  out.f32.resize(static_cast<size_t>(g.n()));
  const bool packed = info->dtype == DType::kI8 || info->dtype == DType::kU8;  // MXFP4 nibbles
  const TensorBytes bytes =
      Read(*info, packed ? g.n() / 2 : g.n() * static_cast<int64_t>(DTypeSize(info->dtype)));
  const int64_t kc = g.c1 - g.c0;
  // Element (r, c) of the region, r and c in the whole tensor's [rows, cols] view.
  auto put = [&](int64_t r, int64_t c, float v) { out.f32[(r - g.r0) * kc + (c - g.c0)] = v; };
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
      for (int64_t r = g.r0; r < g.r1; ++r) {
        for (int64_t c = g.c0; c < g.c1; ++c) {
          const int64_t i = r * g.cols + c;
          put(r, c, info->dtype == DType::kF32    ? ReadAt<float>(bytes.data, i)
                    : info->dtype == DType::kBF16 ? Bf16ToF32(ReadAt<uint16_t>(bytes.data, i))
                                                  : F16ToF32(ReadAt<uint16_t>(bytes.data, i)));
        }
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
      const TensorBytes sbytes = Read(*sinfo, static_cast<int64_t>(sinfo->nbytes));
      for (int64_t r = g.r0; r < g.r1; ++r) {
        for (int64_t c = g.c0; c < g.c1; ++c) {
          put(r, c, F8E4M3ToF32(bytes.data[r * shape[1] + c]) * ScaleAt(sbytes, (r / br) * sc + c / bc));
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
      const TensorBytes sbytes = Read(*sinfo, (g.r1 - g.r0) * ((g.c1 - g.c0 + 31) / 32));
      for (int64_t r = g.r0; r < g.r1; ++r) {
        for (int64_t c = g.c0; c < g.c1; ++c) {
          const uint8_t byte = bytes.data[r * (shape[1] / 2) + c / 2];
          const uint8_t nibble = (c % 2 == 0) ? (byte & 0xf) : (byte >> 4);
          put(r, c, E2M1ToF32(nibble) * ScaleAt(sbytes, r * (shape[1] / 32) + c / 32));
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

absl::StatusOr<HostTensor> WeightSource::F32(const std::string& canonical, Shape shape,
                                             const WeightSlice& cut) {
  ASSIGN_OR_RETURN(HostTensor out, Convert(canonical, shape, cut));
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

absl::StatusOr<StoredWeight> WeightSource::Stored(const std::string& canonical, Shape shape,
                                                  const WeightSlice& cut) {
  const TensorInfo* info = Lookup(canonical);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint tensor ", canonical, " is missing"));
  }
  ASSIGN_OR_RETURN(const Shape kept, SlicedShape(shape, cut, canonical));
  StoredWeight out;
  out.name = canonical;
  out.shape = kept;
  if (info->dtype == DType::kF32 || info->dtype == DType::kBF16 || info->dtype == DType::kF16) {
    ASSIGN_OR_RETURN(out.dense, F32(canonical, shape, cut));
    return out;
  }
  // A quantised cut off its blocks: all of it, then the cut (SliceStored dequantises it).
  auto whole_then_cut = [&]() -> absl::StatusOr<StoredWeight> {
    ASSIGN_OR_RETURN(StoredWeight all, Stored(canonical, shape, WeightSlice{}));
    return SliceStored(std::move(all), cut);
  };
  Region g;
  if (!RegionOf(shape, cut, &g)) return whole_then_cut();
  const TensorBytes bytes = ckpt_->Bytes(*info);  // counted below, by what is copied
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
    if (!cut.whole() && !(cut.dim == 0 ? OnBlocks(cut.begin, cut.size, rows, br)
                                       : OnBlocks(cut.begin, cut.size, cols, bc))) {
      return whole_then_cut();
    }
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
    out.part_rows = g.r1 - g.r0;
    // The region's codes, row by row, and its blocks' scales.
    const int64_t kc = g.c1 - g.c0;
    out.data.resize(static_cast<size_t>(g.n()));
    for (int64_t r = g.r0; r < g.r1; ++r) {
      std::memcpy(out.data.data() + (r - g.r0) * kc, bytes.data + r * cols + g.c0, static_cast<size_t>(kc));
    }
    bytes_read_ += static_cast<uint64_t>(g.n());
    int64_t nan_codes = 0;
    for (uint8_t b : out.data) nan_codes += (b & 0x7f) == 0x7f;
    const TensorBytes sbytes = ckpt_->Bytes(*sinfo);
    const int64_t s_r0 = g.r0 / br, s_r1 = (g.r1 + br - 1) / br;
    const int64_t s_c0 = g.c0 / bc, s_c1 = (g.c1 + bc - 1) / bc;
    out.scale_f32.resize(static_cast<size_t>((s_r1 - s_r0) * (s_c1 - s_c0)));
    bytes_read_ += static_cast<uint64_t>(out.scale_f32.size()) * DTypeSize(sinfo->dtype);
    int64_t bad_scales = 0;
    for (int64_t r = s_r0; r < s_r1; ++r) {
      for (int64_t c = s_c0; c < s_c1; ++c) {
        float& v = out.scale_f32[(r - s_r0) * (s_c1 - s_c0) + (c - s_c0)];
        v = ScaleAt(sbytes, r * sc + c);
        bad_scales += !std::isfinite(v);
      }
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
    if (!cut.whole() && cut.dim == 1 && !OnBlocks(cut.begin, cut.size, cols, 32)) {
      return whole_then_cut();
    }
    out.format = WeightFormat::kMxfp4;
    out.block_rows = 1;
    out.block_cols = 32;
    // The region's rows, each its byte range of nibbles and its range of group scales.
    const int64_t kb = (g.c1 - g.c0) / 2, ks = (g.c1 - g.c0) / 32, nr = g.r1 - g.r0;
    const TensorBytes sbytes = ckpt_->Bytes(*sinfo);
    out.data.resize(static_cast<size_t>(nr * kb));
    out.scale_e8m0.resize(static_cast<size_t>(nr * ks));
    for (int64_t r = g.r0; r < g.r1; ++r) {
      std::memcpy(out.data.data() + (r - g.r0) * kb, bytes.data + r * (cols / 2) + g.c0 / 2,
                  static_cast<size_t>(kb));
      std::memcpy(out.scale_e8m0.data() + (r - g.r0) * ks, sbytes.data + r * (cols / 32) + g.c0 / 32,
                  static_cast<size_t>(ks));
    }
    bytes_read_ += static_cast<uint64_t>(out.data.size() + out.scale_e8m0.size());
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
  const TensorBytes bytes = Read(*info, static_cast<int64_t>(info->nbytes));
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
