#include "kernels/cuda/gemv.h"

#include <cuda_bf16.h>

#include <algorithm>

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

// y[n] = w[n] . x[n / group_rows]: one row per warp.
struct GemvOp {
  const float* x;
  const __nv_bfloat16* w;
  int64_t k, rows, group_rows;
  float* y;
  __device__ __forceinline__ void Rows(int64_t n, const __nv_bfloat16* (&wr)[1],
                                       const float* (&xr)[1]) const {
    wr[0] = w + n * k;
    xr[0] = x + n / group_rows * k;
  }
  __device__ __forceinline__ void Finish(int64_t n, const float (&acc)[1]) const {
    if ((threadIdx.x & 31) == 0) y[n] = acc[0];
  }
};

// The base of slot s's weights (routed expert idx[s], or the shared expert at s == top_k); null
// when the slot has no (valid) expert.
__device__ __forceinline__ const __nv_bfloat16* SlotWeights(const MoeDecodeArgs& a, int64_t s,
                                                            const void* routed,
                                                            const void* shared,
                                                            int64_t per_expert) {
  if (s == a.top_k) return static_cast<const __nv_bfloat16*>(shared);
  if (s > a.top_k) return nullptr;
  const int32_t e = a.idx[s];
  if (e < 0 || e >= a.experts) return nullptr;
  return static_cast<const __nv_bfloat16*>(routed) + e * per_expert;
}

// Group g = (slot s = g / I, column c = g % I): gate row c and up row I + c of the slot's
// gate_up against u; h[s, c] = the clamped SwiGLU (0 for a slot without an expert).
struct GateUpOp {
  MoeDecodeArgs a;
  __device__ __forceinline__ void Rows(int64_t g, const __nv_bfloat16* (&wr)[2],
                                       const float* (&xr)[2]) const {
    const int64_t s = g / a.inter, c = g % a.inter;
    const __nv_bfloat16* base = SlotWeights(a, s, a.gate_up, a.shared_gate_up, 2 * a.inter * a.dim);
    wr[0] = base != nullptr ? base + c * a.dim : nullptr;
    wr[1] = base != nullptr ? base + (a.inter + c) * a.dim : nullptr;
    xr[0] = xr[1] = a.u;
  }
  __device__ __forceinline__ void Finish(int64_t g, const float (&acc)[2]) const {
    if ((threadIdx.x & 31) != 0) return;
    const int64_t s = g / a.inter;
    const bool live = SlotWeights(a, s, a.gate_up, a.shared_gate_up, 0) != nullptr;
    const float gate = fminf(acc[0], a.swiglu_limit);
    const float up = fminf(fmaxf(acc[1], -a.swiglu_limit), a.swiglu_limit);
    a.h[g] = live ? gate / (1.0f + expf(-gate)) * up : 0.0f;
  }
};

// The down projection of MoeDecodeBf16 with one warp per slot: block b covers the R output rows
// d0 = b * R .. d0 + R - 1; warp s streams slot s's R down rows (its expert's rows d0.., all of
// I) against the slot's SwiGLU output, which the R rows share (one activation load per R weight
// loads); the block then combines the slots through shared memory in slot order:
// out[d] = Σ_{s < top_k} weights[s] · sum_s, then + the shared expert's sum. On the H200
// (bench/results/h200-2026-11-30e) this is 32.5 us for slice3's 117 MB (75 % of the HBM rate)
// where one group per output row over all 8 slots (two warps, each with an activation load per
// weight load, 93 registers) took 45 us; R = 2, 4 or 8 rows per warp measured alike, R = 4 (62
// registers) is kept.
template <int R, int U>
__global__ void __launch_bounds__(kThreads) DownSlotsKernel(const MoeDecodeArgs a) {
  static_assert(kWarps == kMoeDecodeMaxSlots, "one warp per slot");
  PdlTrigger();
  __shared__ float red[kWarps][R];
  const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
  const int64_t d0 = int64_t{blockIdx.x} * R;
  WarpStream<R, U, true> ws;
  auto rows = [&](const __nv_bfloat16* base) {
    ws.k1 = base != nullptr ? a.inter : 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ws.w[r] = base != nullptr && d0 + r < a.dim ? base + (d0 + r) * a.inter : nullptr;
      ws.acc[r] = 0.0f;
    }
    if (ws.k1 > 0) ws.Load(0);
  };
  // The shared expert's rows are plain weights: its warp starts loading them before the wait.
  // The routed slots' rows follow the expert ids, which (with the routing weights and h) come
  // from earlier kernels.
  const bool shared_slot = s == a.top_k;
  if (shared_slot) rows(static_cast<const __nv_bfloat16*>(a.shared_down));
  PdlWait();
  if (!shared_slot) rows(SlotWeights(a, s, a.down, a.shared_down, a.dim * a.inter));
  ws.x[0] = shared_slot && a.shared_h != nullptr ? a.shared_h : a.h + s * a.inter;
  ws.Run(0);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float sum = WarpSum(ws.acc[r]);
    if (lane == 0) red[s][r] = sum;
  }
  __syncthreads();
  if (s != 0 || lane >= R || d0 + lane >= a.dim) return;
  float sum = 0.0f, shared = 0.0f;
