#include "kernels/moe_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu_gemm.h"

namespace dsv4 {
namespace {

// PyTorch softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void RouteRef(const RouterShape& s, const float* logits, const float* bias, const int32_t* tid2eid,
              const int32_t* token_ids, int32_t* idx, float* weights) {
  std::vector<float> score(s.experts);
  std::vector<int32_t> order(s.experts);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t e = 0; e < s.experts; ++e) score[e] = std::sqrt(Softplus(logits[t * s.experts + e]));
    int32_t* it = idx + t * s.top_k;
    if (tid2eid != nullptr) {
      std::copy(tid2eid + static_cast<int64_t>(token_ids[t]) * s.top_k,
                tid2eid + static_cast<int64_t>(token_ids[t] + 1) * s.top_k, it);
    } else {
      std::iota(order.begin(), order.end(), 0);
      auto key = [&](int32_t e) { return score[e] + (bias != nullptr ? bias[e] : 0.0f); };
      std::partial_sort(order.begin(), order.begin() + s.top_k, order.end(),
                        [&](int32_t a, int32_t b) {
                          return key(a) > key(b) || (key(a) == key(b) && a < b);
                        });
      std::copy(order.begin(), order.begin() + s.top_k, it);
    }
    float sum = 0;
    for (int64_t k = 0; k < s.top_k; ++k) sum += score[it[k]];
    for (int64_t k = 0; k < s.top_k; ++k) {
      weights[t * s.top_k + k] = score[it[k]] / (sum + 1e-20f) * s.routed_scale;
    }
  }
}

void SwiGluRef(const float* gate_up, int64_t rows, int64_t inter, float limit, float* h) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * inter;
    const float* u = g + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float gate = std::min(g[i], limit);
      const float up = std::clamp(u[i], -limit, limit);
      h[r * inter + i] = gate / (1.0f + std::exp(-gate)) * up;
    }
  }
}

void MoeExpertsRef(const ExpertsShape& s, const float* u, const int32_t* idx, const float* weights,
                   const float* gate_up, const float* down, float* out) {
  std::fill(out, out + s.tokens * s.dim, 0.0f);
  // Assignments (token, k) grouped by expert.
  std::vector<std::vector<int64_t>> by_expert(s.experts);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t k = 0; k < s.top_k; ++k) {
      const int32_t e = idx[t * s.top_k + k];
      if (e >= 0) by_expert[e].push_back(t * s.top_k + k);
    }
  }
  std::vector<float> x, gu, h, y;
  for (int64_t e = 0; e < s.experts; ++e) {
    const auto& rows = by_expert[e];
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    x.resize(n * s.dim);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(&x[r * s.dim], u + (rows[r] / s.top_k) * s.dim, sizeof(float) * s.dim);
    }
    gu.resize(n * 2 * s.inter);
    h.resize(n * s.inter);
    y.resize(n * s.dim);
    SgemmNT(n, 2 * s.inter, s.dim, x.data(), s.dim, gate_up + e * 2 * s.inter * s.dim, s.dim,
            gu.data(), 2 * s.inter);
    SwiGluRef(gu.data(), n, s.inter, s.swiglu_limit, h.data());
    SgemmNT(n, s.dim, s.inter, h.data(), s.inter, down + e * s.dim * s.inter, s.inter, y.data(),
            s.dim);
    for (int64_t r = 0; r < n; ++r) {
      const float wgt = weights[rows[r]];
      float* o = out + (rows[r] / s.top_k) * s.dim;
      for (int64_t d = 0; d < s.dim; ++d) o[d] += wgt * y[r * s.dim + d];
    }
  }
}

}  // namespace dsv4
