#include "kernels/cuda/mhc.h"

#include <cooperative_groups.h>

#include <algorithm>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kMaxN = 8;
constexpr int kMaxMix = (2 + kMaxN) * kMaxN;  // 80
constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// p[k..k+3] with zeros past n; one 16-byte load when `vec` (the caller checked alignment and
// n % 4 == 0, so k + 3 < n means the whole vector is in range and aligned).
__device__ __forceinline__ float4 Load4(const float* p, int64_t k, int64_t n, bool vec) {
  if (vec && k + 3 < n) return *reinterpret_cast<const float4*>(p + k);
  float4 r;
  r.x = k < n ? p[k] : 0.0f;
  r.y = k + 1 < n ? p[k + 1] : 0.0f;
  r.z = k + 2 < n ? p[k + 2] : 0.0f;
  r.w = k + 3 < n ? p[k + 3] : 0.0f;
  return r;
}

__device__ __forceinline__ float Dot4(float4 a, float4 b) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, a.x * b.x)));
}

// out[t, k] (4 columns) = post_k · f + Σ_j comb[j, k] · x[j]: one output stream of HcPost from
// the n input streams' float4 x[j] at the same columns. Shared by HcPostVecKernel and the fused
// HcPost + mix (MixKernel with kPostN), so both round identically.
template <int kN>
__device__ __forceinline__ float4 PostCombine(float pk, float4 ft, const float4 (&x)[kN],
                                              const float* c, int k) {
  float4 acc = make_float4(pk * ft.x, pk * ft.y, pk * ft.z, pk * ft.w);
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const float cjk = c[j * kN + k];
    acc.x += cjk * x[j].x;
    acc.y += cjk * x[j].y;
    acc.z += cjk * x[j].z;
    acc.w += cjk * x[j].w;
  }
  return acc;
}

// HcPost's operands when the mix kernel computes its own input: the new streams
// out[t] = HcPost(hs[t], f[t], post[t], comb[t]) (D = dim), written as they are mixed.
struct PostArgs {
  const float* hs = nullptr;
  const float* f = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  int64_t dim = 0;
  float* out = nullptr;
};
// The kernels' form of HcPost's operands (the public HcPostIn), writing streams of width dim to
// out.
PostArgs PostArgsOf(const HcPostIn& in, int64_t dim, float* out) {
  PostArgs pa;
  pa.hs = in.hs;
  pa.f = in.f;
  pa.post = in.post;
  pa.comb = in.comb;
  pa.dim = dim;
  pa.out = out;
  return pa;
}

// ---- the mix: partial sums [parts, T, rows + 1] ----
//
// parts[c, t, r] = Σ_{k in chunk c} flatten(hs)[t, k] · fn[r, k] for r < rows, and
// parts[c, t, rows] = Σ_{k in chunk c} flatten(hs)[t, k]², the RMS statistic, so the consumer
// never re-reads hs for the norm. Chunks are kMixChunk wide; the consumer sums them in a fixed
// order (no float atomics: bit-deterministic run to run).
constexpr int kMixChunk = 512;
constexpr int kMixWarps = 4;  // a block covers one chunk: each warp 128 columns, 4 per lane
constexpr int kMixThreads = kMixWarps * 32;
static_assert(kMixWarps * 32 * 4 == kMixChunk);

constexpr int Pow2Ceil(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
constexpr int Log2(int v) { return v <= 1 ? 0 : 1 + Log2(v / 2); }

// One halving step: values [0, 2·kHalf) -> [0, kHalf), exchanging with the lane `kO` away; the
// upper lane keeps the upper half. Template recursion keeps every index constant (a plain
// unrolled loop left the array in local memory).
template <int kHalf, int kO, int kV>
__device__ __forceinline__ void HalvingStep(float (&v)[kV], int lane) {
  const bool upper = (lane & kO) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
  }
  if constexpr (kHalf > 1) HalvingStep<kHalf / 2, kO / 2>(v, lane);
}

// Reduces kV per-lane values across the warp with kV - 1 (+ 5 - log2 kV) shuffles instead of
// 5·kV: each halving step exchanges half of the remaining values with the partner lane. Returns
// in every lane the warp total of value index lane >> (5 - log2 kV); the lanes of one group of
// 32 / kV hold the same bits (each pairwise add is commutative, so partners agree).
template <int kV>
__device__ __forceinline__ float WarpMultiSum(float (&v)[kV], int lane) {
  constexpr int kLog = Log2(kV);
  static_assert((1 << kLog) == kV && kV <= 32);
  if constexpr (kV > 1) HalvingStep<kV / 2, 16>(v, lane);
#pragma unroll
  for (int o = 16 >> kLog; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  return v[0];
}

// A warp's share of the mix at its 4 columns x: the kRows fn rows w and Σ x², summed over the warp
// (WarpMultiSum). The lanes that hold a value (lane % kGroup == 0, *idx < kRows + 1) return true
// with *idx its index and *sum the warp's total.
template <int kRows>
__device__ __forceinline__ bool WarpMix(const float4 (&w)[kRows], float4 x, int lane, int* idx,
                                        float* sum) {
  constexpr int kVals = kRows + 1;
  constexpr int kV = Pow2Ceil(kVals);
  constexpr int kGroup = 32 / kV;
  float v[kV];
#pragma unroll
  for (int r = 0; r < kRows; ++r) v[r] = Dot4(w[r], x);
  v[kRows] = Dot4(x, x);
#pragma unroll
  for (int r = kVals; r < kV; ++r) v[r] = 0.0f;
  *sum = WarpMultiSum<kV>(v, lane);
  *idx = lane / kGroup;
  return lane % kGroup == 0 && *idx < kVals;
}

// Block (c, g): chunk c of nd for tokens [g·tpb, (g+1)·tpb). Each lane keeps its 4 columns of all
// kRows fn rows in registers (fn is read once per token group, from HBM once overall), streams
// the tokens' hs (next token prefetched), reduces the warp with WarpMultiSum and the 4 warps
// through double-buffered shared memory (one barrier per token) in warp order.
//
// kPostN > 0 (n = kPostN streams): the previous HcPost is fused in. The block's flattened input
// columns are computed from pa (PostCombine, one stream k / D per float4: D % 4 == 0, vec) and
// stored to pa.out (each element exactly once over the grid) before they are mixed; hs is unused.
template <int kRows, int kPostN>
__global__ void __launch_bounds__(kMixThreads)
    MixKernel(const float* hs, int64_t tokens, int64_t nd, const float* fn, int64_t tpb, bool vec,
              PostArgs pa, float* parts) {
  PdlTrigger();
  constexpr int kVals = kRows + 1;
  constexpr int kV = Pow2Ceil(kVals);
  __shared__ float red[2][kMixWarps][kV];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = blockIdx.x;
  const int64_t k = c * kMixChunk + warp * 128 + lane * 4;
  // fn is a plain weight: its loads go out before the PDL wait, overlapping the previous kernel's
  // tail; the streams (and pa) are read only after it.
  float4 w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w[r] = Load4(fn + r * nd, k, nd, vec);
  PdlWait();
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * tpb;
  const int64_t t1 = std::min(tokens, t0 + tpb);
  auto fetch = [&](int64_t t) -> float4 {
    if constexpr (kPostN == 0) {
      return Load4(hs + t * nd, k, nd, vec);
    } else {
      if (k >= nd) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int s = static_cast<int>(k / pa.dim);
      const int64_t i = k % pa.dim;
      float4 x[kPostN];
#pragma unroll
      for (int j = 0; j < kPostN; ++j) {
        x[j] = *reinterpret_cast<const float4*>(pa.hs + (t * kPostN + j) * pa.dim + i);
      }
      const float4 ft = *reinterpret_cast<const float4*>(pa.f + t * pa.dim + i);
      const float4 y = PostCombine<kPostN>(pa.post[t * kPostN + s], ft, x,
                                           pa.comb + t * kPostN * kPostN, s);
      *reinterpret_cast<float4*>(pa.out + t * nd + k) = y;
      return y;
    }
  };
  float4 h = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (t0 < t1) h = fetch(t0);
  int buf = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const float4 x = h;
    if (t + 1 < t1) h = fetch(t + 1);
    int idx;
    float s;
    if (WarpMix<kRows>(w, x, lane, &idx, &s)) red[buf][warp][idx] = s;
    // Double buffering: buffer `buf` was last read two tokens ago, before the previous barrier.
    __syncthreads();
    if (threadIdx.x < kVals) {
      float a = red[buf][0][threadIdx.x];
#pragma unroll
      for (int q = 1; q < kMixWarps; ++q) a += red[buf][q][threadIdx.x];
      parts[(c * tokens + t) * kVals + threadIdx.x] = a;
    }
    buf ^= 1;
  }
}

