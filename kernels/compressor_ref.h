// CPU reference: CSA/HCA compressors with partial-window and overlap state
// (dsv4-model.md §7, §11).
#pragma once

#include <cstdint>

#include "kernels/compressor_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4 {

// State layout per slot (floats): open_a [m, c*d] | open_z [m, c*d] | (c == 2) prev_a [m, d] |
// prev_zb [m, d] (previous window's first-half logits with the position bias added).
int64_t CompressorStateFloats(const CompressorShape& s);

// a, z [T, c*d]: each token's projections. bias [m, c*d]; norm_w [d]; inv_freq [rd/2].
// state [slots, CompressorStateFloats]; entries [blocks, block_size/m, d].
// Tokens of a sequence are consumed in order; every window that closes produces its entry
// (softmax pooling per channel, RMSNorm, RoPE at position w·m) in the sequence's pages.
void CompressRef(const CompressorShape& s, const RaggedBatchView& b, const float* a, const float* z,
                 const float* bias, const float* norm_w, const float* inv_freq, float* state,
                 float* entries);

}  // namespace dsv4
