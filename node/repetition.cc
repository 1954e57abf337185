#include "node/repetition.h"

#include <algorithm>

namespace dsv4 {

RepetitionDetector::RepetitionDetector(RepetitionConfig config)
    : config_(config), tokens_(static_cast<size_t>(std::max(config.max_period, 1)) + 1, -1),
      run_(static_cast<size_t>(std::max(config.max_period, 1)) + 1, 0) {}

int32_t RepetitionDetector::Push(int32_t token) {
  const int64_t ring = static_cast<int64_t>(tokens_.size());
  int32_t found = 0;
  for (int32_t p = 1; p <= config_.max_period; ++p) {
    if (count_ >= p && tokens_[(count_ - p) % ring] == token) {
      ++run_[p];
    } else {
      run_[p] = 0;
    }
    // The last run_[p] + p tokens are period-p repetitions of one block.
    const int64_t span = run_[p] + p;
    if (found == 0 && span >= static_cast<int64_t>(config_.min_count) * p &&
        span >= config_.min_tokens) {
      found = p;
    }
  }
  tokens_[count_ % ring] = token;
  ++count_;
  return found;
}

}  // namespace dsv4
