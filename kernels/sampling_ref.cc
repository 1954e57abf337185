#include "kernels/sampling_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dsv4 {

double UniformFromCounter(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t SampleRef(std::span<const float> logits, const SamplingParams& p, uint64_t step) {
  const int64_t v = static_cast<int64_t>(logits.size());
  // Greedy: first maximum.
  if (p.temperature <= 0 || p.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  // Descending by logit, ties to the lower id.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = v;
  if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
  std::vector<double> prob(keep);
  const double mx = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[order[i]]) - mx) / p.temperature);
    sum += prob[i];
  }
  for (auto& x : prob) x /= sum;
  // min-p: drop tokens below min_p x the top probability.
  if (p.min_p > 0) {
    int64_t n = 1;
    while (n < keep && prob[n] >= p.min_p * prob[0]) ++n;
    keep = n;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (p.top_p < 1) {
    double mass = 0;
    int64_t n = 0;
    while (n < keep) {
      mass += prob[n++];
      if (mass >= p.top_p) break;
    }
    keep = n;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[i];
  double r = UniformFromCounter(p.seed, step) * total;
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r < 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace dsv4
