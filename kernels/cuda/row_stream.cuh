// The weight-streaming machinery of the single-token bf16 kernels: WarpStream (one warp's
// stream of whole weight rows) and StreamKernel / LaunchStream (groups of rows over one or two
// warps of a block, their slices summed in order), shared by RowGemvBf16 (gemv.cu) and
// MoeDecodeBf16 / SharedExpertUpBf16 (moe_decode.cu); the design is gemv.h's.
//
// Included by two .cu files: everything here is in an unnamed namespace (each file instantiates
// its own kernels, as moe_mma.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 256;  // k per warp pass: 32 lanes x 8 bf16 (one 16-byte load each)

// 8 activations rounded to bf16, packed in pairs (one paired conversion per two: conversions
// are the scarce unit here).
struct X8 {
  uint32_t p[4];
};
__device__ __forceinline__ X8 LoadX8(const float* x) {
  const float4 a = *reinterpret_cast<const float4*>(x);
  const float4 b = *reinterpret_cast<const float4*>(x + 4);
  return X8{{PackBf16x2(a.x, a.y), PackBf16x2(a.z, a.w), PackBf16x2(b.x, b.y),
             PackBf16x2(b.z, b.w)}};
}

// acc + the fp32 dot product of 8 bf16 weights (one 16-byte word) with 8 bf16 activations.
__device__ __forceinline__ float Dot8(uint4 w, const X8& x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(x.p[i] << 16), acc);
    acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), __uint_as_float(x.p[i] & 0xffff0000u), acc);
  }
  return acc;
}

// One warp's weight stream: R weight rows (bf16; a null row is skipped and sums to 0) each
// against its activation vector x[r] (kSharedX: all against x[0]) over the warp's slice
// [k0, k1) of k (whole 256-chunks from k0). Each pass loads U chunks of 256 k of every row
// (R * U 16-byte loads per lane) before using any; acc[r] holds this lane's partial sums (in
// chunk order). Load(k0) may be issued early (before the PDL wait, for plain weights) and Run()
// streams the rest.
template <int R, int U, bool kSharedX>
struct WarpStream {
  const __nv_bfloat16* w[R];
  const float* x[R];
  int64_t k1 = 0;
  uint4 v[R][U];
  float acc[R];

  __device__ __forceinline__ void Load(int64_t base) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kk = base + u * kChunk + lane * 8;
        v[r][u] = w[r] != nullptr && kk < k1
                      ? LoadWeights16(reinterpret_cast<const uint4*>(w[r] + kk))
                      : make_uint4(0, 0, 0, 0);
      }
    }
  }
  __device__ __forceinline__ void Use(int64_t base) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = base + u * kChunk + lane * 8;
      if (kk < k1) {
        if constexpr (kSharedX) {
          const X8 xv = LoadX8(x[0] + kk);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r] = Dot8(v[r][u], xv, acc[r]);
        } else {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (w[r] != nullptr) acc[r] = Dot8(v[r][u], LoadX8(x[r] + kk), acc[r]);
          }
        }
      }
    }
  }
  // After Load(k0): every pass of [k0, k1).
  __device__ __forceinline__ void Run(int64_t k0) {
    constexpr int64_t kPer = int64_t{U} * kChunk;
    for (int64_t base = k0; base < k1;) {
      Use(base);
      base += kPer;
      if (base >= k1) break;
      Load(base);
    }
  }
};

