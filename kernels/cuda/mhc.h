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
// HcPost fused into the next HcMix: out [T, n, D] = HcPost(hs, f, post, comb) (as HcPost, bit
// for bit) and the mix partial sums of out with fn (as HcMix on out) in one kernel. Covers
// DeepSeek-V4's shape (HcPostMixFits: hc_mult 4, 24 rows, D % 4 == 0, aligned); otherwise the
// caller runs HcPost and HcMix.
bool HcPostMixFits(const HcDims& d, int64_t rows, const float* hs, const float* f,
                   const float* out, const float* fn);
absl::Status HcPostMix(const HcDims& d, const float* hs, const float* f, const float* post,
                       const float* comb, float* out, const float* fn, int64_t rows, float* parts,
                       cudaStream_t stream);
// HcPre / HcHead followed by the RMSNorm of their output (norm_w [D] or null, eps rms_eps), one
// block per token: normed = RmsNorm(collapsed), bit-identical to the two kernels; collapsed
// itself is not written. HcNormFits: D % 4 == 0, D <= 4096, 16-byte aligned.
bool HcNormFits(const HcDims& d, const float* hs, const float* normed, const float* norm_w);
absl::Status HcPreNorm(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                       const float* base, const float* scale, const float* norm_w, float rms_eps,
                       float* normed, float* post, float* comb, cudaStream_t stream);
absl::Status HcHeadNorm(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                        const float* base, const float* scale, const float* norm_w,
                        float rms_eps, float* y, cudaStream_t stream);
// y [T, D] = Σ_j (σ(mix_j scale + base_j) + eps) hs[t, j], mix = rms-normed flatten(hs) · fnᵀ.
absl::Status HcHead(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                    const float* base,
                    const float* scale, float* y, cudaStream_t stream);

}  // namespace dsv4::cuda
