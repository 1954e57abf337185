// CUDA launchers: the lightning indexer (dsv4-model.md §8). Scoring of every visible compressed
// entry and a causal top-k per token (radix select, lowest index wins ties, output ascending and
// -1 padded: the same sets as kernels/indexer_ref.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/indexer_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4::cuda {

// The problem descriptor shared with the CPU reference (kernels/indexer_shape.h).
using IndexerDims = ::dsv4::IndexerShape;

// Fills out[t] with the first min(V_t, topk) entries (the short-context shortcut, valid only when
// every token's visible count V_t <= topk). Launched alone when the host knows that.
absl::Status IndexerSelectAll(const IndexerDims& s, const RaggedBatchView& b, int32_t* out,
                              cudaStream_t stream);
// Scores every visible entry (scores [T, max_visible]) then selects per token; tokens with
// V_t <= topk and no forced scoring take all their entries. `max_visible` bounds V_t.
// `tf32`: the scores on TF32 tensor cores (q rounded to TF32, keys read at TF32 precision, the
// heads summed in another order; the bf16 precision mode's, where q and the keys come from bf16
// products anyway), needs IndexerTf32Fits; else fp32 FMAs in the reference's order.
absl::Status IndexerTopK(const IndexerDims& s, const RaggedBatchView& b, const float* q,
                         const float* w, const float* keys, int64_t max_visible, bool tf32,
                         float* scores, int32_t* out, cudaStream_t stream);
// Whether the TF32 scoring takes these shapes: index_head_dim 128, 16, 32 or 64 heads.
bool IndexerTf32Fits(const IndexerDims& s);

}  // namespace dsv4::cuda