// Any other row count (not used by DeepSeek-V4, whose hc_mult is 4): warp (r, c) dots fn row r
// (r = rows: the squares) with every token over chunk c. Same parts layout.
__global__ void MixGenericKernel(const float* hs, int64_t tokens, int64_t nd, const float* fn,
                                 int rows, float* parts) {
  PdlTrigger();
  PdlWait();
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t chunks = (nd + kMixChunk - 1) / kMixChunk;
  const int vals = rows + 1;
  if (gw >= vals * chunks) return;
  const int r = static_cast<int>(gw % vals);
  const int64_t c = gw / vals;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = hs + t * nd;
    float acc = 0.0f;
    for (int v = 0; v < kMixChunk / 32; ++v) {
      const int64_t i = c * kMixChunk + v * 32 + lane;
      if (i < nd) acc += (r < rows ? fn[r * nd + i] : x[i]) * x[i];
    }
    acc = WarpSum(acc);
    if (lane == 0) parts[(c * tokens + t) * vals + r] = acc;
  }
}

// ---- the staged mix: prefill-sized batches ----
//
// MixKernel keeps one token's float4 per lane in flight (its one-token prefetch; more tokens in
// registers spill the fn vectors) and meets a barrier per token: at 8k tokens an SM holds a few KB
// of loads, far below what HBM needs. MixStagedKernel streams the tokens through a ring of
// kMixStages(kPostN) shared-memory stages of kMixStageTokens tokens each, filled by cp.async
// (16-byte, L1 bypassed: read once), so tens of KB per SM are in flight without registers, and
// meets one barrier per stage: the stage's data is then visible to every thread, the previous
// stage's buffer is free to refill and the previous stage's warp sums are complete (the block
// sums them in warp order while this stage computes). The warp reduction is WarpMultiSum's
// butterfly without its selects (XorMultiSum). The same operations on the same values in the same
// order as MixKernel (Dot4 per lane, the butterfly per value, warps 0..3, the same parts layout),
// so the same bits; only the schedule differs.
//
// kPostN = n (HcPostMix): a block covers 512 columns of each of the n output streams (n groups
// of 4 warps; group j is MixKernel's block for chunk j·D/512 + blockIdx.x) and stages those
// columns of the n input streams and f once for all n groups (MixKernel's n blocks each read
// them: n times the L2 traffic), with post and comb.
//
// Measured on the H200 at 8k tokens, n = 4, D = 4096: HcPostMix 0.50 ms (MixKernel 0.88),
// HcMix 24 rows 0.31 (0.40), 4 rows 0.13 (0.16). At 24 rows the kernel is bound by instruction
// issue, not HBM (ncu: ~0.76 warps issued a scheduler cycle): a warp-token is ~175 instructions,
// 100 of them the Dot4s and 60 the butterfly that the bits fix, so ~0.17 ms is its floor against
// the 0.11 of HBM. Two columns per thread (the first butterfly level in registers: fewer
// shuffles) and two tokens per warp iteration (more independent chains) measured no faster.

