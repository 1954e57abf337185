// Single-token (decode at batch 1) MoE block with bf16 weights: the routed experts and the shared
// expert fused in two weight-streaming kernels (gate/up + SwiGLU, then down + the slot combine),
// no sort and no combine launch. Same design and numerics as the single-token GEMV (gemv.h: whole
// weight rows per warp through row_stream.cuh, loads a pass ahead, programmatic dependent launch,
// x rounded to bf16, fp32 accumulation in a fixed order: deterministic); the experts' down
// projection is one warp per slot over a few output rows, the slots combined in the block in slot
// order. The quantised-weight counterpart is moe_quant.h MoeDecodeQuant.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::cuda {

// One token through the MoE block's experts: out[D] = Σ_s weights[s] · E_{idx[s]}(u) (+ the
// shared expert with weight 1 when shared_gate_up is non-null; its intermediate size is I too),
// E(u) = down · SwiGLU(gate_up · u)
// with SwiGLU(g, v) = silu(min(g, L)) · clamp(v, -L, L) rounded to bf16 before the down
// projection (as in the grouped path). gate_up [E, 2I, D] and down [E, D, I] bf16, shared
// [2I, D] and [D, I]; slots with an expert id outside [0, E) contribute nothing. `h` is device
// scratch of kMoeDecodeMaxSlots * I floats. Slots: top_k routed + the shared one, at most 8.
struct MoeDecodeArgs {
  int64_t dim = 0, inter = 0, experts = 0, top_k = 0;
  float swiglu_limit = 10;
  const float* u = nullptr;
  const int32_t* idx = nullptr;
  const float* weights = nullptr;
  const void* gate_up = nullptr;
  const void* down = nullptr;
  const void* shared_gate_up = nullptr;  // null: no shared expert
  const void* shared_down = nullptr;
  // The shared expert's SwiGLU computed ahead (SharedExpertUpBf16) [I], or null: then the
  // gate/up kernel covers the routed slots only and the down kernel reads it.
  const float* shared_h = nullptr;
  float* h = nullptr;
  float* out = nullptr;
};
constexpr int kMoeDecodeMaxSlots = 8;
// Whether MoeDecodeBf16 takes these arguments (sizes, alignment, slots).
bool MoeDecodeFits(const MoeDecodeArgs& a);
absl::Status MoeDecodeBf16(const MoeDecodeArgs& a, cudaStream_t stream);
// h[I] = SwiGLU(shared_gate_up · u) for one token (the shared expert's first half, as the fused
// kernel computes it): a.u, a.dim, a.inter, a.swiglu_limit, a.shared_gate_up, a.h.
bool SharedExpertUpFits(const MoeDecodeArgs& a);
absl::Status SharedExpertUpBf16(const MoeDecodeArgs& a, cudaStream_t stream);

}  // namespace dsv4::cuda
