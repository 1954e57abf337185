// Single-token (decode at batch 1) products with bf16 weights: a GEMV for every projection and a
// fused routed + shared expert block. At one token a step is a stream of weights, so these
// kernels are built for HBM bandwidth: one warp per group of whole weight rows (two warps of one
// block, each over half of k, from k >= 2048, summed through shared memory in slice order; the
// experts' down projection: one warp per slot over a few output rows, the slots combined in the
// block), 16-byte weight loads issued a pass ahead of their use, no staging, no extra combine
// launch and no sort; launched with programmatic dependent launch (common.cuh). Numerics follow
// the GEMM convention of the other paths: x rounded to bf16, exact products in fp32, fp32
// accumulation (lane order, a fixed butterfly, then the slices or slots in order):
// deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::cuda {

// y[n] = Σ_k bf16(x[g(n) * k + k']) · w[n, k'] for n < rows, g(n) = n / group_rows (the grouped
// output projection: x holds rows / group_rows vectors of length k; group_rows = rows for a plain
// GEMV). w bf16 [rows, k], k % 8 == 0, x and w 16-byte aligned.
absl::Status RowGemvBf16(const float* x, int64_t k, const void* w, int64_t rows,
                         int64_t group_rows, float* y, cudaStream_t stream);

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
