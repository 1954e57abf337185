// CPU reference: manifold-constrained hyper-connections (dsv4-model.md §4). All fp32.
#pragma once

#include <cstdint>
#include "kernels/mhc_shape.h"

namespace dsv4 {

// hs [T, n, D]; fn [(2+n)n, nD]; base [(2+n)n]; scale [3].
// Outputs collapsed [T, D], post [T, n], comb [T, n, n] (comb[j][k], the Sinkhorn-normalised
// mixing matrix; the residual update sums over its first index).
void HcPreRef(const HcShape& s, const float* hs, const float* fn, const float* base,
              const float* scale, float* collapsed, float* post, float* comb);

// out[t, k] = post[t, k] · f[t] + Σ_j comb[t, j, k] · hs[t, j]. out must not alias hs.
void HcPostRef(const HcShape& s, const float* hs, const float* f, const float* post,
               const float* comb, float* out);

// HyperHead: fn [n, nD], base [n], scale [1]; y [T, D] = Σ_j (σ(mix_j·scale + base_j) + eps) hs[j].
void HcHeadRef(const HcShape& s, const float* hs, const float* fn, const float* base,
               const float* scale, float* y);

// Sinkhorn projection of one n x n logit matrix in place (row softmax + eps, then alternating
// column/row normalisations ending on columns). Exposed for unit tests.
void SinkhornRef(float* c, int64_t n, int64_t iters, float eps);

}  // namespace dsv4
