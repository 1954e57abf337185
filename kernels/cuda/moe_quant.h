// CUDA launchers: the MoE block's experts with quantised weights (kernels/quant_weights.h): the
// release's MXFP4 routed experts (and the -Base checkpoints' FP8 ones), plus an FP8 shared expert.
// Same semantics as moe.h MoeExperts and moe_decode.h MoeDecodeBf16 (dsv4-model.md §10):
//   out[T, D] = Σ_k weights[t,k] · down[e] · SwiGLU(gate_up[e] · u[t]), e = idx[t,k]
// with SwiGLU(g, v) = silu(min(g, L)) · clamp(v, -L, L).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/quant_weights.h"

namespace dsv4::cuda {

// Routed expert weights in one quantised format: gate_up [E * 2I, D] (per expert its I gate rows
// then its I up rows; FP8: part_rows = I) and down [E * D, I] (FP8: part_rows = D).
struct QuantExperts {
  QuantFormat format = QuantFormat::kNone;  // kFp8Block or kMxfp4
  Fp8Matrix fp8_gate_up, fp8_down;
  Mxfp4Matrix fp4_gate_up, fp4_down;
};

// Many tokens (prefill and batched decode): each active expert's weights read once per group of
// its tokens, dequantised in registers or shared memory; fp32 accumulation. `exact` (fp32 mode):
// u exact in fp32 and the products exact, the CPU reference's numbers to rounding; otherwise u
// and the SwiGLU output rounded to bf16, as the bf16 expert kernels do. `kernels` as in
// MoeExperts.
// `workspace` of MoeWorkspaceBytes(d) bytes.
absl::Status MoeExpertsQuant(const ExpertsDims& d, const float* u, const int32_t* idx,
                             const float* weights, const QuantExperts& w, bool exact,
                             void* workspace, float* out, cudaStream_t stream,
                             const MoeKernels& kernels = {});

// One token (batch-1 decode), as MoeDecodeBf16 (moe_decode.h) with quantised routed experts: `a`
// gives the sizes, u, idx, weights, h, out and the shared expert (a.shared_gate_up / a.shared_down
// in bf16, or `shared_fp8` when its matrices are set: [2I, D] and [D, I]); a.gate_up / a.down are
// unused. Built for HBM bandwidth (the quantised bytes streamed once).
bool MoeDecodeQuantFits(const MoeDecodeArgs& a, const QuantExperts& w);
absl::Status MoeDecodeQuant(const MoeDecodeArgs& a, const QuantExperts& w,
                            const Fp8Matrix* shared_gate_up_fp8, const Fp8Matrix* shared_down_fp8,
                            cudaStream_t stream);

}  // namespace dsv4::cuda