// The butterfly of WarpMultiSum without its selects. Register i of `lane` holds value
// i ^ XorMask<kV>(lane) (the caller computed them in that order: LoadXorRows), so in every
// halving step each lane keeps its lower registers and sends its upper ones, and what the partner
// sends is the value kept: the same pairs of lanes add the same partial sums in the same steps
// (lane l and l ^ 16, then l ^ 8, ...: HalvingStep's pairs), so every value gets WarpMultiSum's
// bits with kV - 1 (+ 5 - log2 kV) shuffles and adds and no selects (WarpMultiSum spends two
// selects a shuffle: at 24 rows 124 reduction instructions a token against the Dot4s' 100, here
// 60). Returns in every lane the total of value XorMask<kV>(lane) = lane >> (5 - log2 kV), as
// WarpMultiSum.
template <int kV>
__device__ __forceinline__ int XorMask(int lane) {
  return (lane >> (5 - Log2(kV))) & (kV - 1);
}
template <int kHalf, int kO, int kV>
__device__ __forceinline__ void XorHalvingStep(float (&v)[kV]) {
#pragma unroll
  for (int i = 0; i < kHalf; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i + kHalf], kO);
  if constexpr (kHalf > 1) XorHalvingStep<kHalf / 2, kO / 2>(v);
}
template <int kV>
__device__ __forceinline__ float XorMultiSum(float (&v)[kV]) {
  constexpr int kLog = Log2(kV);
  static_assert((1 << kLog) == kV && kV <= 32);
  if constexpr (kV > 1) XorHalvingStep<kV / 2, 16>(v);
#pragma unroll
  for (int o = 16 >> kLog; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  return v[0];
}

// The fn rows as XorMultiSum groups without padding: kHi (the largest power of two <= kRows) and
// kLo = the rest (24 = 16 + 8, 4 = 4 + 0); Σ x² is a group of one (WarpSum: the same butterfly).
constexpr int HighPow2(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
template <int kRows>
struct XorRows {
  static constexpr int kHi = HighPow2(kRows);
  static constexpr int kLo = kRows - kHi;
  static_assert(kLo == 0 || Pow2Ceil(kLo) == kLo, "mix rows: a sum of two powers of two");
};

// The lane's fn vectors at flattened column k in XorMultiSum's register order: w[i] is row
// i ^ XorMask<kHi>(lane), w[kHi + i] row kHi + (i ^ XorMask<kLo>(lane)). 16-byte aligned, k < nd.
template <int kRows>
__device__ __forceinline__ void LoadXorRows(const float* fn, int64_t nd, int64_t k, int lane,
                                            float4 (&w)[kRows]) {
  using R = XorRows<kRows>;
  const int hi = XorMask<R::kHi>(lane);
#pragma unroll
  for (int i = 0; i < R::kHi; ++i) {
    w[i] = *reinterpret_cast<const float4*>(fn + (i ^ hi) * nd + k);
  }
  if constexpr (R::kLo > 0) {
    const int lo = XorMask<R::kLo>(lane);
#pragma unroll
    for (int i = 0; i < R::kLo; ++i) {
      w[R::kHi + i] = *reinterpret_cast<const float4*>(fn + (R::kHi + (i ^ lo)) * nd + k);
    }
  }
}

// One XorMultiSum group: rows [g0, g0 + kV) of LoadXorRows' vectors dotted with x (Dot4) and
// reduced; lane % (32 / kV) == 0 stores value lane / (32 / kV)'s total to red[g0 + that].
template <int kV, int kRows>
__device__ __forceinline__ void MixGroupXor(const float4 (&w)[kRows], float4 x, int g0,
                                            int lane, float* red) {
  float v[kV];
#pragma unroll
  for (int i = 0; i < kV; ++i) v[i] = Dot4(w[g0 + i], x);
  const float s = XorMultiSum<kV>(v);
  if (lane % (32 / kV) == 0) red[g0 + lane / (32 / kV)] = s;
}

// WarpMix on LoadXorRows' vectors: the warp's totals of the kRows rows and of Σ x² (the same
// Dot4s and trees as WarpMix) stored to red[0..kRows], each by one lane.
template <int kRows>
__device__ __forceinline__ void WarpMixXor(const float4 (&w)[kRows], float4 x, int lane,
                                           float* red) {
  using R = XorRows<kRows>;
  MixGroupXor<R::kHi, kRows>(w, x, 0, lane, red);
  if constexpr (R::kLo > 0) MixGroupXor<R::kLo, kRows>(w, x, R::kHi, lane, red);
  const float sq = WarpSum(Dot4(x, x));
  if (lane == 0) red[kRows] = sq;
}

constexpr int kMixStageTokens = 4;  // tokens a stage, and a barrier
// Ring depth: HcMix's 128-thread blocks (128 registers: the fn vectors) run 4 an SM, 4 stages of
// 2 KB tokens (36 KB of shared memory, up to 24 KB in flight a block, 96 KB an SM); HcPostMix's
// 512-thread block runs alone on its SM, 3 stages of 10 KB tokens (134 KB, up to 80 KB in
// flight).
constexpr int MixStages(int post_n) { return post_n > 0 ? 3 : 4; }
constexpr int MixGroups(int post_n) { return post_n > 0 ? post_n : 1; }
// A token's slot in a stage, in float4: the block's 512 columns of hs; with kPostN, of the n input
// streams and f, then post [n] and comb [n, n].
constexpr int MixSlotF4(int post_n) {
  return post_n > 0 ? (post_n + 1) * (kMixChunk / 4) + (post_n + post_n * post_n + 3) / 4
                    : kMixChunk / 4;
}
template <int kRows, int kPostN>
constexpr size_t MixStagedSmem() {
  return sizeof(float4) * MixStages(kPostN) * kMixStageTokens * MixSlotF4(kPostN) +
         sizeof(float) * 2 * kMixStageTokens * MixGroups(kPostN) * kMixWarps * (kRows + 1);
}

// Token t's slot: the block's columns [col0, col0 + 512) (of every stream with kPostN), one
// cp.async per thread and float4 (tid < 128 also f's, 20 threads post's and comb's floats).
template <int kPostN>
__device__ __forceinline__ void StageMixToken(float4* slot, const float* hs, int64_t nd,
                                              const PostArgs& pa, int64_t t, int64_t col0) {
  constexpr int kF4 = kMixChunk / 4;
  const int tid = threadIdx.x;
  if constexpr (kPostN == 0) {
    CpAsync16(slot + tid, hs + t * nd + col0 + tid * 4);
  } else {
    const int s = tid / kF4, c4 = tid % kF4;
    CpAsync16(slot + tid, pa.hs + (t * kPostN + s) * pa.dim + col0 + c4 * 4);
    if (tid < kF4) CpAsync16(slot + kPostN * kF4 + tid, pa.f + t * pa.dim + col0 + tid * 4);
    const int e = tid - kF4;
    if (e >= 0 && e < kPostN + kPostN * kPostN) {
      float* pc = reinterpret_cast<float*>(slot + (kPostN + 1) * kF4);
      CpAsync4(pc + e, e < kPostN ? pa.post + t * kPostN + e
                                  : pa.comb + t * kPostN * kPostN + (e - kPostN));
    }
  }
}

// The thread's float4 of token t's flattened row from its slot (float4 c4 of the 512 columns):
// hs as staged, or with kPostN output stream j computed (PostCombine, as MixKernel) and stored
// to pa.out at flattened column k.
template <int kPostN>
__device__ __forceinline__ float4 MixInput(const float4* slot, const PostArgs& pa, int64_t t,
                                           int j, int c4, int64_t nd, int64_t k) {
  constexpr int kF4 = kMixChunk / 4;
  if constexpr (kPostN == 0) {
    return slot[c4];
  } else {
    float4 x[kPostN];
#pragma unroll
    for (int s = 0; s < kPostN; ++s) x[s] = slot[s * kF4 + c4];
    const float4 ft = slot[kPostN * kF4 + c4];
    const float* pc = reinterpret_cast<const float*>(slot + (kPostN + 1) * kF4);
    const float4 y = PostCombine<kPostN>(pc[j], ft, x, pc + kPostN, j);
    *reinterpret_cast<float4*>(pa.out + t * nd + k) = y;
    return y;
  }
}

// Block (x, y): columns [x·512, x·512 + 512) (of each output stream with kPostN) for tokens
// [y·tpb, (y+1)·tpb); thread (group j, warp q, lane) is MixKernel's thread (q, lane) of chunk
// x (kPostN: j·D/512 + x). Needs 16-byte aligned operands, nd % 512 == 0 (kPostN: D % 512 == 0).
template <int kRows, int kPostN>
__global__ void __launch_bounds__(kMixThreads * MixGroups(kPostN))
    MixStagedKernel(const float* hs, int64_t tokens, int64_t nd, const float* fn, int64_t tpb,
                    PostArgs pa, float* parts) {
  constexpr int kWarps = MixGroups(kPostN) * kMixWarps, kVals = kRows + 1;
  constexpr int kS = kMixStageTokens, kStages = MixStages(kPostN), kSlot = MixSlotF4(kPostN);
  PdlTrigger();
  extern __shared__ float4 mix_ring[];  // [kStages][kS] slots, then red [2][kS][kWarps][kVals]
  float* const red = reinterpret_cast<float*>(mix_ring + kStages * kS * kSlot);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = warp / kMixWarps;             // output stream (kPostN), else 0
  const int c4 = threadIdx.x % kMixThreads;   // the thread's float4 of the 512 columns
  const int64_t col0 = int64_t{blockIdx.x} * kMixChunk;
  const int64_t k = (kPostN > 0 ? j * pa.dim : 0) + col0 + c4 * 4;  // flattened column
  // fn is a weight: loaded before the PDL wait (as MixKernel), the streams only after it.
  float4 w[kRows];
  LoadXorRows<kRows>(fn, nd, k, lane, w);
  PdlWait();
  const int64_t t0 = int64_t{blockIdx.y} * tpb, t1 = std::min(tokens, t0 + tpb);
  const int stages = static_cast<int>((t1 - t0 + kS - 1) / kS);
  auto issue = [&](int s) {  // one commit group per stage, empty past the end
    if (s < stages) {
      for (int u = 0; u < kS && t0 + s * kS + u < t1; ++u) {
        StageMixToken<kPostN>(mix_ring + ((s % kStages) * kS + u) * kSlot, hs, nd, pa,
                              t0 + s * kS + u, col0);
      }
    }
    CpAsyncCommit();
  };
  // Stage s's parts: warps 0..3 of each group summed in order (MixKernel's cross-warp sum).
  auto flush = [&](int s) {
    const float* rs = red + (s & 1) * kS * kWarps * kVals;
    for (int e = threadIdx.x; e < MixGroups(kPostN) * kS * kVals; e += blockDim.x) {
      const int g = e / (kS * kVals), u = (e / kVals) % kS, r = e % kVals;
      const int64_t t = t0 + s * kS + u;
      if (t >= t1) continue;
      const float* p = rs + (u * kWarps + g * kMixWarps) * kVals + r;
      float a = p[0];
#pragma unroll
      for (int q = 1; q < kMixWarps; ++q) a += p[q * kVals];
      const int64_t c = kPostN > 0 ? g * (pa.dim / kMixChunk) + blockIdx.x : blockIdx.x;
      parts[(c * tokens + t) * kVals + r] = a;
    }
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int s = 0; s < stages; ++s) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of stage s
    __syncthreads();             // everyone's; stage s - 1 read and its warp sums written
    issue(s + kStages - 1);      // into stage s - 1's buffer
    if (s > 0) flush(s - 1);
    const float4* slot = mix_ring + (s % kStages) * kS * kSlot;
    float* rs = red + (s & 1) * kS * kWarps * kVals + warp * kVals;
    for (int u = 0; u < kS && t0 + s * kS + u < t1; ++u) {
      const float4 x = MixInput<kPostN>(slot + u * kSlot, pa, t0 + s * kS + u, j, c4, nd, k);
      WarpMixXor<kRows>(w, x, lane, rs + u * kWarps * kVals);
    }
  }
  __syncthreads();
  if (stages > 0) flush(stages - 1);
}

// ---- gates, Sinkhorn, collapse ----

// Sinkhorn of comb logits in registers on one thread (the reference's order exactly); the
// fallback for n·n > 32, which the warp version below does not cover.
template <int n>
__device__ void SinkhornSerial(float* c, int64_t iters, float eps) {
#pragma unroll
  for (int j = 0; j < n; ++j) {
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < n; ++k) mx = fmaxf(mx, c[j * n + k]);
    float sum = 0;
#pragma unroll
    for (int k = 0; k < n; ++k) {
      c[j * n + k] = expf(c[j * n + k] - mx);
      sum += c[j * n + k];
    }
#pragma unroll
    for (int k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / sum + eps;
  }
  for (int64_t it = 0; it < iters || it == 0; ++it) {
    if (it > 0) {
#pragma unroll
      for (int j = 0; j < n; ++j) {
        float sum = 0;
#pragma unroll
        for (int k = 0; k < n; ++k) sum += c[j * n + k];
#pragma unroll
        for (int k = 0; k < n; ++k) c[j * n + k] /= (sum + eps);
      }
    }
#pragma unroll
    for (int k = 0; k < n; ++k) {
      float sum = 0;
#pragma unroll
      for (int j = 0; j < n; ++j) sum += c[j * n + k];
#pragma unroll
      for (int j = 0; j < n; ++j) c[j * n + k] /= (sum + eps);
    }
  }
}

// Sinkhorn on one warp, lane j·n + k holding c[j][k] (n·n <= 32). Every row / column sum is
// gathered with shuffles and added in the reference's order (index 0 up, from 0), so the sums and
// divisions are the reference's operations; only expf may differ from std::exp in the last ulp.
// Order as SinkhornRef: row softmax + eps, columns, then (rows, columns) × (iters - 1).
template <int n>
__device__ __forceinline__ float SinkhornWarp(float c, int lane, int64_t iters, float eps) {
  const bool live = lane < n * n;
  const int j = live ? lane / n : 0, k = live ? lane % n : 0;
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < n; ++q) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, j * n + q));
  c = expf(c - mx);
  float sum = 0;
