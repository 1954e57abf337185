// CUDA launchers: manifold-constrained hyper-connections (dsv4-model.md §4), all fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/mhc_ref.h"

namespace dsv4::cuda {

// The CPU reference's shape struct (kernels/mhc_ref.h): one definition for both.
using HcDims = ::dsv4::HcShape;

// The mixing projections come first, un-normalised: mix = flatten(hs) · fnᵀ ([T, (2+n)n] for
// HcPre, [T, n] for HcHead) as `parts` partial sums [parts, T, rows]. Few tokens: HcMix (split-K,
// HcMixParts(T, nd) parts); many: a GEMM ([T, rows], parts = 1). The kernels apply the RMS scale.
constexpr int64_t kHcMixMaxTokens = 16;
int64_t HcMixParts(int64_t tokens, int64_t nd);  // 1 = use a GEMM
absl::Status HcMix(const float* hs, int64_t tokens, int64_t nd, const float* fn, int64_t rows,
                   float* parts, cudaStream_t stream);
// collapsed [T, D], post [T, n], comb [T, n, n] from hs [T, n, D] (n <= 8).
absl::Status HcPre(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                   const float* base,
                   const float* scale, float* collapsed, float* post, float* comb,
                   cudaStream_t stream);
// out[t, k] = post[t, k] f[t] + Σ_j comb[t, j, k] hs[t, j]
absl::Status HcPost(const HcDims& d, const float* hs, const float* f, const float* post,
                    const float* comb, float* out, cudaStream_t stream);
// y [T, D] = Σ_j (σ(mix_j scale + base_j) + eps) hs[t, j], mix = rms-normed flatten(hs) · fnᵀ.
absl::Status HcHead(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                    const float* base,
                    const float* scale, float* y, cudaStream_t stream);

}  // namespace dsv4::cuda
