// The routed-expert kernels shared by MoeExperts (moe.cu: bf16 and fp32 weights) and
// MoeExpertsQuant / MoeDecodeQuant (moe_quant.cu: MXFP4 and FP8 weights), whose FMA grouped GEMV
// is also SmallGemv's fallback (small_gemv.cu, one dense weight): the FMA grouped GEMV,
// the tensor-core expert kernels (8 assignments per weight load, and the wide kernel for experts
// with more), their launchers, and the assignment sort and combine (defined in moe.cu).
//
// The kernels are templated on a weight format policy: how a lane's 16-byte word of a weight row
// is loaded and turned into the operands the kernel multiplies (bf16 words for the tensor cores,
// fp32 values for the FMA kernel). The bf16 / fp32 policies are the code the kernels had before
// they were templated (the same instructions); the quantised ones load e2m1 nibbles or e4m3
// bytes with their scales and expand them in registers right before the products. MXFP4 has
// two tensor-core policies with the same values: Mxfp4Weights (two bf16 products per nibble
// pair; the wide kernel's) and Mxfp4FoldWeights (the 2^126 folded into the scale, one product
// and a second only for warps with a scale above 2^1; ExpertMmaKernel's when no wide pass runs
// and the single-token kernels', moe_quant.cu: 44.1 against 48.5 us at T = 1 on the H200).
//
// Included by three .cu files: the kernels and policies are in an unnamed namespace (each file
// instantiates its own; a __global__ template instantiated with external linkage in two whole-
// program CUDA translation units would be registered twice); the host API of moe.cu is not.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/quant_weights.h"

namespace dsv4::cuda {

// ---- The assignment sort and combine (moe.cu) ----

// The device workspace of MoeExperts / MoeExpertsQuant (MoeWorkspaceBytes bytes), laid out by
// MoeWorkspaceLayout.
struct MoeWorkspace {
  int32_t* keys_out;
  int32_t* order_in;
  int32_t* order;     // sorted position -> assignment index t * top_k + k
  int32_t* position;  // assignment -> sorted position (the FMA path's combine)
  int32_t* offsets;   // [E + 1]: first sorted assignment of each expert
  int32_t* active;    // experts with assignments, *num_active of them
  int32_t* num_active;
  int32_t* wide;      // experts with more than kMmaTokens assignments (the wide kernel's)
  int32_t* num_wide;
  float* gu;          // [A, 2I] fp32 (FMA path)
  float* h;           // [A, I] fp32 (FMA path) or bf16 (tensor-core path)
  float* y;           // [A, D] per-assignment expert outputs
  uint16_t* xb;       // [T, D] u in bf16 (the tiled path, moe_tiled.h)
  int32_t* tile_start;  // [E + 1] the tiled path's token-tile prefix
  void* sort_temp;
  size_t sort_bytes;
};
MoeWorkspace MoeWorkspaceLayout(const ExpertsDims& d, void* base);

// Sorts the assignments (t, k) by expert (stable: each expert's in (t, k) order) and lists the
// experts: w.order, w.offsets, w.active / w.num_active, and with `list_wide` w.wide / w.num_wide.
absl::Status SortAssignments(const ExpertsDims& d, const int32_t* idx, bool list_wide,
                             const MoeWorkspace& w, cudaStream_t stream);

// position[order[i]] = i for the d.tokens * d.top_k assignments.
absl::Status InvertOrder(const ExpertsDims& d, const MoeWorkspace& w, cudaStream_t stream);

// out[t] = Σ_k weights[t, k] · y[pos(t, k)], k in order (deterministic); pos the identity when
// `position` is null (y already in (t, k) order).
absl::Status CombineAssignments(const ExpertsDims& d, const float* y, const int32_t* position,
                                const float* weights, float* out, cudaStream_t stream);

namespace {

// The tensor-core expert kernels' group: the mma n, assignments per weight load (ExpertMmaKernel).
// Experts with more are ExpertMmaWideKernel's.
constexpr int kMmaTokens = 8;

// ---- FMA grouped GEMV ----
//
// y[a, :N] = W[e] · x[src(a)] for the sorted assignments a of expert e = active[blockIdx.y];
// rows [blockIdx.x * kRows, ...). Inputs staged in shared memory 8 assignments at a time, K in
// chunks; each warp owns kRows / warps rows. src(a) = order[a] / top_k (token) when
// `by_token`, else order position a itself (rows of `x` already in sorted order).
constexpr int kGroup = 8;
constexpr int kKChunk = 1024;
constexpr int kGemmThreads = 256;
constexpr int kWarps = kGemmThreads / 32;
constexpr int kMoeRowsPerWarp = 4;
constexpr int kGemvRowsPerWarp = 1;  // plain GEMV: more blocks for narrow outputs

// GroupedGemvKernel's weight formats: a lane's 16-byte word of a row holds kVec consecutive
// weights of it, which Dequant turns into fp32; kRoundX: x is rounded to bf16 when staged.
//   DenseRows<W>       fp32 or bf16 weights (bf16 sees x rounded to bf16, the GEMM convention)
//   Mxfp4Rows<kBf16>   32 e2m1 codes, one UE8M0 scale: exact values (W and x exact: fp32 mode);
//                      kBf16: values and x rounded to bf16 (the bf16 convention)
//   Fp8Rows<kBf16>     16 e4m3 bytes within one scale block: e4m3 x scale in fp32 (kBf16: then
//                      rounded to bf16, x too)
// Expert(weight, e, n_out, k_in) is expert e's weight ([n_out, k_in] each); Load its 16-byte word
// at (row, k) (k a multiple of kVec).
template <typename W>
struct DenseRows {
  using Matrix = const W*;
  using Expert = const W*;
  static constexpr int kVec = 16 / sizeof(W);
  static constexpr bool kRoundX = sizeof(W) == 2;
  __device__ __forceinline__ static Expert ExpertOf(Matrix w, int32_t e, int64_t n_out,
                                                    int64_t k_in) {
    return w + static_cast<int64_t>(e) * n_out * k_in;
  }
  __device__ __forceinline__ static uint4 Load(Expert we, int64_t row, int64_t k_in, int64_t k) {
    return *reinterpret_cast<const uint4*>(we + row * k_in + k);
  }
  __device__ __forceinline__ static void Dequant(Expert, int64_t, int64_t, int64_t,
                                                 const uint4& raw, float (&wv)[kVec]) {
    if constexpr (sizeof(W) == 2) {
      const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int v = 0; v < kVec / 2; ++v) {
        const float2 f = __bfloat1622float2(p2[v]);
        wv[2 * v] = f.x;
        wv[2 * v + 1] = f.y;
      }
    } else {
      const float* pf = reinterpret_cast<const float*>(&raw);
#pragma unroll
      for (int v = 0; v < kVec; ++v) wv[v] = pf[v];
    }
  }
};

__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

template <bool kBf16>
struct Mxfp4Rows {
  using Matrix = Mxfp4Matrix;
  struct Expert {
    Mxfp4Matrix m;
    int64_t row0;  // expert e's first row in the stacked matrix
  };
  static constexpr int kVec = 32;  // one scale group
  static constexpr bool kRoundX = kBf16;
  __device__ __forceinline__ static Expert ExpertOf(const Matrix& w, int32_t e, int64_t n_out,
                                                    int64_t) {
    return Expert{w, static_cast<int64_t>(e) * n_out};
  }
  __device__ __forceinline__ static uint4 Load(const Expert& we, int64_t row, int64_t k_in,
                                               int64_t k) {
    return *reinterpret_cast<const uint4*>(we.m.w + (we.row0 + row) * (k_in / 2) + k / 2);
  }
  __device__ __forceinline__ static void Dequant(const Expert& we, int64_t row, int64_t k_in,
                                                 int64_t k, const uint4& raw, float (&wv)[kVec]) {
    const float s = E8M0Value(we.m.scale[(we.row0 + row) * (k_in / 32) + k / 32]);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float f = E2M1Value((words[v / 8] >> (4 * (v % 8))) & 15u) * s;
      wv[v] = kBf16 ? RoundBf16(f) : f;
    }
  }
};