#pragma unroll
  for (int q = 0; q < n; ++q) sum += __shfl_sync(0xffffffffu, c, j * n + q);
  c = c / sum + eps;
  for (int64_t it = 0; it < iters || it == 0; ++it) {
    if (it > 0) {
      float rs = 0;
#pragma unroll
      for (int q = 0; q < n; ++q) rs += __shfl_sync(0xffffffffu, c, j * n + q);
      c /= (rs + eps);
    }
    float cs = 0;
#pragma unroll
    for (int q = 0; q < n; ++q) cs += __shfl_sync(0xffffffffu, c, q * n + k);
    c /= (cs + eps);
  }
  return c;
}

// Value r of token t's mix, summed over the parts [nparts, tokens, vals] by one warp: lane-strided,
// then a warp tree (a fixed order: every block and kernel that sums it gets the same bits).
__device__ __forceinline__ float PartSum(const float* parts, int64_t nparts, int64_t tokens,
                                         int64_t t, int vals, int r, int lane) {
  float s = 0.0f;
  for (int64_t p = lane; p < nparts; p += 32) s += parts[(p * tokens + t) * vals + r];
  return WarpSum(s);
}

// post [n] and comb [n, n] of token t from its summed mix (vals, RMS scale inv), on one warp
// (every lane of it calls this).
template <int kN>
__device__ __forceinline__ void PostAndComb(const float* vals, float inv, const float* base,
                                            const float* scale, const HcDims& d, int64_t t,
                                            int lane, float* post, float* comb) {
  if (lane < kN) {
    post[t * kN + lane] = 2.0f * Sigmoid(vals[kN + lane] * inv * scale[1] + base[kN + lane]);
  }
  constexpr int n2 = kN * kN;
  if constexpr (n2 <= 32) {
    float c = 0.0f;
    if (lane < n2) c = vals[2 * kN + lane] * inv * scale[2] + base[2 * kN + lane];
    c = SinkhornWarp<kN>(c, lane, d.sinkhorn_iters, d.hc_eps);
    if (lane < n2) comb[t * n2 + lane] = c;
  } else {
    if (lane != 0) return;
    float c[n2];
#pragma unroll
    for (int i = 0; i < n2; ++i) c[i] = vals[2 * kN + i] * inv * scale[2] + base[2 * kN + i];
    SinkhornSerial<kN>(c, d.sinkhorn_iters, d.hc_eps);
#pragma unroll
    for (int i = 0; i < n2; ++i) comb[t * n2 + i] = c[i];
  }
}

// The pre gates (HcPre: σ(mix scale + base) + eps; HcHead likewise with its own scale).
template <int kN>
__device__ __forceinline__ void PreGates(const float* vals, float inv, const float* base,
                                         const float* scale, float eps, float (&pre)[kN]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) pre[j] = Sigmoid(vals[j] * inv * scale[0] + base[j]) + eps;
}

// The RMS scale of the flattened streams from their summed squares (the mix's last value): one
// expression for every kernel that turns the mix into gates (the two-kernel path, the deferred
// Sinkhorn and the cluster launch), so they give the same bits.
template <int kN>
__device__ __forceinline__ float MixInverse(float sum_squares, const HcDims& d) {
  const int64_t nd = kN * d.dim;
  return 1.0f / sqrtf(sum_squares / static_cast<float>(nd) + d.norm_eps);
}

// Σ_j pre[j] · x(j): the streams' 4 columns x(j) collapsed with the gates (x: j -> float4).
template <int kN, class X>
__device__ __forceinline__ float4 CollapseWith(const float (&pre)[kN], X x_of) {
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const float4 x = x_of(j);
    acc.x += pre[j] * x.x;
    acc.y += pre[j] * x.y;
    acc.z += pre[j] * x.z;
    acc.w += pre[j] * x.w;
  }
  return acc;
}

// Σ_j pre[j] · f[j, i..i+3]: the streams collapsed with the gates at 4 columns.
template <int kN>
__device__ __forceinline__ float4 Collapse4(const float (&pre)[kN], const float* f, int64_t dim,
                                            int64_t i) {
  return CollapseWith<kN>(pre,
                          [&](int j) { return *reinterpret_cast<const float4*>(f + j * dim + i); });
}

// The start shared by the final kernels, for token t = blockIdx.x: the block's warps sum the mix
// values it needs (PartSum; the pre rows and Σ hs² (value kRows), or every value for the
// Sinkhorn block) into vals and apply the RMS scale. The Sinkhorn block (`sink`, HcPre only)
// then writes post and comb on warp 0, or with `gates` leaves vals there for HcGatesKernel, and
// this returns false (the block is done); any other block gets the pre gates. Every thread of
// the block must call it (one barrier).
template <int kN, bool kPre>
__device__ __forceinline__ bool FinalGates(const HcDims& d, const float* mix_parts,
                                           int64_t nparts, const float* base, const float* scale,
                                           bool sink, int warps, float* vals, float* post,
                                           float* comb, float* gates, float (&pre)[kN]) {
  constexpr int kRows = kPre ? (2 + kN) * kN : kN;
  constexpr int kVals = kRows + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.x;
  const int need = sink ? kVals : kN + 1;
  for (int q = warp; q < need; q += warps) {
    const int r = sink || q < kN ? q : kRows;
    const float s = PartSum(mix_parts, nparts, d.tokens, t, kVals, r, lane);
    if (lane == 0) vals[r] = s;
  }
  __syncthreads();
  const float inv = MixInverse<kN>(vals[kRows], d);
  if (sink) {
    if (gates != nullptr) {  // deferred to HcGatesKernel
      for (int r = threadIdx.x; r < kVals; r += blockDim.x) gates[t * kVals + r] = vals[r];
    } else if (warp == 0) {
      PostAndComb<kN>(vals, inv, base, scale, d, t, lane, post, comb);
    }
    return false;
  }
  PreGates<kN>(vals, inv, base, scale, d.hc_eps, pre);
  return true;
}

// Grid (T, col_blocks [+ 1]). Every block sums the parts it needs for its token (PartSum) and
// applies the RMS scale. Blocks y < col_blocks compute the pre gates and collapse 4·kFinThreads
// columns; for HcPre, block y = col_blocks computes post and runs the Sinkhorn on one warp, in
// parallel with the collapse. kPre: HcPre (rows (2+n)n, scale[3]); else HcHead (rows n, scale[1]).
constexpr int kFinThreads = 128;

template <int kN, bool kPre>
__global__ void __launch_bounds__(kFinThreads)
    HcFinalKernel(HcDims d, const float* hs, const float* mix_parts, int64_t nparts,
                  const float* base, const float* scale, int64_t col_blocks, bool vec, float* out,
                  float* post, float* comb) {
  PdlTrigger();
  PdlWait();
  constexpr int kRows = kPre ? (2 + kN) * kN : kN;
  constexpr int kVals = kRows + 1;  // the last one: Σ hs²
  __shared__ float vals[kVals];
  const int64_t t = blockIdx.x;
  const bool sink = kPre && blockIdx.y == col_blocks;
  float pre[kN];
  if (!FinalGates<kN, kPre>(d, mix_parts, nparts, base, scale, sink, kFinThreads / 32, vals, post,
                            comb, nullptr, pre)) {
    return;
  }
  const int64_t nd = kN * d.dim;
  // out[i] = Σ_j pre[j] · f[j, i], the streams collapsed with the gates, 4 columns per thread.
  const float* f = hs + t * nd;
  float* o = out + t * d.dim;
  const int64_t i = (static_cast<int64_t>(blockIdx.y) * kFinThreads + threadIdx.x) * 4;
  if (i >= d.dim) return;
  if (vec) {
    *reinterpret_cast<float4*>(o + i) = Collapse4<kN>(pre, f, d.dim, i);
  } else {
    for (int64_t e = i; e < std::min<int64_t>(i + 4, d.dim); ++e) {
      float acc = 0;
#pragma unroll
      for (int j = 0; j < kN; ++j) acc += pre[j] * f[j * d.dim + e];
      o[e] = acc;
    }
  }
}