#pragma unroll
  for (int q = 0; q < kMoeDecodeMaxSlots; ++q) {
    if (q < a.top_k && SlotWeights(a, q, a.down, a.shared_down, 0) != nullptr) {
      sum += a.weights[q] * red[q][lane];
    }
    if (q == a.top_k && a.shared_down != nullptr) shared = red[q][lane];
  }
  a.out[d0 + lane] = sum + shared;
}

}  // namespace

absl::Status RowGemvBf16(const float* x, int64_t k, const void* w, int64_t rows,
                         int64_t group_rows, float* y, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (k <= 0 || k % 8 != 0 || group_rows <= 0 || !Aligned16(x) || !Aligned16(w)) {
    return absl::InvalidArgumentError(
        "RowGemvBf16: needs k a positive multiple of 8, group_rows > 0 and 16-byte aligned x, w");
  }
  const GemvOp op{x, static_cast<const __nv_bfloat16*>(w), k, rows, group_rows, y};
  return LaunchStream<1, 2, true, true>(op, rows, k, stream);
}

bool MoeDecodeFits(const MoeDecodeArgs& a) {
  const int64_t slots = a.top_k + (a.shared_gate_up != nullptr ? 1 : 0);
  return a.dim > 0 && a.inter > 0 && a.dim % 8 == 0 && a.inter % 8 == 0 && a.top_k >= 1 &&
         slots <= kMoeDecodeMaxSlots && a.experts >= 1 && Aligned16(a.u) &&
         Aligned16(a.gate_up) && Aligned16(a.down) && Aligned16(a.h) &&
         Aligned16(a.shared_gate_up) && Aligned16(a.shared_down) && Aligned16(a.shared_h) &&
         (a.shared_gate_up == nullptr) == (a.shared_down == nullptr);
}

absl::Status MoeDecodeBf16(const MoeDecodeArgs& a, cudaStream_t stream) {
  if (!MoeDecodeFits(a)) {
    return absl::InvalidArgumentError(
        "MoeDecodeBf16: needs D and I multiples of 8, at most 8 slots (top_k + shared), 16-byte "
        "aligned operands and both or neither shared weights");
  }
  // The shared expert's gate/up slot unless its SwiGLU came ahead (shared_h).
  const int64_t slots =
      a.top_k + (a.shared_gate_up != nullptr && a.shared_h == nullptr ? 1 : 0);
  // The routed rows come from idx (the router's output): both kernels read them after the wait.
  if (absl::Status st = LaunchStream<2, 2, true, false>(GateUpOp{a}, slots * a.inter, a.dim, stream);
      !st.ok()) {
    return st;
  }
  constexpr int kDownRows = 4;
  CUDA_RETURN_IF_ERROR(
      LaunchPdl(DownSlotsKernel<kDownRows, 2>,
                dim3(static_cast<unsigned>((a.dim + kDownRows - 1) / kDownRows)), dim3(kThreads),
                0, stream, a));
  return absl::OkStatus();
}

bool SharedExpertUpFits(const MoeDecodeArgs& a) {
  return a.dim > 0 && a.inter > 0 && a.dim % 8 == 0 && a.shared_gate_up != nullptr &&
         Aligned16(a.u) && Aligned16(a.shared_gate_up) && Aligned16(a.h);
}

absl::Status SharedExpertUpBf16(const MoeDecodeArgs& a, cudaStream_t stream) {
  if (!SharedExpertUpFits(a)) {
    return absl::InvalidArgumentError(
        "SharedExpertUpBf16: needs D a multiple of 8, a shared expert and 16-byte aligned u, h");
  }
  // GateUpOp with no routed slot: slot 0 is the shared expert. Its rows are plain weights, so
  // they are loaded before the PDL wait.
  MoeDecodeArgs s = a;
  s.top_k = 0;
  s.idx = nullptr;
  return LaunchStream<2, 2, true, true>(GateUpOp{s}, a.inter, a.dim, stream);
}

}  // namespace dsv4::cuda