template <bool kBf16>
struct Fp8Rows {
  using Matrix = Fp8Matrix;
  struct Expert {
    Fp8Matrix m;
    int64_t row0;
  };
  static constexpr int kVec = 16;
  static constexpr bool kRoundX = kBf16;
  __device__ __forceinline__ static Expert ExpertOf(const Matrix& w, int32_t e, int64_t n_out,
                                                    int64_t) {
    return Expert{w, static_cast<int64_t>(e) * n_out};
  }
  __device__ __forceinline__ static uint4 Load(const Expert& we, int64_t row, int64_t k_in,
                                               int64_t k) {
    return *reinterpret_cast<const uint4*>(we.m.w + (we.row0 + row) * k_in + k);
  }
  // The 16 columns of a word lie in one scale block (block_cols % 16 == 0: MoeExpertsQuant).
  __device__ __forceinline__ static void Dequant(const Expert& we, int64_t row, int64_t, int64_t k,
                                                 const uint4& raw, float (&wv)[kVec]) {
    const float s = we.m.scale[we.m.ScaleIndex(we.row0 + row, k)];
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float f = E4M3Value(static_cast<uint8_t>(words[v / 4] >> (8 * (v % 4)))) * s;
      wv[v] = kBf16 ? RoundBf16(f) : f;
    }
  }
};

// With `active` null this is a plain small-M GEMV: one "expert" (weight itself) and rows
// [0, dense_rows) of x in order. bf16 weights see x rounded to bf16 (the GEMM convention).
template <class P, int kRowsPerWarp>
__global__ void __launch_bounds__(kGemmThreads) GroupedGemvKernel(
    const float* x, int64_t ldx, bool by_token, int64_t top_k, typename P::Matrix weight,
    int64_t n_out, int64_t k_in, const int32_t* order, const int32_t* offsets,
    const int32_t* active, const int32_t* num_active, int32_t dense_rows, float* y) {
  constexpr int kRows = kRowsPerWarp * kWarps;
  __shared__ __align__(16) float sx[kGroup][kKChunk];
  int32_t e = 0, a0 = 0, a1 = dense_rows;
  if (active != nullptr) {
    if (static_cast<int32_t>(blockIdx.y) >= *num_active) return;
    e = active[blockIdx.y];
    a0 = offsets[e];
    a1 = offsets[e + 1];
  }
  const typename P::Expert we = P::ExpertOf(weight, e, n_out, k_in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * kRows + warp * kRowsPerWarp;
  for (int32_t g = a0; g < a1; g += kGroup) {
    const int ng = a1 - g < kGroup ? a1 - g : kGroup;
    float acc[kRowsPerWarp][kGroup];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) acc[r][j] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < k_in; k0 += kKChunk) {
      const int kc = k_in - k0 < kKChunk ? static_cast<int>(k_in - k0) : kKChunk;
      __syncthreads();
      for (int i = threadIdx.x; i < ng * kc; i += kGemmThreads) {
        const int j = i / kc, c = i % kc;
        const int64_t src = by_token ? order[g + j] / top_k : g + j;
        const float v = x[src * ldx + k0 + c];
        sx[j][c] = P::kRoundX ? __bfloat162float(__float2bfloat16_rn(v)) : v;
      }
      __syncthreads();
      // 16-byte weight loads: kVec consecutive weights per lane, the warp's rows loaded together
      // so that several loads are in flight per lane.
      constexpr int kVec = P::kVec;
      // One row per warp (plain GEMV): unroll along K for loads in flight; the expert path already
      // has kRowsPerWarp of them and more would cost registers.
      constexpr int kUnroll = kRowsPerWarp >= 4 ? 1 : 4;
#pragma unroll kUnroll
      for (int c = lane * kVec; c < kc; c += 32 * kVec) {
        uint4 raw[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int64_t row = row_base + r;
          raw[r] = row < n_out ? P::Load(we, row, k_in, k0 + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          // (Rows past the end dequantise row 0's scales against their zero words: in bounds,
          // never stored.)
          const int64_t row = row_base + r;
          float wv[kVec];
          P::Dequant(we, row < n_out ? row : 0, k_in, k0 + c, raw[r], wv);
          // Only the group's real assignments (decode groups are mostly one or two), with
          // 16-byte shared-memory reads.
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            if (j < ng) {
              const float4* xs = reinterpret_cast<const float4*>(&sx[j][c]);
              float sum = 0.0f;
#pragma unroll
              for (int v4 = 0; v4 < kVec / 4; ++v4) {
                const float4 xv = xs[v4];
                sum += wv[4 * v4] * xv.x + wv[4 * v4 + 1] * xv.y + wv[4 * v4 + 2] * xv.z +
                       wv[4 * v4 + 3] * xv.w;
              }
              acc[r][j] += sum;
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row_base + r;
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (j < ng) {  // uniform across the warp
          const float v = WarpSum(acc[r][j]);
          if (lane == 0 && row < n_out) y[static_cast<int64_t>(g + j) * n_out + row] = v;
        }
      }
    }
  }
}

// ---- Tensor-core expert GEMV ----
//
// The FMA kernel above reads the staged activations from shared memory once per weight row and
// token, so at a few tokens per expert shared memory, not HBM, is the limit (the decode MoE at
// T=64/256), and with one row set per warp it has few loads in flight. For bf16 weights the
// products are exact in fp32 either way (x is rounded to bf16, as above), so the dot products can
// go to mma.sync.m16n8k16 (bf16 in, fp32 accumulate): the 8 tokens of a group are the n = 8
// columns, 16 weight rows the m rows, and the tensor cores make the token count nearly free.
// Only the accumulation order within a k step differs from the FMA kernel (as with cuBLASLt).
//
// Each warp owns one 16-row tile of W and streams its K range with 16-byte loads: a lane quad
// (lanes 4g..4g+3) reads 64 contiguous bytes of row g and of row g + 8 per 32-wide k block, and
// kMmaUnroll k blocks are loaded before any is used, i.e. 2 * kMmaUnroll 16-byte loads in flight
// per lane (8 KiB per warp at 8). The dot product does not care how k is permuted as long as A
// and B see the same permutation, so a lane's 16-byte load of 8 consecutive k (8q .. 8q+7 for
// quad lane q) feeds two m16n8k16 steps directly, with no shuffles:
//   step 0: A regs {row g: k 8q+0,1 | row g+8: 8q+0,1 | row g: 8q+2,3 | row g+8: 8q+2,3}
//   step 1: the same with 8q+4..7,
// which is the PTX fragment layout (a0a1: row g, logical k 2q,2q+1; a2a3: row g+8; a4a5: row g,
// logical k 2q+8,2q+9; a6a7: row g+8) under the map logical 2q,2q+1,2q+8,2q+9 -> physical
// 8q+0..3 (step 0) / 8q+4..7 (step 1). The B fragment (b0b1: logical k 2q,2q+1 of token g, b2b3:
// 2q+8,2q+9) is then the 16-byte word of token g at physical k 8q..8q+7 of that k block.
//
// The activations of the group (8 tokens, the whole K, bf16) are staged in shared memory once
// per group in that fragment order, [k block][token][32 k], so lane l of a warp reads the 16
// bytes at (k block * 32 + l) * 16: conflict-free, one 16-byte shared load per 32 k per warp.
// K in full, not in chunks: no __syncthreads inside the K loop, so the weight stream of a warp
// never drains at a chunk boundary (16 KiB of shared memory per 1024 of K: 64 KiB at 4096).
//
// kSwiGlu (the gate_up projection): a tile's rows are gate rows c..c+7 (A rows 0..7) and up rows
// I+c..I+c+7 (A rows 8..15), so each lane ends with gate and up of the same (column, token) in
// its accumulators (c0/c2 for token 2q, c1/c3 for 2q+1) and applies the clamped SwiGLU of
// SwiGluKernel in registers, writing h rounded to bf16 (exactly what the down projection's
// staging rounded it to before), [assignment, I]. Otherwise rows r..r+15 and y fp32.
//
// kSplitK > 1 splits K over kSplitK warps of a block on the same tile (SmallGemv: few tiles, so
// more warps per tile for loads in flight); their partial sums meet in shared memory and are
// added in warp order: deterministic.
//
// Quantised weights (the formats below) keep this layout with a wider k block: a lane's 16-byte
// word holds more k (MXFP4 32, FP8 16), becomes kWords bf16 words of 8 k (two mma steps each)
// in registers, and the staged activations hold kWords words per lane per k block in the pairing
// the expansion produces. Staged word (v, j, q) of "virtual" k block v = kb * kWords + t is
// still at v * 32 + 4 j + q, so the staging and its shared-memory size per K are unchanged.
constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kMmaKBlock = 32;   // k per lane-quad 16-byte load: two m16n8k16 steps
constexpr int kMmaUnroll = 8;    // k blocks loaded before use: 2 * 8 16-byte loads per lane
constexpr int kStageUnroll = 4;  // staging loads in flight per thread
// kSplitK for the MoE: 1, 2 or 4 by the size of the expert grid (MoeSplitK).
// Largest staged x (8 tokens x K bf16) the launchers accept: K <= 12800.
constexpr size_t kMmaMaxSmemBytes = 200 * 1024;

__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 8 consecutive activations as 8 bf16 (round to nearest even, as __float2bfloat16_rn above).
__device__ __forceinline__ uint4 LoadBf16x8(const float* p) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  return make_uint4(PackBf16x2(a.x, a.y), PackBf16x2(a.z, a.w), PackBf16x2(b.x, b.y),
                    PackBf16x2(b.z, b.w));
}
__device__ __forceinline__ uint4 LoadBf16x8(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// The same 8 activations paired (0, 4), (1, 5), (2, 6), (3, 7): the pairing of the MXFP4
// expansion (Mxfp4Bf16x8).
__device__ __forceinline__ uint4 LoadBf16x8Pair4(const float* p) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  return make_uint4(PackBf16x2(a.x, b.x), PackBf16x2(a.y, b.y), PackBf16x2(a.z, b.z),
                    PackBf16x2(a.w, b.w));
}
__device__ __forceinline__ uint4 LoadBf16x8Pair4(const __nv_bfloat16* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);  // pairs (0,1) (2,3) (4,5) (6,7)
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                    __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
}

