// CUDA launcher: the routed experts of a prefill-sized step as two tiled grouped GEMMs on tensor
// cores (moe_tiled.cu has the design and the figures). Same semantics as MoeExperts' bf16 path
// (moe.h, dsv4-model.md §10): u and h rounded to bf16, weights expanded exactly to bf16 (MXFP4;
// FP8 e4m3 x scale rounded once), fp32 accumulation in k order, the deterministic combine.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_shape.h"
#include "kernels/quant_weights.h"

namespace dsv4::cuda {

struct MoeWorkspace;  // moe_mma.cuh

// One expert matrix stack as the tiled kernels read it: bf16 [E * rows, cols] (format kNone),
// FP8 blocks or MXFP4 (kernels/quant_weights.h).
struct TiledExpertWeights {
  QuantFormat format = QuantFormat::kNone;
  const void* bf16 = nullptr;
  Fp8Matrix fp8;
  Mxfp4Matrix fp4;
};

// The token tile (64 or 128 rows) the tiled kernels use for these experts, or 0 where they do
// not run: `mode` 0 (off), 1 (by shape: the experts average at least kMoeTiledMinAverage
// assignments) or 64 / 128 (forced wherever the shapes fit). Depends on the shapes only, so a
// captured graph and an eager step of the same size choose alike.
constexpr int64_t kMoeTiledMinAverage = 32;
int MoeTiledRows(const ::dsv4::ExpertsShape& d, const TiledExpertWeights& gate_up,
                 const TiledExpertWeights& down, int mode);

// The tiled kernel families, all with the same outputs up to the tensor cores' summation within
// a 16-k product: kWarpSpecialized (moe_tiled_ws.cu: persistent, a producer warpgroup and two
// consumer warpgroups, token tiles of up to 256 assignments sized to each expert; where it does
// not fit, kWgmma runs instead), kWgmma (moe_tiled_wgmma.cu: token tiles of `tile_rows`),
// kMmaSync (moe_tiled.cu: `tile_rows` and `warps`).
enum class TiledKernel { kMmaSync, kWgmma, kWarpSpecialized };

// out[T, D] = Σ_k weights[t,k] · down[e] · SwiGLU(gate_up[e] · u[t]) with the assignments
// already sorted by expert (SortAssignments: w.order, w.offsets); `tile_rows` from MoeTiledRows.
// `kernel`: the family above; mma.sync takes `warps` 8 (2 x 4: warp tiles of (rows / 2) x 32)
// or 4 (2 x 2: (rows / 2) x 64). `fp8` (MXFP4 experts, D and I multiples of 128; else ignored):
// u and h in e4m3 per 1 x 128 group and the experts expanded to e4m3, on FP8 tensor cores with
// 64-row tiles (moe_tiled_fp8.cu; Fp8TiledFits).
bool Fp8TiledFits(const ::dsv4::ExpertsShape& d, const TiledExpertWeights& gate_up);
absl::Status MoeExpertsTiled(const ::dsv4::ExpertsShape& d, int tile_rows, TiledKernel kernel,
                             int warps, bool fp8, const float* u,
                             const float* weights, const TiledExpertWeights& gate_up,
                             const TiledExpertWeights& down, const MoeWorkspace& w, float* out,
                             cudaStream_t stream);

}  // namespace dsv4::cuda
