// CPU reference: snapshots of a sequence's per-sequence state at a block boundary P inside a
// step (prefix caching; dsv4-model.md §11). At P, a multiple of every compression ratio, the state
// that later tokens read is
//   * the sliding-window ring: the keys of positions [P - W, P), at rows position mod W;
//   * for overlapping (CSA) compressors, the previous window's first halves (values and biased
//     logits of positions [P - m, P)); every open window is empty at P, so its rows are not read.
// Both ops run before the step's RingWrite / Compress, reading what the step has not written yet:
// positions before the chunk from the sequence's slot, the rest from this step's rows.
#pragma once

#include <cstdint>

#include "kernels/compressor_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4 {

// kv [T, dim]; ring [rows, window, dim] (slots then snapshot rows).
void RingSnapshotRef(int64_t dim, int64_t window, const RaggedBatchView& b, const float* kv,
                     float* ring);

// a, z [T, c*d]; bias [m, c*d]; state [rows, CompressorStateFloats]. A no-op for c == 1.
void CompressSnapshotRef(const CompressorShape& s, const RaggedBatchView& b, const float* a,
                         const float* z, const float* bias, float* state);

}  // namespace dsv4
