#include "kernels/cuda/moe_decode.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/row_stream.cuh"

namespace dsv4::cuda {
namespace {

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
    a.h[g] = live ? ClampedSwiGlu(acc[0], acc[1], a.swiglu_limit) : 0.0f;
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