// Where column c of a row of 8-column groups is stored in that pairing: (0, 4), (1, 5), (2, 6),
// (3, 7) (CastToBf16Pair4's order), so that a 16-byte copy of 8 stored columns lines up with
// Mxfp4Bf16x8's words.
__device__ __forceinline__ int64_t Pair4Column(int64_t c) {
  return (c & ~int64_t{7}) | ((c & 3) << 1) | ((c >> 2) & 1);
}

// Two bf16 products (round to nearest even; subnormal operands and results are kept).
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Four bf16x2 products by one pair.
__device__ __forceinline__ uint4 MulBf16x8(const uint4& v, uint32_t f) {
  return make_uint4(MulBf16x2(v.x, f), MulBf16x2(v.y, f), MulBf16x2(v.z, f), MulBf16x2(v.w, f));
}

// bf16 pair (2^(s-127), 2^(s-127)) of a UE8M0 scale byte: the exponent field is s itself; s = 0
// (2^-127) is the bf16 subnormal 0x0040 (s = 255, NaN in the format, reads as infinity here).
__device__ __forceinline__ uint32_t E8M0Bf16x2(uint32_t s) {
  return s == 0 ? 0x00400040u : s * 0x00800080u;  // s << 7 in both halves
}

// bf16 2^126 twice: what the e2m1 codes placed in bf16 bits below are multiplied by.
constexpr uint32_t kBf16TwoPow126x2 = ((126u + 127u) << 7) * 0x10001u;

