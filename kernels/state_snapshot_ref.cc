#include "kernels/state_snapshot_ref.h"

#include <algorithm>
#include <cstring>

#include "kernels/compressor_ref.h"

namespace dsv4 {

void RingSnapshotRef(int64_t dim, int64_t window, const RaggedBatchView& b, const float* kv,
                     float* ring) {
  for (int32_t k = 0; k < b.num_snapshots; ++k) {
    const int32_t seq = b.snap_seq[k];
    const int64_t p = b.snap_pos[k], start = b.seq_start_pos[seq], row0 = b.seq_begin[seq];
    const float* slot = ring + static_cast<int64_t>(b.state_slot[seq]) * window * dim;
    float* dst = ring + static_cast<int64_t>(b.snap_row[k]) * window * dim;
    for (int64_t r = std::max<int64_t>(0, p - window); r < p; ++r) {
      const float* src = r >= start ? kv + (row0 + r - start) * dim : slot + (r % window) * dim;
      std::memcpy(dst + (r % window) * dim, src, sizeof(float) * dim);
    }
  }
}

void CompressSnapshotRef(const CompressorShape& s, const RaggedBatchView& b, const float* a,
                         const float* z, const float* bias, float* state) {
  if (s.overlap != 2) return;
  const int64_t m = s.ratio, d = s.dim, cd = s.overlap * d;
  const int64_t floats = CompressorStateFloats(s);
  for (int32_t k = 0; k < b.num_snapshots; ++k) {
    const int32_t seq = b.snap_seq[k];
    const int64_t p = b.snap_pos[k], start = b.seq_start_pos[seq], row0 = b.seq_begin[seq];
    const float* slot = state + static_cast<int64_t>(b.state_slot[seq]) * floats;
    const float* open_a = slot;
    const float* open_z = slot + m * cd;
    float* prev_a = state + static_cast<int64_t>(b.snap_row[k]) * floats + 2 * m * cd;
    float* prev_zb = prev_a + m * d;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t tp = p - m + j;
      const float* ra = tp >= start ? a + (row0 + tp - start) * cd : open_a + j * cd;
      const float* rz = tp >= start ? z + (row0 + tp - start) * cd : open_z + j * cd;
      for (int64_t i = 0; i < d; ++i) {
        prev_a[j * d + i] = ra[i];
        prev_zb[j * d + i] = rz[i] + bias[j * cd + i];
      }
    }
  }
}

}  // namespace dsv4
