// CPU reference sampler (the oracle for the CUDA sampling kernel).
//
// Candidates: every token with a finite logit; top-k keeps tokens scoring at least the k-th
// largest (ties kept), min-p keeps tokens with probability >= min_p x the top one, top-p keeps the
// smallest top set whose probability mass reaches top_p (with ties at the boundary). The draw is
// Gumbel-max over the candidates: argmax_i (logit_i / T + g_i), g_i = -log(-log(u_i)) with u_i a
// counter-based uniform of (seed, step, i). That samples exactly softmax(logits / T) restricted
// to the candidates, needs no sort, and depends only on the request's seed and step, never on
// the rest of the batch.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0;   // 0 = greedy
  int32_t top_k = 0;       // 0 = off
  float top_p = 1;         // (0, 1]
  float min_p = 0;         // [0, 1]
  uint64_t seed = 0;
};

// The Gumbel noise of token `i` at decode `step`: -log(-log(u)), u in (0, 1).
double GumbelNoise(uint64_t seed, uint64_t step, int64_t i);

// Samples one token id from `logits`. `step` is the request's output index.
int32_t SampleRef(std::span<const float> logits, const SamplingParams& p, uint64_t step);

// log-softmax of `logits` at `token`, and the `n` most likely (token, logprob), ties to the lower
// id.
float LogprobRef(std::span<const float> logits, int32_t token);
std::vector<std::pair<int32_t, float>> TopLogprobsRef(std::span<const float> logits, int n);

}  // namespace dsv4