// 8 e2m1 codes of one 32-bit word (code j in bits 4j .. 4j+3: column base + j) times the group
// scale `scale2` (E8M0Bf16x2), as 4 bf16 pairs: pair j = (column j, column j + 4). Shifting the
// word left by 4 (3 - j) puts code j at the top of the low half and code j + 4 at the top of the
// high half: its sign is then already bit 15 (31), and its three magnitude bits (2 exponent, 1
// mantissa) go to bits 8..6 (24..22), the lowest exponent bits and the top mantissa bit of bf16.
// That reads as the e2m1 value times 2^-126 for every code (e2m1's subnormal 0.5 lands on the
// bf16 subnormal of the same significand); a bf16 product by 2^126 gives the value itself and a
// second by the scale applies it, both exact (bf16 holds every e2m1 value times 2^(s-127) for
// s in [1, 254] within its range). Three integer operations and two bf16x2 products per pair.
__device__ __forceinline__ uint4 Mxfp4Bf16x8(uint32_t w, uint32_t scale2) {
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t v = w << (4 * (3 - j));
    const uint32_t bits = (v & 0x80008000u) | ((v >> 6) & 0x01C001C0u);
    o[j] = MulBf16x2(MulBf16x2(bits, kBf16TwoPow126x2), scale2);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The same 8 codes with one bf16 product per pair instead of two: `fold2` (E8M0FoldBf16x2) is
// 2^126 times the group scale in one factor, 2^(s - 1), which bf16 holds for s <= 128; the
// product bits * 2^(s - 1) is the value times 2^(s - 127), exact as above. For s > 128 (weights
// of magnitude above 12, which the released experts do not have) the factor is capped at 2^127
// and a second product by E8M0RestBf16x2 = 2^(s - 128) follows, taken by the caller for a whole
// warp when any of its lanes needs it (Mxfp4FoldWeights::Big). Three integer operations and one
// bf16x2 product per pair.
__device__ __forceinline__ uint32_t E8M0FoldBf16x2(uint32_t s) {
  return (min(s, 128u) + 126u) * 0x00800080u;  // exponent field s + 126 in both halves
}
__device__ __forceinline__ uint32_t E8M0RestBf16x2(uint32_t s) {
  return s <= 128u ? 0x3F803F80u : s == 255u ? 0x7F807F80u : (s - 1u) * 0x00800080u;
}
__device__ __forceinline__ uint4 Mxfp4Bf16x8Fold(uint32_t w, uint32_t fold2) {
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t v = w << (4 * (3 - j));
    const uint32_t bits = (v & 0x80008000u) | ((v >> 6) & 0x01C001C0u);
    o[j] = MulBf16x2(bits, fold2);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// 8 e4m3 bytes (columns base + 0..7 in order: bytes of lo, then of hi) times the block scale,
// each product in fp32 and rounded to bf16 (the documented bf16 rounding of FP8 weights; the
// reference's fp32 values E4M3Value(b) * scale, rounded once), as pairs (0,1) (2,3) (4,5) (6,7).
__device__ __forceinline__ uint4 Fp8Bf16x8(uint32_t lo, uint32_t hi, float scale) {
  uint32_t o[4];
  const uint32_t w[2] = {lo, hi};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
    const float2 f = __half22float2(__half2(h2));
    o[i] = PackBf16x2(f.x * scale, f.y * scale);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The tensor-core kernels' weight formats. A policy P gives:
//   Matrix           the kernel parameter (a pointer, or a quantised matrix view)
//   kKBlock          k per lane-quad load (4 lanes x 16 bytes, 64 contiguous bytes of a row)
//   kWords           bf16 words of 8 k (two mma steps) a lane's load expands into
//   kLaneEnd         whether the last k block can be partial (then some lanes' words are past
//                    K: LaneBlocks says how many k blocks a lane's quad index has)
//   kUnroll          k blocks per batch in the 8-token kernel, kWideUnroll in the wide kernel
//                    (quantised formats: two batches alternate, the next one in flight while
//                    a batch is expanded; their sizes keep the kernels free of spills)
//   Expert / Row / Raw  one expert's weight (ExpertOf), a lane's stream of one of its rows
//                    (MakeRow), one loaded k block of a row (Load, Zero)
//   Expand(raw, t)   the bf16 word t of a loaded k block
//   StageX(x_row, v, q, k_in): the activations' bf16 word of virtual k block v for quad lane q
//                    in the pairing Expand produces (zeros past k_in)
//   Blocks(k_in)     k blocks of a row
struct Bf16Weights {
  using Matrix = const __nv_bfloat16*;
  static constexpr int kKBlock = kMmaKBlock;
  static constexpr int kWords = 1;
  static constexpr bool kLaneEnd = false;  // k_in % 32 == 0 (MmaFits)
  static constexpr int kUnroll = kMmaUnroll;
  static constexpr int kWideUnroll = 4;
  struct Row {
    const uint4* w;
  };
  struct Raw {
    uint4 w;
  };
  // Expert e's weight (w_rows rows of k_in each), and its row `row` for quad lane `quad`.
  using Expert = const __nv_bfloat16*;
  __device__ __forceinline__ static Expert ExpertOf(Matrix weight, int32_t e, int64_t w_rows,
                                                    int64_t k_in) {
    return weight + static_cast<int64_t>(e) * w_rows * k_in;
  }
  __device__ __forceinline__ static Row MakeRow(Expert we, int64_t row, int64_t k_in, int quad) {
    return Row{reinterpret_cast<const uint4*>(we + row * k_in) + quad};
  }
  __device__ __forceinline__ static Raw Load(const Row& r, int kb) {
    return Raw{LoadWeights16(r.w + kb * (kMmaKBlock / 8))};
  }
  __device__ __forceinline__ static Raw Zero() { return Raw{make_uint4(0, 0, 0, 0)}; }
  __device__ __forceinline__ static uint4 Expand(const Raw& r, int) { return r.w; }
  template <typename X>
  __device__ __forceinline__ static uint4 StageX(const X* x_row, int v, int q, int64_t) {
    return LoadBf16x8(x_row + v * kMmaKBlock + q * 8);
  }
  static constexpr int Blocks(int64_t k_in) { return static_cast<int>(k_in / kMmaKBlock); }
  static constexpr int LaneBlocks(int64_t k_in, int) { return Blocks(k_in); }
};

// MXFP4 (Mxfp4Matrix): quad lane q of k block kb holds the 32 codes of scale group 4 kb + q
// (columns 128 kb + 32 q ..), one UE8M0 byte; its word t (columns + 8 t ..) expands with
// Mxfp4Bf16x8 (two products; the wide kernel's and that of ExpertMmaKernel in steps with a wide
// pass, else Mxfp4FoldWeights below). Needs k_in % 32 == 0 (the format's own condition); a last
// partial k block leaves the lanes of the missing groups at zero.
struct Mxfp4Weights {
  using Matrix = Mxfp4Matrix;
  static constexpr int kKBlock = 128;
  static constexpr int kWords = 4;
  static constexpr bool kLaneEnd = true;
  static constexpr int kUnroll = 2;
  static constexpr int kWideUnroll = 1;
  struct Row {
    const uint4* w;
    const uint8_t* s;
  };
  struct Raw {
    uint4 w;
    uint32_t s;  // the UE8M0 byte
  };
  struct Expert {
    Matrix m;
    int64_t row0;  // expert e's first row in the stacked matrix
  };
  __device__ __forceinline__ static Expert ExpertOf(Matrix m, int32_t e, int64_t w_rows,
                                                    int64_t) {
    return Expert{m, static_cast<int64_t>(e) * w_rows};
  }
  __device__ __forceinline__ static Row MakeRow(const Expert& we, int64_t row, int64_t k_in,
                                                int quad) {
    const int64_t r = we.row0 + row;
    return Row{reinterpret_cast<const uint4*>(we.m.w + r * (k_in / 2)) + quad,
               we.m.scale + r * (k_in / 32) + quad};
  }
  // The scale byte through L1 (the 32-byte sector of a row's scales serves 8 k blocks).
  __device__ __forceinline__ static Raw Load(const Row& r, int kb) {
    return Raw{LoadWeights16(r.w + kb * 4), __ldg(r.s + kb * 4)};
  }
  __device__ __forceinline__ static Raw Zero() { return Raw{make_uint4(0, 0, 0, 0), 0}; }
  __device__ __forceinline__ static uint4 Expand(const Raw& r, int t) {
    const uint32_t w = t == 0 ? r.w.x : t == 1 ? r.w.y : t == 2 ? r.w.z : r.w.w;
    return Mxfp4Bf16x8(w, E8M0Bf16x2(r.s));
  }
  template <typename X>
  __device__ __forceinline__ static uint4 StageX(const X* x_row, int v, int q, int64_t k_in) {
    const int64_t k = static_cast<int64_t>(v >> 2) * kKBlock + q * 32 + (v & 3) * 8;
    return k < k_in ? LoadBf16x8Pair4(x_row + k) : make_uint4(0, 0, 0, 0);
  }
  static constexpr int Blocks(int64_t k_in) {
    return static_cast<int>((k_in + kKBlock - 1) / kKBlock);
  }
  static constexpr int LaneBlocks(int64_t k_in, int quad) {
    return static_cast<int>((k_in / 32 - quad + 3) / 4);
  }
};

// MXFP4 with the folded scale product (Mxfp4Bf16x8Fold): the same layout, loads and staging as
// Mxfp4Weights, and the same bf16 values. Expand gives the words of scales s <= 128; a warp in
// which Big(raw) holds for any lane takes ExpandBig (two products) for that k block instead.
// The single-token kernels' and ExpertMmaKernel's format in steps without a wide pass
// (moe_quant.cu; its header has the figures); the wide kernel has Mxfp4Weights only.
struct Mxfp4FoldWeights : Mxfp4Weights {
  static constexpr bool kFold = true;
  __device__ __forceinline__ static bool Big(const Raw& r) { return r.s > 128u; }
  __device__ __forceinline__ static uint4 Expand(const Raw& r, int t) {
    const uint32_t w = t == 0 ? r.w.x : t == 1 ? r.w.y : t == 2 ? r.w.z : r.w.w;
    return Mxfp4Bf16x8Fold(w, E8M0FoldBf16x2(r.s));
  }
  __device__ __forceinline__ static uint4 ExpandBig(const Raw& r, int t) {
    return MulBf16x8(Expand(r, t), E8M0RestBf16x2(r.s));
  }
};

// Whether P expands with the folded scale product (Big / ExpandBig).
template <class P>
constexpr bool kFoldOf = requires { P::kFold; };

// FP8 (Fp8Matrix, block_cols = 64 << shift, shift >= 0): quad lane q of k block kb holds columns
// 64 kb + 16 q .. + 15, all in scale column kb >> shift; word t (columns + 8 t ..) expands with
// Fp8Bf16x8. Needs k_in % 16 == 0.
struct Fp8Weights {
  using Matrix = Fp8Matrix;
  static constexpr int kKBlock = 64;
  static constexpr int kWords = 2;
  static constexpr bool kLaneEnd = true;
  static constexpr int kUnroll = 2;
  static constexpr int kWideUnroll = 1;
  struct Row {
    const uint4* w;
    const float* s;  // the row's scale row
    int shift;
  };
  struct Raw {
    uint4 w;
    float s;
  };
  struct Expert {
    Matrix m;
    int64_t row0;
  };
  __device__ __forceinline__ static Expert ExpertOf(Matrix m, int32_t e, int64_t w_rows,
                                                    int64_t) {
    return Expert{m, static_cast<int64_t>(e) * w_rows};
  }
  __device__ __forceinline__ static Row MakeRow(const Expert& we, int64_t row, int64_t k_in,
                                                int quad) {
    const int64_t r = we.row0 + row;
    return Row{reinterpret_cast<const uint4*>(we.m.w + r * k_in) + quad,
               we.m.scale + we.m.ScaleIndex(r, 0), __ffs(we.m.block_cols) - 7};
  }
  __device__ __forceinline__ static Raw Load(const Row& r, int kb) {
    return Raw{LoadWeights16(r.w + kb * 4), __ldg(r.s + (kb >> r.shift))};
  }
  __device__ __forceinline__ static Raw Zero() { return Raw{make_uint4(0, 0, 0, 0), 0.0f}; }
  __device__ __forceinline__ static uint4 Expand(const Raw& r, int t) {
    return t == 0 ? Fp8Bf16x8(r.w.x, r.w.y, r.s) : Fp8Bf16x8(r.w.z, r.w.w, r.s);
  }
  template <typename X>
  __device__ __forceinline__ static uint4 StageX(const X* x_row, int v, int q, int64_t k_in) {
    const int64_t k = static_cast<int64_t>(v >> 1) * kKBlock + q * 16 + (v & 1) * 8;
    return k < k_in ? LoadBf16x8(x_row + k) : make_uint4(0, 0, 0, 0);
  }
  static constexpr int Blocks(int64_t k_in) {
    return static_cast<int>((k_in + kKBlock - 1) / kKBlock);
  }
  static constexpr int LaneBlocks(int64_t k_in, int quad) {
    return static_cast<int>((k_in / 16 - quad + 3) / 4);
  }
};

// Whether the FP8 tensor-core policy takes a matrix: block_cols a power of two >= 64 (a lane's
// 16 columns then share a scale, found by a shift) and 16-byte rows.
inline bool Fp8MmaFits(const Fp8Matrix& m) {
  return m.cols % 16 == 0 && m.block_cols >= 64 && (m.block_cols & (m.block_cols - 1)) == 0 &&
         m.block_rows > 0;
}

// Stages `words` 16-byte words of activations into shared memory: locate(w, &v) loads word w
// into v (rounded to bf16) and returns its index in sx. kUnroll loads per thread are issued
// before any is stored, so a staging of a few words takes one round trip.
template <int kUnroll, typename Locate>
__device__ __forceinline__ void StageWords(int words, uint4* sx, Locate locate) {
  for (int w0 = threadIdx.x; w0 < words; w0 += kMmaThreads * kUnroll) {
    uint4 v[kUnroll];
    int dst[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int wi = w0 + u * kMmaThreads;
      v[u] = make_uint4(0, 0, 0, 0);
      dst[u] = wi < words ? locate(wi, &v[u]) : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (dst[u] >= 0) sx[dst[u]] = v[u];
    }
  }
}

// One warp's tile of an expert's weight W [rows, k_in]: output columns out_lo (accumulator
// rows grp: c0, c1) and out_hi (rows grp + 8: c2, c3), and the lane's weight streams of the W
// rows behind them. kSwiGlu: gate row c and up row I + c of column c = tile * 8 + grp;
// otherwise rows tile * 16 + grp and + 8. Rows past the end read row 0 instead (in bounds; their
// results are not stored).
template <class P>
struct MmaTile {
  int64_t out_lo, out_hi;
  bool ok_lo, ok_hi;
  bool live;        // the tile has any rows (uniform across the warp)
  int lane_blocks;  // k blocks this lane's words exist in (P::kLaneEnd)
  typename P::Row lo, hi;
};

template <class P, bool kSwiGlu>
__device__ __forceinline__ MmaTile<P> MakeMmaTile(typename P::Matrix weight, int32_t e,
                                                  int64_t tile, int64_t n_out, int64_t k_in) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
  const int64_t w_rows = kSwiGlu ? 2 * n_out : n_out;
  const typename P::Expert we = P::ExpertOf(weight, e, w_rows, k_in);
  MmaTile<P> t;
  int64_t row_lo, row_hi;
  if constexpr (kSwiGlu) {
    t.out_lo = t.out_hi = tile * 8 + grp;
    row_lo = t.out_lo;          // gate
    row_hi = n_out + t.out_lo;  // up
    t.live = tile * 8 < n_out;
  } else {
    t.out_lo = tile * 16 + grp;
    t.out_hi = t.out_lo + 8;
    row_lo = t.out_lo;
    row_hi = t.out_hi;
    t.live = tile * 16 < n_out;
  }
  t.ok_lo = t.out_lo < n_out;
  t.ok_hi = t.out_hi < n_out;
  t.lane_blocks = P::LaneBlocks(k_in, quad);
  t.lo = P::MakeRow(we, t.ok_lo ? row_lo : 0, k_in, quad);
  t.hi = P::MakeRow(we, t.ok_hi ? row_hi : 0, k_in, quad);
  return t;
}

// One batch of a warp's weights: k blocks kb .. kb + kUnroll - 1 of rows lo and hi (zeros past
// `end`, and past the lane's own words for a partial last k block), all loads issued before any
// is used (the guards are uniform across the warp but for that last block).
template <class P, int kUnroll>
__device__ __forceinline__ void LoadWeightBatch(typename P::Raw (&lo)[kUnroll],
                                                typename P::Raw (&hi)[kUnroll],
                                                const MmaTile<P>& mt, int kb, int end) {
  if constexpr (P::kLaneEnd) end = min(end, mt.lane_blocks);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (kb + u < end) {
      lo[u] = P::Load(mt.lo, kb + u);
      hi[u] = P::Load(mt.hi, kb + u);
    } else {
      lo[u] = hi[u] = P::Zero();
    }
  }
}

// The two mma steps of bf16 words a_lo (row g), a_hi (row g + 8) and activation word b.
__device__ __forceinline__ void MmaWord(float (&acc)[4], const uint4& a_lo, const uint4& a_hi,
                                        const uint4& b) {
  MmaBf16(acc, a_lo.x, a_hi.x, a_lo.y, a_hi.y, b.x, b.y);
  MmaBf16(acc, a_lo.z, a_hi.z, a_lo.w, a_hi.w, b.z, b.w);
}

// Stores one group's accumulators: tokens g0 + 2 * quad (c0/c2) and g0 + 2 * quad + 1 (c1/c3)
// of the ng in the group. kSwiGlu: acc[h] gate and acc[2 + h] up of column out_lo, h (bf16) in
// assignment order; otherwise rows out_lo and out_hi of y (fp32), at order[a] with scatter_out.
template <bool kSwiGlu, class P>
__device__ __forceinline__ void StoreMmaGroup(const float (&acc)[4], int32_t g0, int ng, int quad,
                                              const MmaTile<P>& mt, int64_t n_out, float limit,
                                              bool scatter_out, const int32_t* order, void* y) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = 2 * quad + h;
    if (j >= ng) continue;
    if constexpr (kSwiGlu) {
      if (mt.ok_lo) {
        static_cast<__nv_bfloat16*>(y)[static_cast<int64_t>(g0 + j) * n_out + mt.out_lo] =
            __float2bfloat16_rn(ClampedSwiGlu(acc[h], acc[2 + h], limit));
      }
    } else {
      const int64_t dst = scatter_out ? order[g0 + j] : g0 + j;
      float* yr = static_cast<float*>(y) + dst * n_out;
      if (mt.ok_lo) yr[mt.out_lo] = acc[h];
      if (mt.ok_hi) yr[mt.out_hi] = acc[2 + h];
    }
  }
}

