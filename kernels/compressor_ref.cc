#include "kernels/compressor_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/rms_norm_ref.h"
#include "kernels/rope_ref.h"

namespace dsv4 {

int64_t CompressorStateFloats(const CompressorShape& s) {
  return 2 * s.ratio * s.overlap * s.dim + (s.overlap == 2 ? 2 * s.ratio * s.dim : 0);
}

void CompressRef(const CompressorShape& s, const RaggedBatchView& b, const float* a, const float* z,
                 const float* bias, const float* norm_w, const float* inv_freq, float* state,
                 float* entries) {
  const int64_t m = s.ratio;
  const int64_t d = s.dim;
  const int64_t cd = s.overlap * d;
  const int64_t state_floats = CompressorStateFloats(s);
  std::vector<float> logits(2 * m);
  std::vector<float> values(2 * m);
  std::vector<float> entry(d);
  for (int32_t seq = 0; seq < b.num_seqs; ++seq) {
    float* st = state + static_cast<int64_t>(b.state_slot[seq]) * state_floats;
    float* open_a = st;
    float* open_z = st + m * cd;
    float* prev_a = st + 2 * m * cd;      // CSA only
    float* prev_zb = prev_a + m * d;      // CSA only
    for (int32_t t = b.seq_begin[seq]; t < b.seq_begin[seq + 1]; ++t) {
      const int64_t pos = b.positions[t];
      const int64_t j = pos % m;
      std::memcpy(open_a + j * cd, a + t * cd, sizeof(float) * cd);
      std::memcpy(open_z + j * cd, z + t * cd, sizeof(float) * cd);
      if (j != m - 1) continue;
      // Window w = pos / m is complete.
      const int64_t w = pos / m;
      for (int64_t i = 0; i < d; ++i) {
        int64_t slots = 0;
        if (s.overlap == 2) {
          for (int64_t k = 0; k < m; ++k) {
            // Window w-1's first halves; for w == 0 these slots do not exist (weight 0).
            logits[slots] = w > 0 ? prev_zb[k * d + i] : -std::numeric_limits<float>::infinity();
            values[slots] = w > 0 ? prev_a[k * d + i] : 0.0f;
            ++slots;
          }
        }
        const int64_t col = (s.overlap == 2 ? d : 0) + i;
        for (int64_t k = 0; k < m; ++k) {
          logits[slots] = open_z[k * cd + col] + bias[k * cd + col];
          values[slots] = open_a[k * cd + col];
          ++slots;
        }
        const float mx = *std::max_element(logits.begin(), logits.begin() + slots);
        float sum = 0;
        for (int64_t k = 0; k < slots; ++k) {
          logits[k] = std::exp(logits[k] - mx);
          sum += logits[k];
        }
        float acc = 0;
        for (int64_t k = 0; k < slots; ++k) acc += (logits[k] / sum) * values[k];
        entry[i] = acc;
      }
      RmsNormRef(entry.data(), norm_w, 1, d, s.norm_eps, entry.data());
      RopeRowRef(entry.data(), d, s.rope_dims, inv_freq, w * m, /*inverse=*/false);
      float* dst = entries + EntryRow(b, seq, w, m) * d;
      std::memcpy(dst, entry.data(), sizeof(float) * d);
      if (s.overlap == 2) {
        // This window's first halves feed the next entry; keep them with the bias added.
        for (int64_t k = 0; k < m; ++k) {
          for (int64_t i = 0; i < d; ++i) {
            prev_a[k * d + i] = open_a[k * cd + i];
            prev_zb[k * d + i] = open_z[k * cd + i] + bias[k * cd + i];
          }
        }
      }
    }
  }
}

}  // namespace dsv4
