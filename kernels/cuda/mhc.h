// CUDA launchers: manifold-constrained hyper-connections (dsv4-model.md §4), all fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/mhc_shape.h"

namespace dsv4::cuda {

// The problem descriptor shared with the CPU reference (kernels/mhc_shape.h).
using HcDims = ::dsv4::HcShape;

// The mixing projections come first, un-normalised: mix = flatten(hs) · fnᵀ (rows = (2+n)n for
// HcPre, n for HcHead) as HcMixParts(T, nd) split-K partial sums [parts, T, rows + 1], the last
// column holding the partial Σ hs² of the RMS norm. HcPre / HcHead sum the parts in a fixed order
// (deterministic) and apply the RMS scale. HcMix serves every T.
// `staged` (HcMix, HcPostMix, HcPreNorm), the A/B switch: true (the default) runs the faster
// prefill kernels where they apply: the mix streams the tokens through a cp.async shared-memory
// ring (24 or 4 rows, 16-byte aligned, nd (HcPostMix: D) a multiple of 512, tokens × nd / 512
// (HcPostMix: × D / 512) from 4096 (HcMix 24 rows), 8192 (4 rows), 512 (HcPostMix): mhc.cu's
// MixStagedShapeOf); HcPreNorm's deferred form (gates), from 64 tokens, sums every mix value in
// the token's one block (no second block per token). false runs the previous kernels at every
// shape. Both give the same bits for every input (the same float operations in the same
// order), so a token's result depends neither on the batch nor on the switch.
constexpr int64_t kHcMixMaxTokens = 16;  // no longer a limit of HcMix; kept for source compatibility
int64_t HcMixParts(int64_t tokens, int64_t nd);
absl::Status HcMix(const float* hs, int64_t tokens, int64_t nd, const float* fn, int64_t rows,
                   float* parts, cudaStream_t stream, bool staged = true);
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
                       cudaStream_t stream, bool staged = true);
// HcPre / HcHead followed by the RMSNorm of their output (norm_w [D] or null, eps rms_eps), one
// block per token: normed = RmsNorm(collapsed), bit-identical to the two kernels; collapsed
// itself is not written. HcNormFits: D % 4 == 0, D <= 4096, 16-byte aligned.
// With `gates` (HcPreNorm, HcClusterNorm) post and comb are left to HcGates: the kernel writes
// the summed mix values gates [T, HcGateValues(n)] instead, so the Sinkhorn (a serial chain as
// long as the rest of the boundary; post and comb are read only at the next boundary) can run
// on another stream, off the path to the normalised row. Same bits as the undeferred form.
bool HcNormFits(const HcDims& d, const float* hs, const float* normed, const float* norm_w);
absl::Status HcPreNorm(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                       const float* base, const float* scale, const float* norm_w, float rms_eps,
                       float* normed, float* post, float* comb, float* gates,
                       cudaStream_t stream, bool staged = true);
int64_t HcGateValues(int64_t n);
absl::Status HcGates(const HcDims& d, const float* gates, const float* base, const float* scale,
                     float* post, float* comb, cudaStream_t stream);
absl::Status HcHeadNorm(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                        const float* base, const float* scale, const float* norm_w,
                        float rms_eps, float* y, cudaStream_t stream);
// A whole boundary in one launch, one thread-block cluster of D / 512 blocks per token: the mix of
// hs with fn (rows 24: HcPre, writing post and comb; rows 4: HcHead), its gates, the collapse and
// the RMSNorm into normed, the mix sums exchanged in distributed shared memory. With `in`, hs is
// first written as HcPost(in) (HcPostMix's operands; rows 24 only). Bit-identical to HcMix /
// HcPostMix followed by HcPreNorm / HcHeadNorm. HcClusterFits: hc_mult 4, D a multiple of 512 up
// to 4096, 1..16 tokens, 16-byte aligned (the CUDA backend's DSV4_HC_CLUSTER=0 keeps the two
// kernels).
struct HcPostIn {
  const float* hs = nullptr;
  const float* f = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
};
bool HcClusterFits(const HcDims& d, int64_t rows, const float* hs, const float* fn,
                   const float* normed, const float* norm_w);
// Whether the current device can run a cluster of the largest size HcClusterNorm uses (false on
// devices or partitions that cannot co-schedule 8 such blocks: the caller keeps two kernels).
bool HcClusterSchedulable();
absl::Status HcClusterNorm(const HcDims& d, const HcPostIn* in, float* hs, const float* fn,
                           int64_t rows, const float* base, const float* scale, const float* norm_w,
                           float rms_eps, float* normed, float* post, float* comb, float* gates,
                           cudaStream_t stream);
// y [T, D] = Σ_j (σ(mix_j scale + base_j) + eps) hs[t, j], mix = rms-normed flatten(hs) · fnᵀ.
absl::Status HcHead(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                    const float* base,
                    const float* scale, float* y, cudaStream_t stream);

}  // namespace dsv4::cuda
