// CUDA launchers: prefix-cache state snapshots at block boundaries inside a step and whole-row
// copies of the per-sequence state pools. Same semantics as kernels/state_snapshot_ref.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "kernels/compressor_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4::cuda {

// kv [T, dim]; ring [rows, window, dim]. `b` holds device pointers (b.snap_*).
absl::Status RingSnapshot(const float* kv, int64_t dim, int64_t window, const RaggedBatchView& b,
                          float* ring, cudaStream_t stream);

// a, z [T, c*d]; bias [m, c*d]; state [rows, state floats]. A no-op for c == 1.
absl::Status CompressSnapshot(const CompressorShape& s, const RaggedBatchView& b, const float* a,
                              const float* z, const float* bias, float* state,
                              cudaStream_t stream);

// A pool of per-sequence state: rows of `row_floats` floats.
struct StatePool {
  float* base = nullptr;
  int64_t row_floats = 0;
};

// For each (src, dst) and each pool: row src copied onto row dst. One launch per 32 pairs.
absl::Status CopyStateRows(std::span<const StatePool> pools,
                           std::span<const std::pair<int32_t, int32_t>> copies,
                           cudaStream_t stream);

}  // namespace dsv4::cuda
