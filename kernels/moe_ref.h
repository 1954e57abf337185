// CPU reference: MoE routing (sqrt-softplus scores, biased top-k or tid2eid hash) and the routed
// experts with clamped SwiGLU (dsv4-model.md §10).
#pragma once

#include <cstdint>

#include "kernels/moe_shape.h"

namespace dsv4 {

// logits [T, E]. Score s = sqrt(softplus(logit)). Hash routing (tid2eid [V, K] non-null): idx =
// tid2eid[token_ids[t]]. Score routing: idx = top-K of s + bias (bias [E]). weights[t, k] =
// s[idx] / (Σ_k s[idx] + 1e-20) · routed_scale.
void RouteRef(const RouterShape& s, const float* logits, const float* bias, const int32_t* tid2eid,
              const int32_t* token_ids, int32_t* idx, float* weights);

// h[M, I] = silu(min(gu[:, :I], L)) ⊙ clamp(gu[:, I:], -L, L); gu [M, 2I].
void SwiGluRef(const float* gate_up, int64_t rows, int64_t inter, float limit, float* h);

// out[T, D] = Σ_k weights[t,k] · down[e] · SwiGLU(gate_up[e] · u[t]), e = idx[t,k], grouped by
// expert so that each expert is one GEMM over its tokens. gate_up [E, 2I, D], down [E, D, I].
// An idx of -1 is an expert another rank owns (expert parallelism): the assignment is skipped.
void MoeExpertsRef(const ExpertsShape& s, const float* u, const int32_t* idx, const float* weights,
                   const float* gate_up, const float* down, float* out);

}  // namespace dsv4
