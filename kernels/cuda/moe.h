// CUDA launchers for the MoE block (dsv4-model.md §10): routing, the assignment sort by expert,
// grouped expert GEMMs that read each active expert's weights once per group of tokens, clamped
// SwiGLU and a deterministic combine (sums over k in order, no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/cuda/moe_tiled.h"
#include "kernels/moe_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4::cuda {

// The CPU reference's shape struct (kernels/moe_shape.h): one definition for both.
using RouterDims = ::dsv4::RouterShape;

// logits [T, E] -> idx [T, K], weights [T, K]. tid2eid [V, K] (hash) or bias [E] (score) may be
// null; token ids from `token_ids`.
absl::Status Route(const RouterDims& d, const float* logits, const float* bias,
                   const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx, float* weights,
                   cudaStream_t stream);

// Expert parallelism: idx [n] holds global expert ids; those in [begin, begin + count) become
// local ids (id - begin), every other one local expert 0 with its weight set to 0 (an exact zero
// contribution: the expert kernels take every id in range).
absl::Status LocalizeExperts(int32_t* idx, float* weights, int64_t n, int64_t begin, int64_t count,
                             cudaStream_t stream);

// h[M, I] = silu(min(gu[:, :I], L)) * clamp(gu[:, I:], -L, L)
absl::Status SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float limit, float* h,
                    cudaStream_t stream);

// The CPU reference's shape struct (kernels/moe_shape.h): one definition for both.
using ExpertsDims = ::dsv4::ExpertsShape;

// Bytes of device workspace MoeExperts needs for `tokens` tokens.
size_t MoeWorkspaceBytes(const ExpertsDims& d);

// The grouped kernels MoeExperts / MoeExpertsQuant may choose from for many tokens (the
// benchmarks' A/B switches and the batch-invariant mode).
struct MoeKernels {
  // DSV4_MOE_WIDE: where the experts average at least 4 assignments, an expert with more than 8
  // reads its weights once per 32 or 64 of them (the same bits as the 8-at-a-time kernel with K
  // unsplit); false is the A/B baseline.
  bool wide = true;
  // DSV4_MOE_TILED: the tiled grouped GEMMs of prefill-sized steps (moe_tiled.h): 0 off, 1 by
  // shape (MoeTiledRows), 64 / 128 token rows per tile forced wherever the shapes fit.
  int tiled = 1;
  // DSV4_MOE_WGMMA: the tiled GEMMs on Hopper warpgroup MMAs (moe_tiled_wgmma.cu); 0: mma.sync
  // with DSV4_MOE_TILE_WARPS warps a tiled block, 8 (warp tiles of rows / 2 x 32) or 4 (x 64).
  bool tile_wgmma = true;
  // DSV4_MOE_WS=1: the warp-specialised persistent wgmma kernels (moe_tiled_ws.cu) where they
  // fit, ahead of tile_wgmma (off by default until they are faster on the device).
  bool tile_ws = false;
  TiledKernel Tiled() const {
    return tile_ws ? TiledKernel::kWarpSpecialized
                   : tile_wgmma ? TiledKernel::kWgmma : TiledKernel::kMmaSync;
  }
  // DSV4_MOE_FP8 in precision fp8: MXFP4 experts of tiled steps on FP8 tensor cores with e4m3
  // activations (moe_tiled_fp8.cu).
  bool fp8_activations = false;
  int tile_warps = 8;
  // DSV4_MOE_STREAM: MXFP4 experts of steps the tiled GEMMs do not take on the weight-streaming
  // kernels (moe_stream.h): 0 off (the wide kernel, the A/B baseline), 1 by shape (the experts
  // average at least kMoeStreamMinAverage assignments), 2 wherever the shapes fit (tests).
  int stream = 1;
  // DSV4_MOE_STREAM_WGMMA: those kernels' products on warpgroup MMAs; false: mma.sync (the A/B
  // baseline; the same bits).
  bool stream_wgmma = true;
  // false: bf16 weights take the grouped FMA GEMV of fp32 weights too (the batch-invariant
  // mode's: a token's sums never depend on how many tokens share its expert, which the
  // tensor-core kernels' K splits and kernel choice by token count do).
  bool tensor_cores = true;
};

// out[T, D] = Σ_k weights[t,k] · down[e] · SwiGLU(gate_up[e] · u[t]), e = idx[t,k].
// gate_up [E, 2I, D], down [E, D, I] in fp32 or bf16 (`wdtype`). With bf16 weights an expert's
// tokens share each weight load in groups of 8, or more as `kernels` allows.
absl::Status MoeExperts(const ExpertsDims& d, const float* u, const int32_t* idx,
                        const float* weights, const void* gate_up, const void* down, DType wdtype,
                        void* workspace, float* out, cudaStream_t stream,
                        const MoeKernels& kernels = {});

}  // namespace dsv4::cuda
