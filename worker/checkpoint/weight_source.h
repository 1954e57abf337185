// WeightSource: reads checkpoint tensors by canonical name (tensor_names.h), checks their shapes
// and converts them to host fp32/int32 for Backend::CreateWeight.
//
// Precision seam: F32, BF16 and F16 convert directly. FP8 e4m3 weights with a block scale
// (`<weight>_scale_inv`, fp32 or UE8M0, one per 128x128 block by default) and MXFP4 experts
// (I8/U8 packed nibbles, low nibble = even column, with a UE8M0 scale per 32 columns) are
// dequantised here on the host. A GPU backend that keeps quantised weights will take them before
// this conversion.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/checkpoint/weight_slice.h"
#include "worker/model/tensor.h"

namespace dsv4 {

class WeightSource {
 public:
  // Indexes `ckpt` (which must outlive this object) by canonical name. Two checkpoint tensors
  // that map to one canonical name are an error.
  static absl::StatusOr<WeightSource> Create(const Checkpoint* ckpt,
                                             std::vector<int64_t> fp8_block = {128, 128});

  bool Has(const std::string& canonical) const { return index_.count(canonical) > 0; }
  // The format `canonical` is stored in (dense when absent), without reading it.
  WeightFormat FormatOf(const std::string& canonical) const;
  // Loads `canonical` as fp32 with exactly `shape`; errors name the tensor. Non-finite values
  // (NaN, Inf) are an error: the checkpoint is corrupt.
  // With `cut` (a rank's part), only that part is read: whole rows of a dim-0 cut, the columns
  // of a matrix's dim-1 cut; the result has the cut's shape.
  absl::StatusOr<HostTensor> F32(const std::string& canonical, Shape shape,
                                 const WeightSlice& cut = {});
  // `canonical` as stored, logical shape exactly `shape`: F32/BF16/F16 as fp32 values, FP8 e4m3
  // with its block scales (as fp32), MXFP4 (I8/U8 nibbles) with its UE8M0 scales. Errors name the
  // tensor: a missing or misshapen scale, a dtype that is no weight, a block size the shape does
  // not fit, non-finite values (NaN codes, a NaN or infinite scale).
  // With `cut`, only that part is read where it falls on the format's blocks (FP8: block rows or
  // columns; MXFP4: any rows, columns in 32s); a cut off the blocks reads all and comes back
  // dequantised (SliceStored).
  absl::StatusOr<StoredWeight> Stored(const std::string& canonical, Shape shape,
                                      const WeightSlice& cut = {});
  // Loads an integer tensor (I64 or I32) as int32 with exactly `shape`.
  absl::StatusOr<HostTensor> I32(const std::string& canonical, Shape shape);
  // Checkpoint tensors never loaded (excluding ignored MTP tensors), by original name.
  std::vector<std::string> Unused() const;
  int ignored() const { return ignored_; }
  // Bytes of checkpoint tensors (and scales) read so far: a tensor-parallel rank reads its own
  // experts only.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  const TensorInfo* Lookup(const std::string& canonical);
  // The tensor's mapped bytes; `bytes` (what the caller will touch) is added to bytes_read().
  TensorBytes Read(const TensorInfo& info, int64_t bytes);
  absl::StatusOr<HostTensor> Convert(const std::string& canonical, Shape shape, const WeightSlice& cut);

  const Checkpoint* ckpt_ = nullptr;
  std::vector<int64_t> fp8_block_;
  std::map<std::string, const TensorInfo*> index_;
  std::set<std::string> used_;
  int ignored_ = 0;
  uint64_t bytes_read_ = 0;
};

}  // namespace dsv4
