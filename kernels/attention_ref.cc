#include "kernels/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace dsv4 {

void AttentionRef(const AttentionShape& s, const RaggedBatchView& b, const float* q, const float* kv,
                  const float* ring, const float* entries, const int32_t* selected,
                  const float* sinks, float* out) {
  std::vector<const float*> keys;
  std::vector<float> logits;
  for (int32_t t = 0; t < b.num_tokens; ++t) {
    const int32_t seq = b.token_seq[t];
    const int64_t pos = b.positions[t];
    const int64_t start = b.seq_start_pos[seq];
    const float* seq_ring =
        ring + static_cast<int64_t>(b.state_slot[seq]) * s.window * s.dim;
    keys.clear();
    for (int64_t j = std::max<int64_t>(0, pos - s.window + 1); j <= pos; ++j) {
      if (j >= start) {
        keys.push_back(kv + (b.seq_begin[seq] + (j - start)) * s.dim);
      } else {
        keys.push_back(seq_ring + (j % s.window) * s.dim);
      }
    }
    if (s.ratio > 0) {
      const int64_t visible = (pos + 1) / s.ratio;
      if (s.dense_compressed) {
        for (int64_t e = 0; e < visible; ++e) {
          keys.push_back(entries + EntryRow(b, seq, e, s.ratio) * s.dim);
        }
      } else {
        for (int64_t k = 0; k < s.topk; ++k) {
          const int32_t e = selected[t * s.topk + k];
          if (e >= 0 && e < visible) keys.push_back(entries + EntryRow(b, seq, e, s.ratio) * s.dim);
        }
      }
    }
    logits.resize(keys.size());
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* qh = q + (t * s.heads + h) * s.dim;
      float mx = sinks[h];
      for (size_t j = 0; j < keys.size(); ++j) {
        float dot = 0;
        for (int64_t i = 0; i < s.dim; ++i) dot += qh[i] * keys[j][i];
        logits[j] = dot * s.scale;
        mx = std::max(mx, logits[j]);
      }
      float sum = std::exp(sinks[h] - mx);
      for (size_t j = 0; j < keys.size(); ++j) {
        logits[j] = std::exp(logits[j] - mx);
        sum += logits[j];
      }
      float* oh = out + (t * s.heads + h) * s.dim;
      std::fill(oh, oh + s.dim, 0.0f);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float p = logits[j] / sum;
        for (int64_t i = 0; i < s.dim; ++i) oh[i] += p * keys[j][i];
      }
    }
  }
}

void RingWriteRef(int64_t dim, int64_t window, const RaggedBatchView& b, const float* kv,
                  float* ring) {
  for (int32_t t = 0; t < b.num_tokens; ++t) {
    const int32_t seq = b.token_seq[t];
    float* dst = ring + (static_cast<int64_t>(b.state_slot[seq]) * window +
                         b.positions[t] % window) * dim;
    std::memcpy(dst, kv + static_cast<int64_t>(t) * dim, sizeof(float) * dim);
  }
}

}  // namespace dsv4