// The end of the final-norm kernels for token t: thread i collapses float4 i of the row with the
// pre gates (Collapse4), the block normalises it (RmsNormalize4: BlockSumD's tree over the
// block) and writes normed[t]. Every thread of the block calls it.
template <int kN>
__device__ __forceinline__ void CollapseNormRow(const HcDims& d, const float* hs,
                                                const float (&pre)[kN], int64_t t,
                                                const float* norm_w, float rms_eps,
                                                double* scratch, float* normed) {
  const int64_t nd = kN * d.dim;
  const int i = threadIdx.x;
  const int n4 = static_cast<int>(d.dim >> 2);
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 wv = make_float4(1.f, 1.f, 1.f, 1.f);
  if (i < n4) {
    a = Collapse4<kN>(pre, hs + t * nd, d.dim, int64_t{i} * 4);
    if (norm_w != nullptr) wv = reinterpret_cast<const float4*>(norm_w)[i];
  }
  const float4 o = RmsNormalize4(a, wv, norm_w != nullptr, static_cast<int>(d.dim), rms_eps,
                                 scratch);
  if (i < n4) reinterpret_cast<float4*>(normed + t * d.dim)[i] = o;
}

// HcFinalKernel and the RMSNorm that follows it, one block per token: thread i collapses float4
// i of the row (Collapse4), the block sums its squares in double exactly as RmsNormRegKernel
// (same block shape, same BlockSumD tree) and writes the normalised row. For HcPre a second
// block per token (blockIdx.y = 1) computes post and comb on one warp at the same time (the
// Sinkhorn is a serial chain of shuffles, as long as the rest). Bit-identical to HcPre / HcHead
// followed by RmsNorm. Needs D % 4 == 0, D <= 4096 and 16-byte aligned hs, normed, norm_w
// (HcNormFits).
template <int kN, bool kPre>
__global__ void __launch_bounds__(1024)
    HcFinalNormKernel(HcDims d, const float* hs, const float* mix_parts, int64_t nparts,
                      const float* base, const float* scale, const float* norm_w, float rms_eps,
                      float* normed, float* post, float* comb, float* gates) {
  PdlTrigger();
  PdlWait();
  constexpr int kRows = kPre ? (2 + kN) * kN : kN;
  constexpr int kVals = kRows + 1;
  __shared__ float vals[kVals];
  __shared__ double scratch[32];
  const int warps = blockDim.x >> 5;
  const int64_t t = blockIdx.x;
  const bool sink = kPre && blockIdx.y == 1;
  float pre[kN];
  if (!FinalGates<kN, kPre>(d, mix_parts, nparts, base, scale, sink, warps, vals, post, comb,
                            gates, pre)) {
    return;
  }
  CollapseNormRow<kN>(d, hs, pre, t, norm_w, rms_eps, scratch, normed);
}

// HcFinalNormKernel<kN, true> for the deferred form (gates), one block per token instead of two:
// HcFinalNormKernel's second block per token (blockIdx.y = 1) only sums the mix values for the
// Sinkhorn and writes them to gates, yet holds an SM's worth of threads as long as the first,
// and the Sinkhorn's code takes the kernel to 53 registers (one 1024-thread block an SM). Here
// the block sums every value (the same PartSums, its warps in parallel: no longer than the five
// the collapse needs), writes them to gates and goes on to the collapse and norm; without the
// Sinkhorn it fits 32 registers, two blocks an SM, whose phases interleave (at 8k tokens, n = 4,
// D = 4096 on the H200: 0.20 ms against 0.42, HBM ~0.14). The same operations on the same
// values, so the same bits.
template <int kN>
__global__ void __launch_bounds__(1024, 2)
    HcFinalNormGatesKernel(HcDims d, const float* hs, const float* mix_parts, int64_t nparts,
                           const float* base, const float* scale, const float* norm_w,
                           float rms_eps, float* normed, float* gates) {
  PdlTrigger();
  PdlWait();
  constexpr int kRows = (2 + kN) * kN;
  constexpr int kVals = kRows + 1;
  __shared__ float vals[kVals];
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t t = blockIdx.x;
  for (int q = warp; q < kVals; q += warps) {
    const float s = PartSum(mix_parts, nparts, d.tokens, t, kVals, q, lane);
    if (lane == 0) vals[q] = s;
  }
  __syncthreads();
  const float inv_mix = MixInverse<kN>(vals[kRows], d);
  for (int r = threadIdx.x; r < kVals; r += blockDim.x) gates[t * kVals + r] = vals[r];
  float pre[kN];
  PreGates<kN>(vals, inv_mix, base, scale, d.hc_eps, pre);
  CollapseNormRow<kN>(d, hs, pre, t, norm_w, rms_eps, scratch, normed);
}

// post and comb of token t = blockIdx.x from the summed mix values a final kernel left in gates
// [T, (2+n)n + 1] (HcPreNorm's deferred form): FinalGates' scale and PostAndComb on one warp,
// the same operations on the same values, so the same bits.
template <int kN>
__global__ void __launch_bounds__(32)
    HcGatesKernel(HcDims d, const float* gates, const float* base, const float* scale,
                  float* post, float* comb) {
  PdlTrigger();
  PdlWait();
  constexpr int kRows = (2 + kN) * kN;
  const int64_t t = blockIdx.x;
  const float* vals = gates + t * (kRows + 1);
  const float inv = MixInverse<kN>(vals[kRows], d);
  PostAndComb<kN>(vals, inv, base, scale, d, t, static_cast<int>(threadIdx.x), post, comb);
}

// ---- a whole boundary in one launch: one thread-block cluster per token ----
//
// The mix (with the previous HcPost fused in, kPostN = n), the gates, the collapse and the RMS
// norm of MixKernel + HcFinalNormKernel without the partial sums' round trip through global
// memory or the second launch. Token t (blockIdx.y) is a cluster of C = D / kMixChunk blocks
// (C <= 8); block `rank` covers columns [rank·512, (rank+1)·512) of every stream: its warp
// (j, q) is warp q of MixKernel's block for chunk j·C + rank, so each chunk's sums are MixKernel's
// bits. Barrier A: every block's chunk sums are in its shared memory, where the others read them
// in PartSum's order (lane p: chunk p), and every block has read post and comb (the Sinkhorn
// warp may then overwrite them in place). Warps j = 0 collapse the block's columns from the
// streams kept in shared memory and sum their squares as HcFinalNormKernel's warps 4·rank + q;
// barrier B: those warp sums are read across the cluster in BlockSumD's order. So the outputs
// equal the two-kernel path bit for bit (CudaOps.HyperConnectionBoundariesEqualTheOpsOneByOne).
// kRows = (2 + n)n: HcPre (the Sinkhorn on the last warp of block 1, or of block 0 when C = 1);
// kRows = n: HcHead. n = 4 (DeepSeek-V4's hc_mult): 512 threads, a lane's 24 fn vectors in
// registers, loaded before the PDL wait as in MixKernel.
namespace cg = cooperative_groups;
constexpr int kClusterN = 4;
constexpr int kClusterThreads = kClusterN * kMixThreads;
constexpr int kClusterWarps = kClusterThreads / 32;
constexpr int64_t kClusterMaxTokens = 16;  // more: the fn rows would be re-read from L2 per token
constexpr int kClusterMaxBlocks = 8;       // portable cluster size

