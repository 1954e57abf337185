// CUDA launchers: manifold-constrained hyper-connections (dsv4-model.md §4), all fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/mhc_ref.h"

namespace dsv4::cuda {

// The CPU reference's shape struct (kernels/mhc_ref.h): one definition for both.
using HcDims = ::dsv4::HcShape;

// The mixing projections come first, un-normalised: mix = flatten(hs) · fnᵀ (rows = (2+n)n for
// HcPre, n for HcHead) as HcMixParts(T, nd) split-K partial sums [parts, T, rows + 1], the last
// column holding the partial Σ hs² of the RMS norm. HcPre / HcHead sum the parts in a fixed order
// (deterministic) and apply the RMS scale. HcMix serves every T.
constexpr int64_t kHcMixMaxTokens = 16;  // no longer a limit of HcMix; kept for source compatibility
int64_t HcMixParts(int64_t tokens, int64_t nd);
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