// ExpertMmaKernel's companion for the experts with more than kMmaTokens assignments (the other
// kernel skips them; the sort kernels list them): up to kWideGroups groups of 8 of their
// assignments share each weight load, so a warp streams its rows once per 32 or 64 assignments
// instead of once per 8. At an 8k-token prefill an expert has ~190 assignments: 24 passes over
// its weights become 3; at decode batch 256 the experts with 9-16 read theirs once instead of
// twice. A pass stages its tokens' activations for as many k blocks as fit kWideMaxSmemBytes
// (of a 4096-wide K: all of it for one group, 50 of 128 k blocks for 4 groups, 25 for 8), so K
// goes in chunks with two barriers each; the weight batches stay in registers across them, so
// each chunk's first weights are requested before its staging. Word (kb, g, j, q) of a chunk (its
// k block kb, token j of group g, quarter q) is at (kb * groups + g) * 32 + 4 j + q, so lane l
// reads word (kb * groups + g) * 32 + l, as in the narrow layout (quantised formats: virtual k
// blocks, kWords per k block). Per group the products go through the same mma sequence as in
// ExpertMmaKernel with kSplitK 1 (k blocks in order, two steps each): the same bits as that
// kernel (with K split, as for small expert grids, the narrow kernel adds partial sums and
// differs in the last bits). Launched only where an expert can have more than 8 assignments
// (more than 8 tokens) and the experts average at least 4.
// Two blocks per SM (16 warps streaming weights; one block of 8 warps reached half the
// bandwidth): at most 128 registers per thread and 100 KiB of staged activations per block.
constexpr int kWideBlocksPerSm = 2;
constexpr size_t kWideMaxSmemBytes = 100 * 1024;
template <class P, typename X, bool kSwiGlu, int kWideGroups>
__global__ void __launch_bounds__(kMmaThreads, kWideBlocksPerSm)
    ExpertMmaWideKernel(const X* x, int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                        typename P::Matrix weight, int64_t n_out, int64_t k_in, float limit,
                        const int32_t* order, const int32_t* offsets, const int32_t* wide,
                        const int32_t* num_wide, int smem_words, void* y) {
  constexpr int kWideTokens = kWideGroups * kMmaTokens;
  constexpr int kWideUnroll = P::kWideUnroll;  // k blocks of weights in registers per lane
  constexpr int kW = P::kWords;
  // Staging loads in flight per thread: fewer where the accumulators take more registers.
  constexpr int kWideStageUnroll = kWideGroups > 4 ? 2 : 4;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint4* sx = reinterpret_cast<uint4*>(smem_raw);  // smem_words 16-byte words
  // Block y takes the y-th expert of the wide list (the sort kernels write it).
  if (static_cast<int32_t>(blockIdx.y) >= *num_wide) return;  // uniform across the block
  const int32_t e = wide[blockIdx.y];
  const int32_t a0 = offsets[e], a1 = offsets[e + 1];
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kMmaWarps + threadIdx.x / 32;
  const MmaTile<P> mt = MakeMmaTile<P, kSwiGlu>(weight, e, tile, n_out, k_in);
  const bool live = mt.live;
  const int kblocks = P::Blocks(k_in);
  const int lane = threadIdx.x & 31, quad = lane & 3;
  // K blocks per chunk for a pass of n assignments: as many as the staged words hold (>= 1: the
  // launcher gives at least kWideTokens * 4 * kWords words, one k block of a full pass).
  auto chunk_of = [&](int n) {
    const int c = smem_words / (((n + kMmaTokens - 1) / kMmaTokens) * 32 * kW);
    return c < kblocks ? c : kblocks;
  };
  typename P::Raw lo[kWideUnroll], hi[kWideUnroll];
  // The batch of k blocks kb .. min(kb + kWideUnroll, end) - 1.
  auto load_batch = [&](int kb, int end) { LoadWeightBatch<P>(lo, hi, mt, kb, end); };
  auto pass_size = [&](int32_t p0) { return a1 - p0 < kWideTokens ? a1 - p0 : kWideTokens; };
  if (live) load_batch(0, chunk_of(pass_size(a0)));
  for (int32_t p0 = a0; p0 < a1; p0 += kWideTokens) {
    const int n = pass_size(p0);
    const int groups = (n + kMmaTokens - 1) / kMmaTokens;
    const int chunk = chunk_of(n);
    float acc[kWideGroups][4];
#pragma unroll
    for (int g = 0; g < kWideGroups; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
    for (int c0 = 0; c0 < kblocks; c0 += chunk) {
      const int c1 = c0 + chunk < kblocks ? c0 + chunk : kblocks;
      __syncthreads();  // the previous chunk's (or pass's) readers of sx are done
      // Tokens of the last group past n read as zeros (their columns are never stored).
      const int padded = groups * kMmaTokens;
      for (int i = threadIdx.x; i < (c1 - c0) * kW * (padded - n) * 4; i += kMmaThreads) {
        const int kb = i / ((padded - n) * 4), rem = i - kb * (padded - n) * 4;
        const int j = n + rem / 4;
        sx[(kb * groups + j / kMmaTokens) * 32 + (j % kMmaTokens) * 4 + (rem & 3)] =
            make_uint4(0, 0, 0, 0);
      }
      // Token-major, so that consecutive threads read consecutive 8-element pieces of one row.
      const int per_token = (c1 - c0) * kW * 4;
      StageWords<kWideStageUnroll>(n * per_token, sx, [&](int wi, uint4* v) {
        const int j = wi / per_token, rem = wi - j * per_token;
        const int kb = rem >> 2, q = rem & 3;
        const int64_t src = by_token ? order[p0 + j] / top_k : p0 + j;
        *v = P::StageX(x + src * ldx, c0 * kW + kb, q, k_in);
        return (kb * groups + j / kMmaTokens) * 32 + (j % kMmaTokens) * 4 + q;
      });
      __syncthreads();
      if constexpr (kW > 1) {
        // Quantised formats: two batches alternate, as in ExpertMmaKernel; the batch after the
        // one in use is requested first (the rest of this chunk, the next chunk, or the next
        // pass's first chunk, as below).
        if (live) {
          typename P::Raw lo2[kWideUnroll], hi2[kWideUnroll];
          auto use = [&](const typename P::Raw(&l)[kWideUnroll],
                         const typename P::Raw(&h)[kWideUnroll], int kb) {
#pragma unroll
            for (int u = 0; u < kWideUnroll; ++u) {
              if (kb + u < c1) {
#pragma unroll
                for (int t = 0; t < kW; ++t) {
                  const uint4* xs = sx + (((kb + u - c0) * kW + t) * groups) * 32 + lane;
                  const uint4 a_lo = P::Expand(l[u], t), a_hi = P::Expand(h[u], t);
#pragma unroll
                  for (int g = 0; g < kWideGroups; ++g) {
                    if (g < groups) MmaWord(acc[g], a_lo, a_hi, xs[g * 32]);
                  }
                }
              }
            }
          };
          for (int kb = c0; kb < c1; kb += 2 * kWideUnroll) {
            const bool second = kb + kWideUnroll < c1;
            if (second) LoadWeightBatch<P>(lo2, hi2, mt, kb + kWideUnroll, c1);
            use(lo, hi, kb);
            if (kb + 2 * kWideUnroll < c1) {
              load_batch(kb + 2 * kWideUnroll, c1);
            } else if (c1 < kblocks) {
              load_batch(c1, c1 + chunk < kblocks ? c1 + chunk : kblocks);
            } else if (p0 + kWideTokens < a1) {
              load_batch(0, chunk_of(pass_size(p0 + kWideTokens)));
            }
            if (second) use(lo2, hi2, kb + kWideUnroll);
          }
        }
      } else if (live) {
        // The batch at kb is in lo/hi on entry to each iteration.
        for (int kb = c0; kb < c1; kb += kWideUnroll) {
#pragma unroll
          for (int u = 0; u < kWideUnroll; ++u) {
            if (kb + u < c1) {
#pragma unroll
              for (int t = 0; t < kW; ++t) {
                const uint4* xs = sx + (((kb + u - c0) * kW + t) * groups) * 32 + lane;
                const uint4 a_lo = P::Expand(lo[u], t), a_hi = P::Expand(hi[u], t);
#pragma unroll
                for (int g = 0; g < kWideGroups; ++g) {
                  if (g < groups) {
                    const uint4 b = xs[g * 32];
                    MmaBf16(acc[g], a_lo.x, a_hi.x, a_lo.y, a_hi.y, b.x, b.y);
                    MmaBf16(acc[g], a_lo.z, a_hi.z, a_lo.w, a_hi.w, b.z, b.w);
                  }
                }
              }
            }
          }
          // Next: the rest of this chunk, the next chunk, or the next pass's first chunk.
          if (kb + kWideUnroll < c1) {
            load_batch(kb + kWideUnroll, c1);
          } else if (c1 < kblocks) {
            load_batch(c1, c1 + chunk < kblocks ? c1 + chunk : kblocks);
          } else if (p0 + kWideTokens < a1) {
            load_batch(0, chunk_of(pass_size(p0 + kWideTokens)));
          }
        }
      }
    }
    if (live) {
#pragma unroll
      for (int g = 0; g < kWideGroups; ++g) {
        if (g < groups) {
          const int ng = n - g * kMmaTokens < kMmaTokens ? n - g * kMmaTokens : kMmaTokens;
          StoreMmaGroup<kSwiGlu>(acc[g], p0 + g * kMmaTokens, ng, quad, mt, n_out, limit,
                                 scatter_out, order, y);
        }
      }
    }
  }
}

// y[a, :n_out] = W[e] · x[src(a)] for the sorted assignments a of expert e = active[blockIdx.y]
// (or, with `active` null, rows [0, dense_rows) of x against one weight), W [rows, k_in] in the
// format P (bf16: k_in % 32 == 0); x fp32 (rounded to bf16 here) or bf16; x and W 16-byte
// aligned. src(a) as in GroupedGemvKernel. With `scatter_out`, row a of y is written at order[a]
// (the assignment's (t, k) index) so that the combine needs no inverse permutation. kSwiGlu: see
// above; n_out = I, W has 2I rows, y is bf16 h.
template <class P, typename X, bool kSwiGlu, int kSplitK>
__global__ void __launch_bounds__(kMmaThreads, 2)
    ExpertMmaKernel(const X* x, int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                    typename P::Matrix weight, int64_t n_out, int64_t k_in, float limit,
                    const int32_t* order, const int32_t* offsets, const int32_t* active,
                    const int32_t* num_active, int32_t dense_rows, bool skip_wide, void* y) {
  static_assert(kMmaWarps % kSplitK == 0, "the warps of a block split into whole tiles");
  constexpr int kTilesPerBlock = kMmaWarps / kSplitK;
  constexpr int kUnroll = P::kUnroll;
  constexpr int kW = P::kWords;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint4* sx = reinterpret_cast<uint4*>(smem_raw);  // [k block][token][4 x 16 bytes]
  __shared__ float4 red[kSplitK > 1 ? kMmaWarps : 1][32];
  int32_t e = 0, a0 = 0, a1 = dense_rows;
  if (active != nullptr) {
    if (static_cast<int32_t>(blockIdx.y) >= *num_active) return;  // uniform across the block
    e = active[blockIdx.y];
    a0 = offsets[e];
    a1 = offsets[e + 1];
  }
  // Experts with more than kMmaTokens assignments are the wide kernel's (ExpertMmaWideKernel).
  if (skip_wide && a1 - a0 > kMmaTokens) return;  // uniform across the block
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int quad = lane & 3;
  const int slice = warp % kSplitK;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kTilesPerBlock + warp / kSplitK;
  const MmaTile<P> mt = MakeMmaTile<P, kSwiGlu>(weight, e, tile, n_out, k_in);
  const bool live = mt.live;
  const int kblocks = P::Blocks(k_in);
  const int kb_begin = slice * kblocks / kSplitK, kb_end = (slice + 1) * kblocks / kSplitK;
  const int items = kblocks * kW * 32;  // 16-byte words of the staged group

  // One batch of weights: kUnroll k blocks of rows lo and hi, all loads issued before any is
  // used (the guards are uniform across the warp). Weights do not depend on x, so the first batch
  // of the first group is requested before the staging below, and the first batch of the next
  // group (the same rows again) before that group's staging: the weight stream does not wait for
  // the x round trip and the barriers.
  typename P::Raw lo[kUnroll], hi[kUnroll];
  auto load_batch = [&](int kb) { LoadWeightBatch<P>(lo, hi, mt, kb, kb_end); };
  if (live && a0 < a1) load_batch(kb_begin);

  for (int32_t g0 = a0; g0 < a1; g0 += kMmaTokens) {
    const int ng = a1 - g0 < kMmaTokens ? a1 - g0 : kMmaTokens;
    __syncthreads();  // the previous group's readers of sx (and red) are done
    // Word i holds token j = (i / 4) % 8, k = (i / 32) * 32 + (i % 4) * 8 .. + 7 (quantised
    // formats: of virtual k block i / 32); tokens past the group are zeros (their columns are
    // never stored), written without loads. The group's own words (vblocks * 4 * ng of them,
    // w -> virtual k block w / (4 ng), token (w % (4 ng)) / 4, quarter w % 4) are loaded
    // kStageUnroll per thread at a time, loads first, then the stores: a decode group of one
    // token takes one round trip, not items / (256 * kStageUnroll).
    if (ng < kMmaTokens) {
      for (int i = threadIdx.x; i < items; i += kMmaThreads) {
        if (((i >> 2) & (kMmaTokens - 1)) >= ng) sx[i] = make_uint4(0, 0, 0, 0);
      }
    }
    const int words_per_kb = 4 * ng;
    StageWords<kStageUnroll>(kblocks * kW * words_per_kb, sx, [&](int wi, uint4* v) {
      const int kb = wi / words_per_kb;
      const int rem = wi - kb * words_per_kb;
      const int j = rem >> 2, q = rem & 3;
      const int64_t src = by_token ? order[g0 + j] / top_k : g0 + j;
      *v = P::StageX(x + src * ldx, kb, q, k_in);
      return kb * 32 + j * 4 + q;
    });
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kW > 1) {
      // Quantised formats: two batches alternate. Their expansion takes long enough that the
      // next batch must already be in flight while a batch is used, so the batch after the one
      // in use is requested first (after the group's last batch: the next group's first).
      if (live) {
        const uint4* xs = sx + lane;
        const bool more_groups = g0 + kMmaTokens < a1;
        typename P::Raw lo2[kUnroll], hi2[kUnroll];
        auto use = [&](const typename P::Raw(&l)[kUnroll], const typename P::Raw(&h)[kUnroll],
                       int kb) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            if (kb + u < kb_end) {
              if constexpr (kFoldOf<P>) {
                // A warp with any scale above 2^1 in this k block takes the two products (the
                // lanes are converged: the tile and its bounds are uniform per warp).
                if (__any_sync(0xffffffffu, P::Big(l[u]) || P::Big(h[u]))) {
#pragma unroll
                  for (int t = 0; t < kW; ++t) {
                    MmaWord(acc, P::ExpandBig(l[u], t), P::ExpandBig(h[u], t),
                            xs[((kb + u) * kW + t) * 32]);
                  }
                  continue;
                }
              }
#pragma unroll
              for (int t = 0; t < kW; ++t) {
                MmaWord(acc, P::Expand(l[u], t), P::Expand(h[u], t),
                        xs[((kb + u) * kW + t) * 32]);
              }
            }
          }
        };
        for (int kb = kb_begin; kb < kb_end; kb += 2 * kUnroll) {
          const bool second = kb + kUnroll < kb_end;
          if (second) LoadWeightBatch<P>(lo2, hi2, mt, kb + kUnroll, kb_end);
          use(lo, hi, kb);
          if (kb + 2 * kUnroll < kb_end) {
            load_batch(kb + 2 * kUnroll);
          } else if (more_groups) {
            load_batch(kb_begin);
          }
          if (second) use(lo2, hi2, kb + kUnroll);
        }
      }
    } else if (live) {
      const uint4* xs = sx + lane;
      const bool more_groups = g0 + kMmaTokens < a1;
      // The batch at kb is in lo/hi on entry to each iteration.
      for (int kb = kb_begin; kb < kb_end; kb += kUnroll) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (kb + u < kb_end) {
#pragma unroll
            for (int t = 0; t < kW; ++t) {
              const uint4 b = xs[((kb + u) * kW + t) * 32];
              const uint4 a_lo = P::Expand(lo[u], t), a_hi = P::Expand(hi[u], t);
              MmaBf16(acc, a_lo.x, a_hi.x, a_lo.y, a_hi.y, b.x, b.y);
              MmaBf16(acc, a_lo.z, a_hi.z, a_lo.w, a_hi.w, b.z, b.w);
            }
          }
        }
        if (kb + kUnroll < kb_end) {
          load_batch(kb + kUnroll);
        } else if (more_groups) {
          load_batch(kb_begin);
        }
      }
    }
    if constexpr (kSplitK > 1) {
      // Partial sums of the other K slices, added in slice order.
      if (slice != 0) red[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      __syncthreads();
      if (slice == 0) {
        for (int s = 1; s < kSplitK; ++s) {
          const float4 r = red[warp + s][lane];
          acc[0] += r.x;
          acc[1] += r.y;
          acc[2] += r.z;
          acc[3] += r.w;
        }
      }
    }
    if (live && slice == 0) {
      StoreMmaGroup<kSwiGlu>(acc, g0, ng, quad, mt, n_out, limit, scatter_out, order, y);
    }
  }
}