template <int kRows, int kPostN>
__global__ void __launch_bounds__(kClusterThreads, 1)
    HcClusterKernel(HcDims d, const float* hs, const float* fn, PostArgs pa, const float* base,
                    const float* scale, const float* norm_w, float rms_eps, float* normed,
                    float* post, float* comb, float* gates) {
  constexpr int kN = kClusterN;
  constexpr bool kPre = kRows == (2 + kN) * kN;
  static_assert(kPre || kRows == kN, "HcPre or HcHead rows");
  static_assert(kPostN == 0 || kPostN == kN, "HcPost of the same streams");
  constexpr int kVals = kRows + 1;
  constexpr int kV = Pow2Ceil(kVals);
  PdlTrigger();
  const cg::cluster_group cluster = cg::this_cluster();
  const int csize = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  __shared__ float red[kN][kMixWarps][kV];
  __shared__ float part[kN][kVals];  // chunk j·C + rank's sums
  __shared__ float4 xs[kN][kMixThreads];
  __shared__ float vals[kVals];
  __shared__ double wsum[kMixWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = warp / kMixWarps, q = warp % kMixWarps;
  const int c4 = q * 32 + lane;  // the thread's float4 within the block's columns
  const int64_t t = blockIdx.y;
  const int64_t nd = kN * d.dim;
  const int64_t i = int64_t{rank} * kMixChunk + c4 * 4;  // column within a stream
  const int64_t k = j * d.dim + i;                       // flattened column
  float4 w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w[r] = *reinterpret_cast<const float4*>(fn + r * nd + k);
  PdlWait();
  float4 x;
  if constexpr (kPostN == 0) {
    x = *reinterpret_cast<const float4*>(hs + t * nd + k);
  } else {
    float4 in[kN];
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      in[s] = *reinterpret_cast<const float4*>(pa.hs + (t * kN + s) * d.dim + i);
    }
    const float4 ft = *reinterpret_cast<const float4*>(pa.f + t * d.dim + i);
    x = PostCombine<kN>(pa.post[t * kN + j], ft, in, pa.comb + t * kN * kN, j);
    *reinterpret_cast<float4*>(pa.out + t * nd + k) = x;
  }
  xs[j][c4] = x;
  {
    int idx;
    float s;
    if (WarpMix<kRows>(w, x, lane, &idx, &s)) red[j][q][idx] = s;
  }
  __syncthreads();
  if (threadIdx.x < kN * kVals) {
    const int s = threadIdx.x / kVals, r = threadIdx.x % kVals;
    float a = red[s][0][r];
#pragma unroll
    for (int u = 1; u < kMixWarps; ++u) a += red[s][u][r];
    part[s][r] = a;
  }
  cluster.sync();  // A
  const bool sink = kPre && rank == (csize > 1 ? 1 : 0);
  const int nparts = kN * csize;
  const int need = sink ? kVals : kN + 1;
  for (int u = warp; u < need; u += kClusterWarps) {
    const int r = sink || u < kN ? u : kRows;
    float s = 0.0f;
    if (lane < nparts) s += *cluster.map_shared_rank(&part[lane / csize][r], lane % csize);
    s = WarpSum(s);
    if (lane == 0) vals[r] = s;
  }
  __syncthreads();
  const float inv_mix = MixInverse<kN>(vals[kRows], d);
  if (sink && gates != nullptr) {  // deferred to HcGatesKernel
    if (threadIdx.x < kVals) gates[t * kVals + threadIdx.x] = vals[threadIdx.x];
  } else if (sink && warp == kClusterWarps - 1) {
    PostAndComb<kN>(vals, inv_mix, base, scale, d, t, lane, post, comb);
  }
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (j == 0) {
    float pre[kN];
    PreGates<kN>(vals, inv_mix, base, scale, d.hc_eps, pre);
    a = CollapseWith<kN>(pre, [&](int s) { return xs[s][c4]; });
    const double sq = WarpSumD(SumSquares4D(a));
    if (lane == 0) wsum[q] = sq;
  }
  cluster.sync();  // B
  double total = 0.0;
  if (j == 0) {
    const int nw = kMixWarps * csize;  // HcFinalNormKernel's warps
    if (lane < nw) total = *cluster.map_shared_rank(&wsum[lane % kMixWarps], lane / kMixWarps);
    total = WarpSumD(total);
  }
  // No block may leave while another still reads its shared memory.
  auto arrived = cluster.barrier_arrive();
  if (j == 0) {
    float4 wv = make_float4(1.f, 1.f, 1.f, 1.f);
    if (norm_w != nullptr) wv = reinterpret_cast<const float4*>(norm_w + i)[0];
    const float inv = RmsInverse(total, static_cast<int>(d.dim), rms_eps);
    *reinterpret_cast<float4*>(normed + t * d.dim + i) = RmsApply4(a, wv, norm_w != nullptr, inv);
  }
  cluster.barrier_wait(std::move(arrived));
}

// out[t, k] = post[t, k] f[t] + Σ_j comb[t, j, k] hs[t, j], 4 columns of all n outputs per thread
// (each hs / f vector is loaded once, every store is 16 bytes). Grid (T, ceil(D / 4 / threads)).
template <int kN>
__global__ void __launch_bounds__(kFinThreads)
    HcPostVecKernel(int64_t dim, const float* hs, const float* f, const float* post,
                    const float* comb, float* out) {
  PdlTrigger();
  PdlWait();
  const int64_t t = blockIdx.x;
  const int64_t i = (static_cast<int64_t>(blockIdx.y) * kFinThreads + threadIdx.x) * 4;
  if (i >= dim) return;
  const float* h = hs + t * kN * dim;
  const float* c = comb + t * kN * kN;
  float4 x[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) x[j] = *reinterpret_cast<const float4*>(h + j * dim + i);
  const float4 ft = *reinterpret_cast<const float4*>(f + t * dim + i);
  float* o = out + t * kN * dim;
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    *reinterpret_cast<float4*>(o + k * dim + i) = PostCombine<kN>(post[t * kN + k], ft, x, c, k);
  }
}

// Scalar fallback for D % 4 != 0 or unaligned pointers.
__global__ void HcPostKernel(HcDims d, const float* hs, const float* f, const float* post,
                             const float* comb, float* out) {
  PdlTrigger();
  PdlWait();
  const int64_t t = blockIdx.y;
  const int n = static_cast<int>(d.n);
  const float* h = hs + t * n * d.dim;
  const float* c = comb + t * n * n;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n * d.dim;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int k = static_cast<int>(idx / d.dim);
    const int64_t i = idx % d.dim;
    float acc = post[t * n + k] * f[t * d.dim + i];
    for (int j = 0; j < n; ++j) acc += c[j * n + k] * h[j * d.dim + i];
    out[t * n * d.dim + idx] = acc;
  }
}

// Launches HcFinalKernel<N, kPre> for the runtime n.
template <bool kPre>
cudaError_t LaunchFinal(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                        const float* base, const float* scale, float* out, float* post,
                        float* comb, cudaStream_t stream) {
  const int64_t col_blocks = (d.dim + 4 * kFinThreads - 1) / (4 * kFinThreads);
  const bool vec = d.dim % 4 == 0 && Aligned16(hs) && Aligned16(out);
  const dim3 grid(static_cast<unsigned>(d.tokens), static_cast<unsigned>(col_blocks + (kPre ? 1 : 0)));
  cudaError_t err = cudaErrorInvalidValue;  // n outside [1, 8]
  switch (d.n) {
#define DSV4_HC_FINAL(N)                                                                   \
  case N:                                                                                  \
    err = LaunchPdl(HcFinalKernel<N, kPre>, grid, dim3(kFinThreads), 0, stream, d, hs,    \
                    mix_parts, parts, base, scale, col_blocks, vec, out, post, comb);        \
    break;
    DSV4_HC_FINAL(1)
    DSV4_HC_FINAL(2)
    DSV4_HC_FINAL(3)
    DSV4_HC_FINAL(4)
    DSV4_HC_FINAL(5)
    DSV4_HC_FINAL(6)
    DSV4_HC_FINAL(7)
    DSV4_HC_FINAL(8)
#undef DSV4_HC_FINAL
  }
  return err;
}

}  // namespace

int64_t HcMixParts(int64_t tokens, int64_t nd) {
  (void)tokens;
  return std::max<int64_t>((nd + kMixChunk - 1) / kMixChunk, 1);
}

namespace {

// MixKernel<kRows, kPostN> over (chunks, token groups). Tokens per block: one while that leaves
// fewer than ~512 blocks (decode: every block streams only its fn chunk), more for longer
// batches so the fn chunk (48 KB per block) is not re-read from L2 for every token or two; at
// most 64 tokens so the serial token loop stays short. Depends on the shape only (graph capture).
template <int kRows, int kPostN>
cudaError_t LaunchMix(const float* hs, int64_t tokens, int64_t nd, const float* fn, bool vec,
                      const PostArgs& pa, float* parts, cudaStream_t stream) {
  const int64_t chunks = HcMixParts(tokens, nd);
  const int64_t tpb = std::clamp<int64_t>(tokens * chunks / 512, 1, 64);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>((tokens + tpb - 1) / tpb));
  return LaunchPdl(MixKernel<kRows, kPostN>, grid, dim3(kMixThreads), 0, stream, hs, tokens, nd,
                   fn, tpb, vec, pa, parts);
}

// The staged mix's launch shape, by the work W = tokens × column blocks (token-chunks; column
// blocks: nd / 512, with HcPost D / 512), as measured on the H200 at D = 4096 and 1024 (64 to 8k
// tokens): tokens per block ~W / target (blocks ~target: 512 of the 128-thread 24-row blocks,
// ~one wave of the 512-thread HcPost blocks, 2048 of the light 4-row ones), a whole number of
// stages, at most max_tpb (each block loads its fn vectors once: 48 KB a chunk at 24 rows, so
// longer groups cost less L2 traffic); the staged kernel from min_work on, where it was faster
// than MixKernel (below it MixKernel's smaller blocks spread further; both give the same bits).
struct MixStagedShape {
  int64_t target, max_tpb, min_work;
};
constexpr MixStagedShape MixStagedShapeOf(int rows, int post_n) {
  return post_n > 0 ? MixStagedShape{128, 256, 512}
                    : rows > 4 ? MixStagedShape{512, 128, 4096} : MixStagedShape{2048, 16, 8192};
}

