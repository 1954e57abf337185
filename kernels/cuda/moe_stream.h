// CUDA launcher: the routed MXFP4 experts of steps whose experts average a few dozen assignments
// (a 1k-token prefill: ~24 an expert, every expert's weights read), as two weight-streaming
// grouped GEMMs on tensor cores (moe_stream.cu has the design). Same semantics as MoeExperts'
// bf16 path (moe.h, dsv4-model.md §10): u and h rounded to bf16, weights expanded exactly to
// bf16, fp32 accumulation, the deterministic combine.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_shape.h"
#include "kernels/quant_weights.h"

namespace dsv4::cuda {

struct MoeWorkspace;  // moe_mma.cuh

// The streaming kernels run where the experts average at least this many assignments (below,
// the wide kernel's registers stream the weights as fast) and the tiled GEMMs do not
// (MoeTiledRows). Depends on the shapes only, so a captured graph and an eager step of the same
// size choose alike.
constexpr int64_t kMoeStreamMinAverage = 12;

// Whether the streaming kernels take these experts: D and I multiples of 128 (whole 128-wide k
// blocks: four scale groups of 32), gate_up [E * 2I, D] and down [E * D, I], 16-byte aligned
// codes and 4-byte aligned scales, T D and T K I under 2^31 (32-bit row offsets), and (`mode` 1) the step's experts average at least
// kMoeStreamMinAverage assignments; `mode` 0 never, 2 wherever the shapes fit (tests).
bool MoeStreamFits(const ::dsv4::ExpertsShape& d, const Mxfp4Matrix& gate_up,
                   const Mxfp4Matrix& down, int mode);

// out[T, D] = Σ_k weights[t,k] · down[e] · SwiGLU(gate_up[e] · u[t]) with the assignments
// already sorted by expert (SortAssignments: w.order, w.offsets, w.active, w.num_active).
// `wgmma`: the products on warpgroup MMAs (the expanded weights from registers, the staged
// activations read by the tensor cores from shared memory); else mma.sync. The same bits.
absl::Status MoeExpertsStream(const ::dsv4::ExpertsShape& d, bool wgmma, const float* u,
                              const float* weights, const Mxfp4Matrix& gate_up,
                              const Mxfp4Matrix& down, const MoeWorkspace& w, float* out,
                              cudaStream_t stream);

}  // namespace dsv4::cuda
