// Online repetition detector: fires when the tail of the generated tokens is one block of p tokens
// repeated, for some period p in [1, max_period], covering at least max(min_count * p,
// min_tokens) tokens. O(max_period) per token: for each period it keeps the length of the current
// run of positions where token[i] == token[i - p].
#pragma once

#include <cstdint>
#include <vector>

namespace dsv4 {

struct RepetitionConfig {
  int32_t max_period = 64;
  int32_t min_count = 8;    // repeats of the block
  int32_t min_tokens = 32;  // span that must repeat (so short periods need more repeats)
};

class RepetitionDetector {
 public:
  explicit RepetitionDetector(RepetitionConfig config);
  // Adds a token; returns the detected period (> 0) when the tail is a repetition now, else 0.
  int32_t Push(int32_t token);

 private:
  RepetitionConfig config_;
  std::vector<int32_t> tokens_;  // last max_period tokens are enough for the comparisons
  std::vector<int64_t> run_;     // run_[p]: trailing positions i with tok[i] == tok[i - p]
  int64_t count_ = 0;
};

}  // namespace dsv4
