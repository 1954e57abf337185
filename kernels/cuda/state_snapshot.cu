#include "kernels/cuda/state_snapshot.h"

#include <algorithm>
#include <vector>

#include "kernels/common/cuda_check.h"

namespace dsv4::cuda {
namespace {

// One block per (snapshot, ring row): the key of position r = snap_pos - window + blockIdx.y.
__global__ void RingSnapshotKernel(const float* kv, int64_t dim, int64_t window,
                                   RaggedBatchView b, float* ring) {
  const int32_t k = blockIdx.x;
  const int32_t seq = b.snap_seq[k];
  const int64_t p = b.snap_pos[k];
  const int64_t r = p - window + blockIdx.y;
  if (r < 0) return;
  const int64_t start = b.seq_start_pos[seq], row0 = b.seq_begin[seq];
  const float* src = r >= start
                         ? kv + (row0 + r - start) * dim
                         : ring + (static_cast<int64_t>(b.state_slot[seq]) * window + r % window) * dim;
  float* dst = ring + (static_cast<int64_t>(b.snap_row[k]) * window + r % window) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// One block per snapshot: the previous window's first halves at the snapshot's position.
__global__ void CompressSnapshotKernel(CompressorShape s, int64_t state_floats, RaggedBatchView b,
                                       const float* a, const float* z, const float* bias,
                                       float* state) {
  const int32_t k = blockIdx.x;
  const int32_t seq = b.snap_seq[k];
  const int64_t m = s.ratio, d = s.dim, cd = s.overlap * d;
  const int64_t p = b.snap_pos[k], start = b.seq_start_pos[seq], row0 = b.seq_begin[seq];
  const float* slot = state + static_cast<int64_t>(b.state_slot[seq]) * state_floats;
  float* prev_a = state + static_cast<int64_t>(b.snap_row[k]) * state_floats + 2 * m * cd;
  float* prev_zb = prev_a + m * d;
  for (int64_t idx = threadIdx.x; idx < m * d; idx += blockDim.x) {
    const int64_t j = idx / d, i = idx % d;
    const int64_t tp = p - m + j;
    const float* ra = tp >= start ? a + (row0 + tp - start) * cd : slot + j * cd;
    const float* rz = tp >= start ? z + (row0 + tp - start) * cd : slot + m * cd + j * cd;
    prev_a[idx] = ra[i];
    prev_zb[idx] = rz[i] + bias[j * cd + i];
  }
}

constexpr int kPairsPerLaunch = 32;
constexpr int kPoolsPerLaunch = 64;

struct CopyBatch {
  int32_t pairs = 0;
  int32_t src[kPairsPerLaunch];
  int32_t dst[kPairsPerLaunch];
  int32_t pools = 0;
  StatePool pool[kPoolsPerLaunch];
};

// blockIdx.x: pool, blockIdx.y: pair.
__global__ void CopyRowsKernel(CopyBatch c) {
  const StatePool& p = c.pool[blockIdx.x];
  const float* src = p.base + static_cast<int64_t>(c.src[blockIdx.y]) * p.row_floats;
  float* dst = p.base + static_cast<int64_t>(c.dst[blockIdx.y]) * p.row_floats;
  for (int64_t i = threadIdx.x; i < p.row_floats; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

absl::Status RingSnapshot(const float* kv, int64_t dim, int64_t window, const RaggedBatchView& b,
                          float* ring, cudaStream_t stream) {
  if (b.num_snapshots == 0) return absl::OkStatus();
  RingSnapshotKernel<<<dim3(static_cast<unsigned>(b.num_snapshots), static_cast<unsigned>(window)),
                       128, 0, stream>>>(kv, dim, window, b, ring);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status CompressSnapshot(const CompressorShape& s, const RaggedBatchView& b, const float* a,
                              const float* z, const float* bias, float* state,
                              cudaStream_t stream) {
  if (b.num_snapshots == 0 || s.overlap != 2) return absl::OkStatus();
  CompressSnapshotKernel<<<static_cast<unsigned>(b.num_snapshots), 256, 0, stream>>>(
      s, 2 * s.ratio * s.overlap * s.dim + 2 * s.ratio * s.dim, b, a, z, bias, state);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status CopyStateRows(std::span<const StatePool> pools,
                           std::span<const std::pair<int32_t, int32_t>> copies,
                           cudaStream_t stream) {
  for (size_t p0 = 0; p0 < pools.size(); p0 += kPoolsPerLaunch) {
    for (size_t c0 = 0; c0 < copies.size(); c0 += kPairsPerLaunch) {
      CopyBatch batch;
      batch.pools = static_cast<int32_t>(std::min<size_t>(kPoolsPerLaunch, pools.size() - p0));
      batch.pairs = static_cast<int32_t>(std::min<size_t>(kPairsPerLaunch, copies.size() - c0));
      for (int32_t i = 0; i < batch.pools; ++i) batch.pool[i] = pools[p0 + i];
      for (int32_t i = 0; i < batch.pairs; ++i) {
        batch.src[i] = copies[c0 + i].first;
        batch.dst[i] = copies[c0 + i].second;
      }
      CopyRowsKernel<<<dim3(static_cast<unsigned>(batch.pools), static_cast<unsigned>(batch.pairs)),
                       256, 0, stream>>>(batch);
      CUDA_RETURN_IF_LAUNCH_ERROR();
    }
  }
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