// The weight-streaming kernel behind every GEMV here: group g is computed by kW warps of one
// block, each over its own slice of k (whole 256-chunks; warp order = slice order): R weight rows
// each against its activation vector (WarpStream), given by op.Rows(g, w, x); the slices' sums
// are added in slice order through shared memory and the first warp ends with op.Finish(g, sums)
// (every lane holds the sums). Few loads per lane and two warps per row once k >= 2048
// (kTwoWarpK): the shapes measured best on the H200 (bench/lab/decode_floor_lab.cu; gemv.log:
// many resident warps beat deep per-warp batches, persistent double-buffered warps were slower
// still; overlap*.log, in a PDL graph of the step's 61 GEMVs: 1 warp per row with 4 loads per
// pass 893 us, 2 warps with 2 loads 778 us in 128-thread blocks and 741 us in 256-thread blocks;
// an L2 bulk prefetch of the rows before the wait made every variant slower; bulk.log of
// 2026-11-30: weights streamed by bulk copies (TMA) into a shared-memory ring were 25-45 %
// slower than these 16-byte loads on every shape).
//
// Programmatic dependent launch (launched with LaunchPdl): the kernel lets its dependents launch
// at once, and with kConstRows (the rows do not depend on earlier kernels: plain weights) it
// issues its first weight loads before griddepcontrol.wait, so the weight stream starts while
// the previous kernel finishes. Nothing is read from or written to activations before the wait,
// and every thread waits before it exits (so this grid never completes ahead of its
// prerequisites, which a dependent launched early relies on). Activations are read with plain
// (coherent) loads: they may have been written by the grid this one overlapped.
template <int R, int U, int kW, bool kSharedX, bool kConstRows, class Op>
__global__ void __launch_bounds__(kThreads) StreamKernel(const Op op, int64_t groups, int64_t k) {
  static_assert(kWarps % kW == 0, "warps per group");
  PdlTrigger();
  __shared__ float red[kWarps][R];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t g = int64_t{blockIdx.x} * (kWarps / kW) + warp / kW;
  const bool live = g < groups;
  // This warp's slice [k0, k1) of k.
  const int64_t klen = kW == 1 ? k : ((k + kW - 1) / kW + kChunk - 1) / kChunk * kChunk;
  const int64_t k0 = std::min<int64_t>(k, (warp % kW) * klen);
  WarpStream<R, U, kSharedX> ws;
  ws.k1 = live ? std::min<int64_t>(k, k0 + klen) : k0;
#pragma unroll
  for (int r = 0; r < R; ++r) ws.acc[r] = 0.0f;
  if constexpr (kConstRows) {
    if (live) {
      op.Rows(g, ws.w, ws.x);
      ws.Load(k0);
    }
    PdlWait();
  } else {
    PdlWait();
    if (live) {
      op.Rows(g, ws.w, ws.x);
      ws.Load(k0);
    }
  }
  ws.Run(k0);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = WarpSum(ws.acc[r]);
  if constexpr (kW > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) red[warp][r] = acc[r];
    }
    __syncthreads();
    if (warp % kW != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float sum = red[warp][r];
#pragma unroll
      for (int q = 1; q < kW; ++q) sum += red[warp + q][r];
      acc[r] = sum;
    }
  }
  if (live) op.Finish(g, acc);
}

// Warps per group for a k: two from 2048 on (each then streams at least 1024 of k), else one.
constexpr int64_t kTwoWarpK = 2048;

template <int R, int U, bool kSharedX, bool kConstRows, class Op>
absl::Status LaunchStream(const Op& op, int64_t groups, int64_t k, cudaStream_t stream) {
  if (groups == 0) return absl::OkStatus();
  if (k >= kTwoWarpK) {
    constexpr int kPerBlock = kWarps / 2;
    CUDA_RETURN_IF_ERROR(LaunchPdl(StreamKernel<R, U, 2, kSharedX, kConstRows, Op>,
                                   dim3(static_cast<unsigned>((groups + kPerBlock - 1) / kPerBlock)),
                                   dim3(kThreads), 0, stream, op, groups, k));
  } else {
    CUDA_RETURN_IF_ERROR(LaunchPdl(StreamKernel<R, U, 1, kSharedX, kConstRows, Op>,
                                   dim3(static_cast<unsigned>((groups + kWarps - 1) / kWarps)),
                                   dim3(kThreads), 0, stream, op, groups, k));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dsv4::cuda