// Whether MixStagedKernel<kRows, kPostN> covers the shape: whole 512-column chunks (of each
// stream with HcPost, `cols` = D; else nd), aligned (vec), enough work.
template <int kRows, int kPostN>
bool MixStagedFits(int64_t tokens, int64_t cols, bool vec) {
  return vec && cols % kMixChunk == 0 &&
         tokens * (cols / kMixChunk) >= MixStagedShapeOf(kRows, kPostN).min_work;
}

// MixStagedKernel<kRows, kPostN> over (column blocks, token groups) as MixStagedShapeOf says.
// Depends on the shape only (graph capture). The dynamic shared memory is a constant of the
// instantiation (the attribute, set before every launch, never shrinks under a captured graph).
template <int kRows, int kPostN>
absl::Status LaunchMixStaged(const float* hs, int64_t tokens, int64_t nd, const float* fn,
                             const PostArgs& pa, float* parts, cudaStream_t stream) {
  constexpr MixStagedShape kShape = MixStagedShapeOf(kRows, kPostN);
  const int64_t col_blocks = (kPostN > 0 ? pa.dim : nd) / kMixChunk;
  int64_t tpb = (tokens * col_blocks + kShape.target - 1) / kShape.target;
  tpb = std::clamp<int64_t>((tpb + kMixStageTokens - 1) / kMixStageTokens * kMixStageTokens,
                            kMixStageTokens, kShape.max_tpb);
  constexpr size_t kSmem = MixStagedSmem<kRows, kPostN>();
  auto kernel = MixStagedKernel<kRows, kPostN>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kSmem)));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>((tokens + tpb - 1) / tpb));
  CUDA_RETURN_IF_ERROR(LaunchPdl(kernel, grid, dim3(kMixThreads * MixGroups(kPostN)), kSmem,
                                 stream, hs, tokens, nd, fn, tpb, pa, parts));
  return absl::OkStatus();
}

}  // namespace

