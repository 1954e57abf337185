#include "kernels/sampling_ref.h"

#include "kernels/counter_rng.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace dsv4 {
namespace {

double LogSumExp(std::span<const float> logits) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  return mx + std::log(sum);
}

}  // namespace

double GumbelNoise(uint64_t seed, uint64_t step, int64_t i) {
  return -std::log(-std::log(CounterUniform(seed, SamplingCounter(step, i))));
}

int32_t SampleRef(std::span<const float> logits, const SamplingParams& p, uint64_t step) {
  const int64_t v = static_cast<int64_t>(logits.size());
  if (p.temperature <= 0 || p.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<float> s(v);
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < v; ++i) {
    s[i] = logits[i] / p.temperature;
    mx = std::max(mx, s[i]);
  }
  std::vector<char> keep(v);
  for (int64_t i = 0; i < v; ++i) keep[i] = s[i] > -std::numeric_limits<float>::infinity();
  if (p.top_k > 0 && p.top_k < v) {
    std::vector<float> sorted(s);
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(),
                     std::greater<float>());
    const float kth = sorted[p.top_k - 1];
    for (int64_t i = 0; i < v; ++i) keep[i] = keep[i] && s[i] >= kth;
  }
  if (p.min_p > 0) {
    const float floor = mx + std::log(p.min_p);
    for (int64_t i = 0; i < v; ++i) keep[i] = keep[i] && s[i] >= floor;
  }
  if (p.top_p < 1) {
    std::vector<int32_t> order;
    double z = 0;
    for (int64_t i = 0; i < v; ++i) {
      if (!keep[i]) continue;
      order.push_back(static_cast<int32_t>(i));
      z += std::exp(static_cast<double>(s[i]) - mx);
    }
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
    double mass = 0;
    float threshold = -std::numeric_limits<float>::infinity();
    for (int32_t i : order) {
      mass += std::exp(static_cast<double>(s[i]) - mx) / z;
      threshold = s[i];
      if (mass >= p.top_p) break;
    }
    for (int64_t i = 0; i < v; ++i) keep[i] = keep[i] && s[i] >= threshold;
  }
  int32_t best = -1;
  double best_score = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < v; ++i) {
    if (!keep[i]) continue;
    const double score = static_cast<double>(s[i]) + GumbelNoise(p.seed, step, i);
    if (best < 0 || score > best_score) {
      best = static_cast<int32_t>(i);
      best_score = score;
    }
  }
  return best < 0 ? 0 : best;
}

float LogprobRef(std::span<const float> logits, int32_t token) {
  return static_cast<float>(logits[token] - LogSumExp(logits));
}

std::vector<std::pair<int32_t, float>> TopLogprobsRef(std::span<const float> logits, int n) {
  const double lse = LogSumExp(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = std::min<size_t>(n, order.size());
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<std::pair<int32_t, float>> out;
  for (size_t i = 0; i < k; ++i) {
    out.emplace_back(order[i], static_cast<float>(logits[order[i]] - lse));
  }
  return out;
}

}  // namespace dsv4
