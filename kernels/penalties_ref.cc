#include "kernels/penalties_ref.h"


namespace dsv4 {

void ApplyPenaltiesRef(std::span<float> logits, const std::unordered_map<int32_t, int32_t>& seen,
                       const std::unordered_map<int32_t, int32_t>& output_counts,
                       float repetition, float presence, float frequency) {
  if (repetition != 1.0f) {
    for (const auto& [token, count] : seen) {
      float& l = logits[token];
      l = l > 0 ? l / repetition : l * repetition;
    }
  }
  if (presence != 0.0f || frequency != 0.0f) {
    for (const auto& [token, count] : output_counts) {
      logits[token] -= presence * (count > 0 ? 1.0f : 0.0f) + frequency * static_cast<float>(count);
    }
  }
}

}  // namespace dsv4
