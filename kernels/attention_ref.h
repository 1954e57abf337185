// CPU reference: DSV4 attention over the sliding window ∪ compressed entries with a per-head
// sink (dsv4-model.md §2.4, §6, §9), and the window ring update.
#pragma once

#include <cstdint>

#include "kernels/attention_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4 {

// q [T, H, hd]; kv [T, hd] (this step's keys); ring [slots, W, hd] (earlier keys at pos mod W);
// entries [blocks, bs/m, hd] or null; selected [T, topk] (CSA) or null; sinks [H]; out [T, H, hd].
// Query at position p sees raw keys max(0, p-W+1)..p (those before the sequence's step start come
// from the ring, the rest from kv) plus, for HCA, entries w < floor((p+1)/m) and, for CSA, the
// selected entries (-1 = none).
void AttentionRef(const AttentionShape& s, const RaggedBatchView& b, const float* q, const float* kv,
                  const float* ring, const float* entries, const int32_t* selected,
                  const float* sinks, float* out);

// ring[slot][pos mod W] = kv[t] for every token, in position order.
void RingWriteRef(int64_t dim, int64_t window, const RaggedBatchView& b, const float* kv,
                  float* ring);

}  // namespace dsv4