// Staged activations of one group for a reduction of length k_in in the format P: bytes.
template <class P>
size_t MmaStageBytes(int64_t k_in) {
  return static_cast<size_t>(P::Blocks(k_in)) * P::kWords * 32 * sizeof(uint4);
}

// Whether ExpertMmaKernel takes a reduction of length k_in (the staged group must fit in shared
// memory) over these operands (16-byte vector loads).
inline bool MmaFits(int64_t k_in) {
  return k_in > 0 && k_in % kMmaKBlock == 0 &&
         static_cast<size_t>(k_in) * kMmaTokens * sizeof(__nv_bfloat16) <= kMmaMaxSmemBytes;
}
// Grid x of ExpertMmaKernel for n_out outputs: tiles of 16 rows (8 SwiGLU columns), whole tiles
// per block. Depends on the shapes only (graph capture).
template <bool kSwiGlu, int kSplitK>
unsigned MmaBlocks(int64_t n_out) {
  constexpr int64_t kPerTile = kSwiGlu ? 8 : 16;
  constexpr int64_t kTilesPerBlock = kMmaWarps / kSplitK;
  const int64_t tiles = (n_out + kPerTile - 1) / kPerTile;
  return static_cast<unsigned>((tiles + kTilesPerBlock - 1) / kTilesPerBlock);
}

