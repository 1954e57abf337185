// CPU reference sampler: greedy, temperature, top-k, top-p and min-p over one row of logits, with
// a counter-based random stream so that a request's draws depend only on (seed, step), never on
// what else is in the batch.
#pragma once

#include <cstdint>
#include <span>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0;   // 0 = greedy
  int32_t top_k = 0;       // 0 = off
  float top_p = 1;         // (0, 1]
  float min_p = 0;         // [0, 1]
  uint64_t seed = 0;
};

// Uniform double in [0, 1) from (seed, counter), via SplitMix64.
double UniformFromCounter(uint64_t seed, uint64_t counter);

// Samples one token id from `logits` (modified: not). `step` is the request's decode counter.
int32_t SampleRef(std::span<const float> logits, const SamplingParams& p, uint64_t step);

}  // namespace dsv4
