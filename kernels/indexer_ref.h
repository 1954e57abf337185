// CPU reference: lightning indexer with causal top-k (dsv4-model.md §8).
#pragma once

#include <cstdint>

#include "kernels/indexer_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4 {

// q [T, nI, dI] (roped), w [T, nI] (weights_proj output, unscaled), keys [blocks, bs/m, dI].
// out [T, topk]: for each token at position p the selected entry indices, ascending, -1 padded.
// With V = floor((p+1)/m) visible entries: when V <= topk and b.force_indexer_scoring is false,
// all V are selected without scoring (the short-context shortcut); otherwise entries are scored
// I_s = Σ_h w_h·weight_scale·ReLU(q_h·K_s)·score_scale and the top min(topk, V) kept (ties go to
// the lower index).
void IndexerTopKRef(const IndexerShape& s, const RaggedBatchView& b, const float* q, const float* w,
                    const float* keys, int32_t* out);

// Scores of every visible entry for one token (exposed for tests and the GPU comparison).
void IndexerScoresRef(const IndexerShape& s, const RaggedBatchView& b, int32_t token,
                      const float* q, const float* w, const float* keys, float* scores);

}  // namespace dsv4
