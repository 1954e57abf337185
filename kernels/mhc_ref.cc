#include "kernels/mhc_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu_gemm.h"

namespace dsv4 {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// fhat[T, nD] = flatten(hs) · rsqrt(mean(hs²) + eps), then mix[T, rows] = fhat · fnᵀ.
std::vector<float> NormalizedMix(const HcShape& s, const float* hs, const float* fn, int64_t rows) {
  const int64_t nd = s.n * s.dim;
  std::vector<float> fhat(static_cast<size_t>(s.tokens * nd));
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* f = hs + t * nd;
    double sum = 0;
    for (int64_t i = 0; i < nd; ++i) sum += static_cast<double>(f[i]) * f[i];
    const float inv =
        1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(nd)) + s.norm_eps);
    for (int64_t i = 0; i < nd; ++i) fhat[t * nd + i] = f[i] * inv;
  }
  std::vector<float> mix(static_cast<size_t>(s.tokens * rows));
  SgemmNT(s.tokens, rows, nd, fhat.data(), nd, fn, nd, mix.data(), rows);
  return mix;
}

void Collapse(const HcShape& s, const float* hs_t, const float* pre, float* out) {
  for (int64_t d = 0; d < s.dim; ++d) {
    float acc = 0;
    for (int64_t j = 0; j < s.n; ++j) acc += pre[j] * hs_t[j * s.dim + d];
    out[d] = acc;
  }
}

}  // namespace

void SinkhornRef(float* c, int64_t n, int64_t iters, float eps) {
  for (int64_t j = 0; j < n; ++j) {
    float* row = c + j * n;
    const float mx = *std::max_element(row, row + n);
    float sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      row[k] = std::exp(row[k] - mx);
      sum += row[k];
    }
    for (int64_t k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  auto normalize_columns = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += c[j * n + k];
      for (int64_t j = 0; j < n; ++j) c[j * n + k] /= (sum + eps);
    }
  };
  auto normalize_rows = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += c[j * n + k];
      for (int64_t k = 0; k < n; ++k) c[j * n + k] /= (sum + eps);
    }
  };
  normalize_columns();
  for (int64_t i = 1; i < iters; ++i) {
    normalize_rows();
    normalize_columns();
  }
}

void HcPreRef(const HcShape& s, const float* hs, const float* fn, const float* base,
              const float* scale, float* collapsed, float* post, float* comb) {
  const int64_t n = s.n;
  const int64_t mix_dim = (2 + n) * n;
  const std::vector<float> mix = NormalizedMix(s, hs, fn, mix_dim);
  std::vector<float> pre(n);
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* m = mix.data() + t * mix_dim;
    for (int64_t j = 0; j < n; ++j) {
      pre[j] = Sigmoid(m[j] * scale[0] + base[j]) + s.hc_eps;
      post[t * n + j] = 2.0f * Sigmoid(m[n + j] * scale[1] + base[n + j]);
    }
    float* c = comb + t * n * n;
    for (int64_t i = 0; i < n * n; ++i) c[i] = m[2 * n + i] * scale[2] + base[2 * n + i];
    SinkhornRef(c, n, s.sinkhorn_iters, s.hc_eps);
    Collapse(s, hs + t * n * s.dim, pre.data(), collapsed + t * s.dim);
  }
}

void HcPostRef(const HcShape& s, const float* hs, const float* f, const float* post,
               const float* comb, float* out) {
  const int64_t n = s.n;
  const int64_t d_model = s.dim;
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* h = hs + t * n * d_model;
    const float* c = comb + t * n * n;
    const float* ft = f + t * d_model;
    float* o = out + t * n * d_model;
    for (int64_t k = 0; k < n; ++k) {
      const float pk = post[t * n + k];
      float* ok = o + k * d_model;
      for (int64_t d = 0; d < d_model; ++d) ok[d] = pk * ft[d];
      for (int64_t j = 0; j < n; ++j) {
        const float cjk = c[j * n + k];
        const float* hj = h + j * d_model;
        for (int64_t d = 0; d < d_model; ++d) ok[d] += cjk * hj[d];
      }
    }
  }
}

void HcHeadRef(const HcShape& s, const float* hs, const float* fn, const float* base,
               const float* scale, float* y) {
  const int64_t n = s.n;
  const std::vector<float> mix = NormalizedMix(s, hs, fn, n);
  std::vector<float> pre(n);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t j = 0; j < n; ++j) pre[j] = Sigmoid(mix[t * n + j] * scale[0] + base[j]) + s.hc_eps;
    Collapse(s, hs + t * n * s.dim, pre.data(), y + t * s.dim);
  }
}

}  // namespace dsv4
