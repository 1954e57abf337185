#include "kernels/indexer_ref.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace dsv4 {

void IndexerScoresRef(const IndexerShape& s, const RaggedBatchView& b, int32_t t, const float* q,
                      const float* w, const float* keys, float* scores) {
  const int32_t seq = b.token_seq[t];
  const int64_t visible = (static_cast<int64_t>(b.positions[t]) + 1) / s.ratio;
  const float* qt = q + static_cast<int64_t>(t) * s.heads * s.dim;
  const float* wt = w + static_cast<int64_t>(t) * s.heads;
  for (int64_t e = 0; e < visible; ++e) {
    const float* k = keys + EntryRow(b, seq, e, s.ratio) * s.dim;
    float score = 0;
    for (int64_t h = 0; h < s.heads; ++h) {
      float dot = 0;
      for (int64_t i = 0; i < s.dim; ++i) dot += qt[h * s.dim + i] * k[i];
      score += (wt[h] * s.weight_scale) * (std::max(dot, 0.0f) * s.score_scale);
    }
    scores[e] = score;
  }
}

void IndexerTopKRef(const IndexerShape& s, const RaggedBatchView& b, const float* q, const float* w,
                    const float* keys, int32_t* out) {
  std::vector<float> scores;
  std::vector<int32_t> order;
  for (int32_t t = 0; t < b.num_tokens; ++t) {
    int32_t* sel = out + static_cast<int64_t>(t) * s.topk;
    std::fill(sel, sel + s.topk, -1);
    const int64_t visible = (static_cast<int64_t>(b.positions[t]) + 1) / s.ratio;
    if (visible <= s.topk && !b.force_indexer_scoring) {
      for (int64_t e = 0; e < visible; ++e) sel[e] = static_cast<int32_t>(e);
      continue;
    }
    scores.resize(visible);
    IndexerScoresRef(s, b, t, q, w, keys, scores.data());
    order.resize(visible);
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = std::min<int64_t>(s.topk, visible);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return scores[x] > scores[y] || (scores[x] == scores[y] && x < y);
    });
    std::sort(order.begin(), order.begin() + k);
    std::copy(order.begin(), order.begin() + k, sel);
  }
}

}  // namespace dsv4