absl::Status HcMix(const float* hs, int64_t tokens, int64_t nd, const float* fn, int64_t rows,
                   float* parts, cudaStream_t stream, bool staged) {
  if (tokens == 0) return absl::OkStatus();
  if (rows < 1 || rows > kMaxMix) return absl::InvalidArgumentError("HcMix: bad row count");
  const bool vec = nd % 4 == 0 && Aligned16(hs) && Aligned16(fn);
  if (staged && rows == 24 && MixStagedFits<24, 0>(tokens, nd, vec)) {
    RETURN_IF_ERROR((LaunchMixStaged<24, 0>(hs, tokens, nd, fn, PostArgs{}, parts, stream)));
  } else if (staged && rows == 4 && MixStagedFits<4, 0>(tokens, nd, vec)) {
    RETURN_IF_ERROR((LaunchMixStaged<4, 0>(hs, tokens, nd, fn, PostArgs{}, parts, stream)));
  } else if (rows == 24) {
    CUDA_RETURN_IF_ERROR((LaunchMix<24, 0>(hs, tokens, nd, fn, vec, PostArgs{}, parts, stream)));
  } else if (rows == 4) {
    CUDA_RETURN_IF_ERROR((LaunchMix<4, 0>(hs, tokens, nd, fn, vec, PostArgs{}, parts, stream)));
  } else {
    const int64_t chunks = HcMixParts(tokens, nd);
    const int64_t warps = (rows + 1) * chunks;
    CUDA_RETURN_IF_ERROR(LaunchPdl(
        MixGenericKernel, dim3(static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads)),
        dim3(kThreads), 0, stream, hs, tokens, nd, fn, static_cast<int>(rows), parts));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

namespace {
// Whether [a, a + na) and [b, b + nb) (floats) share memory.
bool Overlap(const float* a, int64_t na, const float* b, int64_t nb) {
  return a < b + nb && b < a + na;
}
}  // namespace

bool HcPostMixFits(const HcDims& d, int64_t rows, const float* hs, const float* f,
                   const float* out, const float* fn) {
  // The fused kernel reads every stream of hs and f while other blocks write out: out must not
  // overlap either (the unfused HcPost only needs out != hs).
  const int64_t streams = d.tokens * d.n * d.dim;
  return d.n == 4 && rows == 24 && d.dim % 4 == 0 && Aligned16(hs) && Aligned16(f) &&
         Aligned16(out) && Aligned16(fn) && !Overlap(out, streams, hs, streams) &&
         !Overlap(out, streams, f, d.tokens * d.dim);
}

absl::Status HcPostMix(const HcDims& d, const float* hs, const float* f, const float* post,
                       const float* comb, float* out, const float* fn, int64_t rows, float* parts,
                       cudaStream_t stream, bool staged) {
  if (!HcPostMixFits(d, rows, hs, f, out, fn)) {
    return absl::InvalidArgumentError(
        "HcPostMix: needs hc_mult 4, 24 mix rows, D % 4 == 0 and 16-byte aligned operands");
  }
  if (d.tokens == 0) return absl::OkStatus();
  const PostArgs pa = PostArgsOf(HcPostIn{hs, f, post, comb}, d.dim, out);
  if (staged && MixStagedFits<24, 4>(d.tokens, d.dim, /*vec=*/true)) {
    RETURN_IF_ERROR(
        (LaunchMixStaged<24, 4>(out, d.tokens, d.n * d.dim, fn, pa, parts, stream)));
  } else {
    CUDA_RETURN_IF_ERROR(
        (LaunchMix<24, 4>(out, d.tokens, d.n * d.dim, fn, /*vec=*/true, pa, parts, stream)));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool HcNormFits(const HcDims& d, const float* hs, const float* normed, const float* norm_w) {
  return d.n >= 1 && d.n <= kMaxN && d.dim > 0 && d.dim % 4 == 0 && d.dim <= 4096 &&
         Aligned16(hs) && Aligned16(normed) && Aligned16(norm_w);
}

namespace {

// From this many tokens HcPreNorm's deferred form takes HcFinalNormGatesKernel (measured: fewer
// ran as fast or a little faster in HcFinalNormKernel's two blocks per token; same bits).
constexpr int64_t kFinalGatesMinTokens = 64;

// HcFinalNormGatesKernel<N> for the runtime n: one block per token, as HcFinalNormKernel's.
absl::Status LaunchFinalNormGates(const HcDims& d, const float* hs, const float* mix_parts,
                                  int64_t parts, const float* base, const float* scale,
                                  const float* norm_w, float rms_eps, float* normed, float* gates,
                                  cudaStream_t stream) {
  const int threads = static_cast<int>(((d.dim / 4) + 31) / 32 * 32);
  cudaError_t err = cudaErrorInvalidValue;  // n outside [1, 8] (HcNormFits)
  switch (d.n) {
#define DSV4_HC_FINAL_GATES(N)                                                                  \
  case N:                                                                                       \
    err = LaunchPdl(HcFinalNormGatesKernel<N>, dim3(static_cast<unsigned>(d.tokens)),           \
                    dim3(threads), 0, stream, d, hs, mix_parts, parts, base, scale, norm_w,     \
                    rms_eps, normed, gates);                                                    \
    break;
    DSV4_HC_FINAL_GATES(1)
    DSV4_HC_FINAL_GATES(2)
    DSV4_HC_FINAL_GATES(3)
    DSV4_HC_FINAL_GATES(4)
    DSV4_HC_FINAL_GATES(5)
    DSV4_HC_FINAL_GATES(6)
    DSV4_HC_FINAL_GATES(7)
    DSV4_HC_FINAL_GATES(8)
#undef DSV4_HC_FINAL_GATES
  }
  CUDA_RETURN_IF_ERROR(err);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <bool kPre>
absl::Status LaunchFinalNorm(const HcDims& d, const float* hs, const float* mix_parts,
                             int64_t parts, const float* base, const float* scale,
                             const float* norm_w, float rms_eps, float* normed, float* post,
                             float* comb, float* gates, bool staged, cudaStream_t stream) {
  if (!HcNormFits(d, hs, normed, norm_w)) {
    return absl::InvalidArgumentError(
        "HcPreNorm/HcHeadNorm: needs hc_mult in [1, 8], D % 4 == 0, D <= 4096 and 16-byte "
        "aligned hs, output and norm weight");
  }
  if (kPre && gates == nullptr && (post == nullptr || comb == nullptr)) {
    return absl::InvalidArgumentError("HcPreNorm: needs gates, or post and comb");
  }
  if (d.tokens == 0) return absl::OkStatus();
  if (kPre && staged && gates != nullptr && d.tokens >= kFinalGatesMinTokens) {
    return LaunchFinalNormGates(d, hs, mix_parts, parts, base, scale, norm_w, rms_eps, normed,
                                gates, stream);
  }
  const int threads = static_cast<int>(((d.dim / 4) + 31) / 32 * 32);
  cudaError_t err = cudaErrorInvalidValue;  // n outside [1, 8] (HcNormFits)
  switch (d.n) {
#define DSV4_HC_FINAL_NORM(N)                                                            \
  case N:                                                                                \
    err = LaunchPdl(HcFinalNormKernel<N, kPre>,                                          \
                    dim3(static_cast<unsigned>(d.tokens), kPre ? 2 : 1), dim3(threads), 0,  \
                    stream, d, hs, mix_parts, parts, base, scale, norm_w, rms_eps, normed,  \
                    post, comb, gates);                                                     \
    break;
    DSV4_HC_FINAL_NORM(1)
    DSV4_HC_FINAL_NORM(2)
    DSV4_HC_FINAL_NORM(3)
    DSV4_HC_FINAL_NORM(4)
    DSV4_HC_FINAL_NORM(5)
    DSV4_HC_FINAL_NORM(6)
    DSV4_HC_FINAL_NORM(7)
    DSV4_HC_FINAL_NORM(8)
#undef DSV4_HC_FINAL_NORM
  }
  CUDA_RETURN_IF_ERROR(err);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status HcPreNorm(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                       const float* base, const float* scale, const float* norm_w, float rms_eps,
                       float* normed, float* post, float* comb, float* gates,
                       cudaStream_t stream, bool staged) {
  return LaunchFinalNorm<true>(d, hs, mix_parts, parts, base, scale, norm_w, rms_eps, normed,
                               post, comb, gates, staged, stream);
}

int64_t HcGateValues(int64_t n) { return (2 + n) * n + 1; }

absl::Status HcGates(const HcDims& d, const float* gates, const float* base, const float* scale,
                     float* post, float* comb, cudaStream_t stream) {
  if (d.tokens == 0) return absl::OkStatus();
  cudaError_t err = cudaErrorInvalidValue;  // n outside [1, 8]
  switch (d.n) {
#define DSV4_HC_GATES(N)                                                                      \
  case N:                                                                                     \
    err = LaunchPdl(HcGatesKernel<N>, dim3(static_cast<unsigned>(d.tokens)), dim3(32), 0, stream, \
                    d, gates, base, scale, post, comb);                                       \
    break;
    DSV4_HC_GATES(1)
    DSV4_HC_GATES(2)
    DSV4_HC_GATES(3)
    DSV4_HC_GATES(4)
    DSV4_HC_GATES(5)
    DSV4_HC_GATES(6)
    DSV4_HC_GATES(7)
    DSV4_HC_GATES(8)
#undef DSV4_HC_GATES
  }
  CUDA_RETURN_IF_ERROR(err);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcHeadNorm(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                        const float* base, const float* scale, const float* norm_w,
                        float rms_eps, float* y, cudaStream_t stream) {
  return LaunchFinalNorm<false>(d, hs, mix_parts, parts, base, scale, norm_w, rms_eps, y,
                                nullptr, nullptr, nullptr, /*staged=*/false, stream);
}

absl::Status HcPre(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                   const float* base,
                   const float* scale, float* collapsed, float* post, float* comb,
                   cudaStream_t stream) {
  if (d.n < 1 || d.n > kMaxN) return absl::UnimplementedError("hc_mult must be in [1, 8]");
  if (d.tokens == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      (LaunchFinal<true>(d, hs, mix_parts, parts, base, scale, collapsed, post, comb, stream)));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcPost(const HcDims& d, const float* hs, const float* f, const float* post,
                    const float* comb, float* out, cudaStream_t stream) {
  if (d.tokens == 0) return absl::OkStatus();
  if (d.dim % 4 == 0 && d.n >= 1 && d.n <= kMaxN && Aligned16(hs) && Aligned16(f) &&
      Aligned16(out)) {
    const dim3 grid(static_cast<unsigned>(d.tokens),
                    static_cast<unsigned>((d.dim + 4 * kFinThreads - 1) / (4 * kFinThreads)));
    cudaError_t err = cudaSuccess;  // (the test above keeps n in [1, 8])
    switch (d.n) {
#define DSV4_HC_POST(N)                                                                      \
  case N:                                                                                    \
    err = LaunchPdl(HcPostVecKernel<N>, grid, dim3(kFinThreads), 0, stream, d.dim, hs, f, post, \
                    comb, out);                                                                \
    break;
      DSV4_HC_POST(1)
      DSV4_HC_POST(2)
      DSV4_HC_POST(3)
      DSV4_HC_POST(4)
      DSV4_HC_POST(5)
      DSV4_HC_POST(6)
      DSV4_HC_POST(7)
      DSV4_HC_POST(8)
#undef DSV4_HC_POST
    }
    CUDA_RETURN_IF_ERROR(err);
  } else {
    const int64_t per_token = d.n * d.dim;
    const unsigned bx =
        static_cast<unsigned>(std::min<int64_t>((per_token + kThreads - 1) / kThreads, 64));
    CUDA_RETURN_IF_ERROR(LaunchPdl(HcPostKernel, dim3(bx, static_cast<unsigned>(d.tokens)),
                                   dim3(kThreads), 0, stream, d, hs, f, post, comb, out));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcHead(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                    const float* base,
                    const float* scale, float* y, cudaStream_t stream) {
  if (d.n < 1 || d.n > kMaxN) return absl::UnimplementedError("hc_mult must be in [1, 8]");
  if (d.tokens == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      (LaunchFinal<false>(d, hs, mix_parts, parts, base, scale, y, nullptr, nullptr, stream)));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool HcClusterFits(const HcDims& d, int64_t rows, const float* hs, const float* fn,
                   const float* normed, const float* norm_w) {
  const int64_t blocks = d.dim / kMixChunk;
  return d.n == kClusterN && (rows == (2 + kClusterN) * kClusterN || rows == kClusterN) &&
         d.tokens >= 1 && d.tokens <= kClusterMaxTokens && d.dim % kMixChunk == 0 && blocks >= 1 &&
         blocks <= kClusterMaxBlocks && Aligned16(hs) && Aligned16(fn) && Aligned16(normed) &&
         Aligned16(norm_w);
}

absl::Status HcClusterNorm(const HcDims& d, const HcPostIn* in, float* hs, const float* fn,
                           int64_t rows, const float* base, const float* scale, const float* norm_w,
                           float rms_eps, float* normed, float* post, float* comb, float* gates,
                           cudaStream_t stream) {
  if (!HcClusterFits(d, rows, hs, fn, normed, norm_w) ||
      (in != nullptr && !HcPostMixFits(d, rows, in->hs, in->f, hs, fn)) ||
      (in != nullptr && rows != (2 + kClusterN) * kClusterN)) {
    return absl::InvalidArgumentError("HcClusterNorm: shape or operands outside HcClusterFits");
  }
  if (rows == (2 + kClusterN) * kClusterN && gates == nullptr &&
      (post == nullptr || comb == nullptr)) {
    return absl::InvalidArgumentError("HcClusterNorm: needs gates, or post and comb");
  }
  const unsigned csize = static_cast<unsigned>(d.dim / kMixChunk);
  const dim3 grid(csize, static_cast<unsigned>(d.tokens));
  const dim3 block(kClusterThreads);
  PostArgs pa;
  cudaError_t err;
  if (in != nullptr) {
    pa = PostArgsOf(*in, d.dim, hs);
    err = LaunchPdlCluster(HcClusterKernel<24, 4>, grid, block, 0, stream, csize, d, hs, fn, pa,
                           base, scale, norm_w, rms_eps, normed, post, comb, gates);
  } else if (rows == 24) {
    err = LaunchPdlCluster(HcClusterKernel<24, 0>, grid, block, 0, stream, csize, d, hs, fn, pa,
                           base, scale, norm_w, rms_eps, normed, post, comb, gates);
  } else {
    err = LaunchPdlCluster(HcClusterKernel<4, 0>, grid, block, 0, stream, csize, d, hs, fn, pa,
                           base, scale, norm_w, rms_eps, normed, post, comb, gates);
  }
  CUDA_RETURN_IF_ERROR(err);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool HcClusterSchedulable() {
  // The largest instantiation (24 rows with HcPost: 512 threads of 128 registers, a whole SM)
  // in the largest cluster used (8 blocks).
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kClusterMaxBlocks, 1);
  cfg.blockDim = dim3(kClusterThreads);
  cudaLaunchAttribute attr = ClusterAttribute(kClusterMaxBlocks);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t err =
      cudaOccupancyMaxActiveClusters(&clusters, HcClusterKernel<24, 4>, &cfg);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return clusters >= 1;
}

}  // namespace dsv4::cuda
