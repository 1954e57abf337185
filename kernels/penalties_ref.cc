#include "kernels/penalties_ref.h"

#include <algorithm>
#include <cmath>

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

float LogSoftmaxAt(std::span<const float> logits, int32_t token, double* log_sum_exp) {
  double lse;
  if (log_sum_exp != nullptr && *log_sum_exp != 0) {
    lse = *log_sum_exp;
  } else {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
    lse = mx + std::log(sum);
    if (log_sum_exp != nullptr) *log_sum_exp = lse;
  }
  return static_cast<float>(logits[token] - lse);
}

}  // namespace dsv4