template <class P, typename X, bool kSwiGlu, int kSplitK>
absl::Status LaunchExpertMma(dim3 grid, cudaStream_t stream, const X* x, int64_t ldx, bool by_token,
                             bool scatter_out, int64_t top_k, const typename P::Matrix& weight,
                             int64_t n_out, int64_t k_in, float limit, const int32_t* order,
                             const int32_t* offsets, const int32_t* active,
                             const int32_t* num_active, int32_t dense_rows, bool wide, void* y) {
  const size_t smem = MmaStageBytes<P>(k_in);
  auto kernel = ExpertMmaKernel<P, X, kSwiGlu, kSplitK>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  kernel<<<grid, kMmaThreads, smem, stream>>>(x, ldx, by_token, scatter_out, top_k, weight, n_out,
                                              k_in, limit, order, offsets, active, num_active,
                                              dense_rows, wide, y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

// Whether the wide kernel takes the experts with more than kMmaTokens assignments: only when an
// expert can have that many (one assignment per token and expert) and the experts average at
// least 4 assignments. Below that few experts are wide, and a second kernel's partial last wave
// costs more than their second pass over the weights saves (slice3, FULL: batch 64, 1.5 per
// expert, 7.57 ms with it against 7.49 without; batch 256, 6 per expert, 12.65 against 13.64;
// bench/results/h200-2026-11-30i/). Depends on the shapes only (graph capture).
inline bool UseWide(bool wide, int64_t tokens, int64_t assignments, int64_t experts) {
  return wide && tokens > kMmaTokens && assignments >= 4 * experts;
}

// ExpertMmaWideKernel with kWideGroups groups per pass over at most a / (kMmaTokens + 1) experts
// (those with more than kMmaTokens of the a assignments; the blocks past the wide list's length
// return at once).
template <class P, typename X, bool kSwiGlu, int kWideGroups>
absl::Status LaunchExpertMmaWide(int64_t assignments, unsigned max_active, cudaStream_t stream,
                                 const X* x, int64_t ldx, bool by_token, bool scatter_out,
                                 int64_t top_k, const typename P::Matrix& weight, int64_t n_out,
                                 int64_t k_in, float limit, const int32_t* order,
                                 const int32_t* offsets, const int32_t* wide,
                                 const int32_t* num_wide, void* y) {
  const unsigned experts =
      static_cast<unsigned>(std::min<int64_t>(max_active, assignments / (kMmaTokens + 1)));
  if (experts == 0) return absl::OkStatus();
  // All of K for a full pass, or as much as fits.
  const size_t smem =
      std::min<size_t>(MmaStageBytes<P>(k_in) * kWideGroups, kWideMaxSmemBytes) / 512 * 512;
  auto kernel = ExpertMmaWideKernel<P, X, kSwiGlu, kWideGroups>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  kernel<<<dim3(MmaBlocks<kSwiGlu, 1>(n_out), experts), kMmaThreads, smem, stream>>>(
      x, ldx, by_token, scatter_out, top_k, weight, n_out, k_in, limit, order, offsets, wide,
      num_wide, static_cast<int>(smem / 16), y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

// The wide kernel's groups per pass: 8 (64 assignments) where the experts average at least 16
// assignments (prefill), else 4, whose lighter registers stream a decode batch's 9-16-assignment
// experts faster. Measured on slice3 (bench/results/h200-2026-11-30i/): batch 256 12.57 ms
// with 4 against 12.95 with 8; an 8k prefill 160 against 138 ms. Depends on the shapes only.
template <class P, typename X, bool kSwiGlu>
absl::Status LaunchExpertMmaWideFor(int64_t experts, int64_t assignments, unsigned max_active,
                                    cudaStream_t stream, const X* x, int64_t ldx, bool by_token,
                                    bool scatter_out, int64_t top_k,
                                    const typename P::Matrix& weight, int64_t n_out, int64_t k_in,
                                    float limit, const int32_t* order, const int32_t* offsets,
                                    const int32_t* wide, const int32_t* num_wide, void* y) {
  if (assignments >= 16 * experts) {
    return LaunchExpertMmaWide<P, X, kSwiGlu, 8>(assignments, max_active, stream, x, ldx, by_token,
                                                 scatter_out, top_k, weight, n_out, k_in, limit,
                                                 order, offsets, wide, num_wide, y);
  }
  return LaunchExpertMmaWide<P, X, kSwiGlu, 4>(assignments, max_active, stream, x, ldx, by_token,
                                               scatter_out, top_k, weight, n_out, k_in, limit,
                                               order, offsets, wide, num_wide, y);
}

// K split over the warps of a block (kSplitK tiles per block fewer, kSplitK times the blocks)
// when the expert grid is small (decode: 6 experts x 32 blocks at T = 1, below 1.5 blocks per
// SM): more, shorter weight streams in flight. Depends on the shapes only (graph capture).
inline int MoeSplitK(unsigned blocks_per_expert, unsigned max_active) {
  const int64_t blocks = int64_t{blocks_per_expert} * max_active;
  if (blocks <= 264) return 4;  // <= 2 blocks per SM of 132
  if (blocks <= 528) return 2;
  return 1;
}

template <class P, typename X, bool kSwiGlu>
absl::Status LaunchExpertMmaSplit(int split, unsigned max_active, cudaStream_t stream, const X* x,
                                  int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                                  const typename P::Matrix& weight, int64_t n_out, int64_t k_in,
                                  float limit, const int32_t* order, const int32_t* offsets,
                                  const int32_t* active, const int32_t* num_active,
                                  int32_t dense_rows, bool wide, void* y) {
  switch (split) {
    case 4:
      return LaunchExpertMma<P, X, kSwiGlu, 4>(
          dim3(MmaBlocks<kSwiGlu, 4>(n_out), max_active), stream, x, ldx, by_token, scatter_out,
          top_k, weight, n_out, k_in, limit, order, offsets, active, num_active, dense_rows, wide,
          y);
    case 2:
      return LaunchExpertMma<P, X, kSwiGlu, 2>(
          dim3(MmaBlocks<kSwiGlu, 2>(n_out), max_active), stream, x, ldx, by_token, scatter_out,
          top_k, weight, n_out, k_in, limit, order, offsets, active, num_active, dense_rows, wide,
          y);
    default:
      return LaunchExpertMma<P, X, kSwiGlu, 1>(
          dim3(MmaBlocks<kSwiGlu, 1>(n_out), max_active), stream, x, ldx, by_token, scatter_out,
          top_k, weight, n_out, k_in, limit, order, offsets, active, num_active, dense_rows, wide,
          y);
  }
}

// The tensor-core expert path of MoeExperts / MoeExpertsQuant after the sort: gate_up with
// SwiGLU in its epilogue (h in bf16, the precision the down projection reads it at), then down
// writing y in (t, k) order for the combine; the wide kernel for the experts with more than
// kMmaTokens assignments when `use_wide` (the sort listed them).
template <class P>
absl::Status RunExpertMma(const ExpertsDims& d, const float* u, const float* weights,
                          const typename P::Matrix& gate_up, const typename P::Matrix& down,
                          bool use_wide, const MoeWorkspace& w, float* out, cudaStream_t stream) {
  const int64_t a = d.tokens * d.top_k;
  const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(d.experts, a));
  __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(w.h);
  RETURN_IF_ERROR((LaunchExpertMmaSplit<P, float, true>(
      MoeSplitK(MmaBlocks<true, 1>(d.inter), max_active), max_active, stream, u, d.dim, true,
      false, d.top_k, gate_up, d.inter, d.dim, d.swiglu_limit, w.order, w.offsets, w.active,
      w.num_active, 0, use_wide, h)));
  if constexpr (kFoldOf<P>) {
    // The folded expansion is only in ExpertMmaKernel (its caller passes use_wide = false).
    if (use_wide) return absl::InternalError("RunExpertMma: no wide kernel for this format");
  } else if (use_wide) {
    RETURN_IF_ERROR((LaunchExpertMmaWideFor<P, float, true>(
        d.experts, a, max_active, stream, u, d.dim, true, false, d.top_k, gate_up, d.inter, d.dim,
        d.swiglu_limit, w.order, w.offsets, w.wide, w.num_wide, h)));
  }
  RETURN_IF_ERROR((LaunchExpertMmaSplit<P, __nv_bfloat16, false>(
      MoeSplitK(MmaBlocks<false, 1>(d.dim), max_active), max_active, stream, h, d.inter, false,
      true, d.top_k, down, d.dim, d.inter, 0.0f, w.order, w.offsets, w.active, w.num_active, 0,
      use_wide, w.y)));
  if constexpr (!kFoldOf<P>) {
    if (use_wide) {
      RETURN_IF_ERROR((LaunchExpertMmaWideFor<P, __nv_bfloat16, false>(
          d.experts, a, max_active, stream, h, d.inter, false, true, d.top_k, down, d.dim,
          d.inter, 0.0f, w.order, w.offsets, w.wide, w.num_wide, w.y)));
    }
  }
  return CombineAssignments(d, w.y, nullptr, weights, out, stream);
}

}  // namespace
}  // namespace dsv4::cuda
