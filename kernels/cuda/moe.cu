#include "kernels/cuda/moe.h"

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kMaxExpertsPerLane = 32;  // E <= 1024
constexpr int kMaxTopK = 16;

__device__ __forceinline__ float Softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One warp per token. Expert e lives in slot e % kSlots of lane e / kSlots (kSlots = the
// smallest power of two >= E / 32, so E = 256 needs 8 registers per lane, not 32). The selection
// key of a slot is packed into one 64-bit word, (order-preserving bits of score + bias) << 32 |
// ~e, so that one integer max is "largest key, ties to the lower expert index" (-0 counts as +0,
// NaN below everything, as a float compare never picks it); top-k is top_k passes of a
// lane-local max over the slots and a 5-step warp max, with the winner's key set to -inf after
// it is taken (as before). Lane k keeps pick k; the weight sum is added in k order.
__device__ __forceinline__ uint64_t RouteKey(float key, int32_t e) {
  if (key == 0.0f) key = 0.0f;  // -0 == +0 in the float compare
  const uint32_t b = __float_as_uint(key);
  uint32_t o = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  if (key != key) o = 0;
  return (static_cast<uint64_t>(o) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(e));
}

template <int kSlots>
__global__ void RouteKernel(RouterDims d, const float* logits, const float* bias,
                            const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx,
                            float* weights) {
  PdlTrigger();  // the single-token expert kernels launch early (they wait before reading idx)
  PdlWait();
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= d.tokens) return;  // uniform across the warp
  const float* l = logits + t * d.experts;
  const int top_k = static_cast<int>(d.top_k);
  int32_t my_e = 0;
  float my_s = 0.0f;
  if (tid2eid != nullptr) {
    if (lane < top_k) {
      const int64_t tok = token_ids[t];
      my_e = tid2eid[tok * d.top_k + lane];
      my_s = my_e >= 0 && my_e < d.experts ? sqrtf(Softplus(l[my_e])) : 0.0f;
    }
  } else {
    float score[kSlots];
    uint64_t key[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int32_t e = lane * kSlots + i;
      if (e < d.experts) {
        score[i] = sqrtf(Softplus(l[e]));
        key[i] = RouteKey(score[i] + (bias != nullptr ? bias[e] : 0.0f), e);
      } else {
        score[i] = 0.0f;
        key[i] = 0;  // below every real expert
      }
    }
    for (int k = 0; k < top_k; ++k) {
      uint64_t best = key[0];
#pragma unroll
      for (int i = 1; i < kSlots; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint64_t ob = __shfl_xor_sync(0xffffffffu, best, o);
        best = ob > best ? ob : best;
      }
      const int32_t be = static_cast<int32_t>(~static_cast<uint32_t>(best & 0xffffffffu));
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (lane * kSlots + i == be) {
          v = score[i];
          key[i] = RouteKey(-INFINITY, be);
        }
      }
      v = __shfl_sync(0xffffffffu, v, (be / kSlots) & 31);
      if (lane == k) {
        my_e = be;
        my_s = v;
      }
    }
  }
  float sum = 0;
  for (int k = 0; k < top_k; ++k) sum += __shfl_sync(0xffffffffu, my_s, k);
  if (lane < top_k) {
    idx[t * d.top_k + lane] = my_e;
    weights[t * d.top_k + lane] = my_s / (sum + 1e-20f) * d.routed_scale;
  }
}

__global__ void SwiGluKernel(const float* gu, int64_t rows, int64_t inter, float limit, float* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * inter;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    const float g = fminf(gu[r * 2 * inter + c], limit);
    const float u = fminf(fmaxf(gu[r * 2 * inter + inter + c], -limit), limit);
    h[i] = g / (1.0f + expf(-g)) * u;
  }
}

// The tensor-core expert kernels' group: the mma n, assignments per weight load (ExpertMmaKernel).
// Experts with more are ExpertMmaWideKernel's.
constexpr int kMmaTokens = 8;

// Expert boundaries from the sorted expert ids: offsets[e] = first sorted assignment of expert e
// (experts without assignments start where the next one does), active[i] = the i-th expert that
// has assignments, *num_active, and wide[i] / *num_wide the same for the experts with more than
// kMmaTokens. Single block: per-expert counts (integer shared-memory atomics, so the result does
// not depend on their order) and block scans; an earlier version walked the experts serially in
// one thread, a long dependent chain of global accesses at every step.
constexpr int kOffsetsThreads = 1024;
using OffsetsScan = cub::BlockScan<int32_t, kOffsetsThreads>;

// From per-expert counts: offsets[e] (the running sum), the active list and the wide list
// (experts with more than kMmaTokens; none when `wide` is null); chunks of kOffsetsThreads
// experts carry the totals (uniform trip count). With `rebase`, count[e] becomes offsets[e]
// (each thread touches only its own entries). Returns {assignments counted, active, wide}, the
// same in every thread.
__device__ int3 ExpertLists(int32_t* count, int64_t experts, bool rebase,
                            OffsetsScan::TempStorage& scan, int32_t* offsets, int32_t* active,
                            int32_t* wide) {
  int32_t start = 0, ranked = 0, wide_ranked = 0;
  for (int64_t base = 0; base < experts; base += kOffsetsThreads) {
    const int64_t e = base + threadIdx.x;
    const int32_t c = e < experts ? count[e] : 0;
    int32_t off, total, rank, total_active, wrank, total_wide;
    OffsetsScan(scan).ExclusiveSum(c, off, total);
    __syncthreads();  // the scan storage is reused
    OffsetsScan(scan).ExclusiveSum(c > 0 ? 1 : 0, rank, total_active);
    __syncthreads();
    wrank = total_wide = 0;
    if (wide != nullptr) {  // uniform: no wide list where no expert can have more than 8
      OffsetsScan(scan).ExclusiveSum(c > kMmaTokens ? 1 : 0, wrank, total_wide);
      __syncthreads();
    }
    if (e < experts) {
      offsets[e] = start + off;
      if (rebase) count[e] = start + off;
      if (c > 0) active[ranked + rank] = static_cast<int32_t>(e);
      if (wide != nullptr && c > kMmaTokens) wide[wide_ranked + wrank] = static_cast<int32_t>(e);
    }
    start += total;
    ranked += total_active;
    wide_ranked += total_wide;
  }
  return make_int3(start, ranked, wide_ranked);
}

__global__ void __launch_bounds__(kOffsetsThreads)
    OffsetsKernel(const int32_t* sorted_experts, int64_t assignments, int64_t experts,
                  int32_t* offsets, int32_t* active, int32_t* num_active, int32_t* wide,
                  int32_t* num_wide) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* count = reinterpret_cast<int32_t*>(smem_raw);  // [experts]
  __shared__ OffsetsScan::TempStorage scan;
  for (int64_t e = threadIdx.x; e < experts; e += kOffsetsThreads) count[e] = 0;
  __syncthreads();
  for (int64_t a = threadIdx.x; a < assignments; a += kOffsetsThreads) {
    const int32_t e = sorted_experts[a];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int3 totals = ExpertLists(count, experts, false, scan, offsets, active, wide);
  if (threadIdx.x == 0) {
    offsets[experts] = totals.x;  // the counted assignments: the last range is its count
    *num_active = totals.y;
    *num_wide = totals.z;
  }
}

// Decode-sized batches (assignments <= kSmallSortMax): the stable sort by expert, the offsets
// and the active list in one block, replacing Iota + the radix sort (several launches) +
// OffsetsKernel. Counts as in OffsetsKernel (the count does not depend on the order), then
// count[e] becomes the first sorted position of expert e, and assignment a goes to
// count[e] + (number of earlier assignments of e): the stable order the radix sort gives.
// Assignments with an expert id outside [0, E) get no slot (OffsetsKernel skips them too).
constexpr int kSmallSortMax = kOffsetsThreads;
__global__ void __launch_bounds__(kOffsetsThreads)
    SmallSortKernel(const int32_t* idx, int64_t assignments, int64_t experts, int32_t* order,
                    int32_t* offsets, int32_t* active, int32_t* num_active, int32_t* wide,
                    int32_t* num_wide) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* count = reinterpret_cast<int32_t*>(smem_raw);  // [experts]
  __shared__ int32_t ex[kSmallSortMax];
  __shared__ OffsetsScan::TempStorage scan;
  for (int64_t e = threadIdx.x; e < experts; e += kOffsetsThreads) count[e] = 0;
  if (threadIdx.x < assignments) ex[threadIdx.x] = idx[threadIdx.x];
  __syncthreads();
  if (threadIdx.x < assignments) {
    const int32_t e = ex[threadIdx.x];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int3 totals = ExpertLists(count, experts, true, scan, offsets, active, wide);
  if (threadIdx.x == 0) {
    offsets[experts] = totals.x;
    *num_active = totals.y;
    *num_wide = totals.z;
  }
  __syncthreads();
  if (threadIdx.x < assignments) {
    const int a = threadIdx.x;
    const int32_t e = ex[a];
    if (e >= 0 && e < experts) {
      int32_t r = 0;
      for (int b = 0; b < a; ++b) r += ex[b] == e ? 1 : 0;
      order[count[e] + r] = a;
    }
  }
}

__global__ void IotaKernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<int32_t>(i);
  }
}

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

// With `active` null this is a plain small-M GEMV: one "expert" (weight itself) and rows
// [0, dense_rows) of x in order. bf16 weights see x rounded to bf16 (the GEMM convention).
template <typename W, int kRowsPerWarp>
__global__ void __launch_bounds__(kGemmThreads) GroupedGemvKernel(
    const float* x, int64_t ldx, bool by_token, int64_t top_k, const W* weight, int64_t n_out,
    int64_t k_in, const int32_t* order, const int32_t* offsets, const int32_t* active,
    const int32_t* num_active, int32_t dense_rows, float* y) {
  constexpr int kRows = kRowsPerWarp * kWarps;
  __shared__ __align__(16) float sx[kGroup][kKChunk];
  int32_t e = 0, a0 = 0, a1 = dense_rows;
  if (active != nullptr) {
    if (static_cast<int32_t>(blockIdx.y) >= *num_active) return;
    e = active[blockIdx.y];
    a0 = offsets[e];
    a1 = offsets[e + 1];
  }
  const W* we = weight + static_cast<int64_t>(e) * n_out * k_in;
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
        sx[j][c] = sizeof(W) == 2 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
      }
      __syncthreads();
      // 16-byte weight loads: 8 bf16 or 4 fp32 consecutive elements per lane, the warp's rows
      // loaded together so that several loads are in flight per lane.
      constexpr int kVec = 16 / sizeof(W);
      // One row per warp (plain GEMV): unroll along K for loads in flight; the expert path already
      // has kRowsPerWarp of them and more would cost registers.
      constexpr int kUnroll = kRowsPerWarp >= 4 ? 1 : 4;
#pragma unroll kUnroll
      for (int c = lane * kVec; c < kc; c += 32 * kVec) {
        uint4 raw[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int64_t row = row_base + r;
          raw[r] = row < n_out ? *reinterpret_cast<const uint4*>(we + row * k_in + k0 + c)
                               : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float wv[kVec];
          if constexpr (sizeof(W) == 2) {
            const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[r]);
#pragma unroll
            for (int v = 0; v < kVec / 2; ++v) {
              const float2 f = __bfloat1622float2(p2[v]);
              wv[2 * v] = f.x;
              wv[2 * v + 1] = f.y;
            }
          } else {
            const float* pf = reinterpret_cast<const float*>(&raw[r]);
#pragma unroll
            for (int v = 0; v < kVec; ++v) wv[v] = pf[v];
          }
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

// ---- bf16 weights: tensor-core expert GEMV ----
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

// ---- SmallGemv: split-K over a thread-block cluster ----
//
// y[m, n] = x[m, k] · W[n, k]ᵀ for m <= 8, W fp32 or bf16 (x rounded to bf16 for bf16 W, as in
// the GEMM convention), fp32 accumulation. A 2-8 MB weight streamed by a few dozen blocks is
// latency-bound (each block waits on its own long chain of loads), so the grid is (16-row
// tile) x (K slice): the C blocks of a thread-block cluster (C <= 8, portable) share one tile and
// each reads one contiguous K slice, every lane issuing all of its 16-byte weight loads (up to
// kSgUnroll x 2 rows) before using any. Within a block warp w owns rows 2w, 2w+1 of the tile;
// warp sums (fixed butterfly) go to shared memory, and after a cluster barrier block rank 0 adds
// the C partials of each output through distributed shared memory in rank order: deterministic,
// no atomics, no workspace (so the declaration of SmallGemv stays as it is).
constexpr int kSgThreads = 256;
constexpr int kSgWarps = kSgThreads / 32;
constexpr int kSgRowsPerWarp = 2;
constexpr int kSgRows = kSgWarps * kSgRowsPerWarp;  // rows per tile (block)
// 16-byte loads per lane per row in flight: 512 elements of K per warp pass (fp32: 4, bf16: 2),
// which is the whole slice of a 4096-wide K split 8 ways.
constexpr int kSgMaxCluster = 8;                      // portable cluster size
constexpr int64_t kSgMinSlice = 512;                  // K per block at least (elements)
constexpr int kSgMaxM = static_cast<int>(kSmallGemvMaxRows);

template <typename W>
__global__ void __launch_bounds__(kSgThreads, 3) SplitGemvKernel(const float* x, int m, int64_t k,
                                                              const W* w, int64_t n,
                                                              int64_t k_slice, float* y) {
  PdlTrigger();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned csize = cluster.num_blocks();
  const unsigned rank = cluster.block_rank();
  __shared__ float part[kSgMaxM][kSgRows];
  constexpr int kVec = 16 / sizeof(W);
  constexpr int kSgUnroll = 512 / (32 * kVec);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tile = blockIdx.x / csize;
  const int64_t k0 = static_cast<int64_t>(rank) * k_slice;
  const int64_t k1 = k0 + k_slice < k ? k0 + k_slice : k;
  const int64_t row0 = tile * kSgRows + warp * kSgRowsPerWarp;
  const W* wr[kSgRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kSgRowsPerWarp; ++r) {
    const int64_t row = row0 + r;
    wr[r] = w + (row < n ? row : 0) * k;  // rows past the end read row 0, never stored
  }
  float acc[kSgRowsPerWarp][kSgMaxM];
#pragma unroll
  for (int r = 0; r < kSgRowsPerWarp; ++r) {
#pragma unroll
    for (int j = 0; j < kSgMaxM; ++j) acc[r][j] = 0.0f;
  }
  constexpr int64_t kStep = 32 * kVec * kSgUnroll;
  uint4 raw[kSgUnroll][kSgRowsPerWarp];
  auto load = [&](int64_t cb) {
#pragma unroll
    for (int u = 0; u < kSgUnroll; ++u) {
      const int64_t c = cb + u * 32 * kVec;
#pragma unroll
      for (int r = 0; r < kSgRowsPerWarp; ++r) {
        raw[u][r] = c < k1 ? LoadWeights16(reinterpret_cast<const uint4*>(wr[r] + c))
                           : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // w is a plain weight: the first batch is loaded before the PDL wait (overlapping the previous
  // kernel's tail), x only after it; each later batch is loaded once the previous one is used.
  const int64_t first = k0 + lane * kVec;
  if (first < k1) load(first);
  PdlWait();
  for (int64_t cb = first; cb < k1; cb += kStep) {
#pragma unroll
    for (int u = 0; u < kSgUnroll; ++u) {
      const int64_t c = cb + u * 32 * kVec;
      if (c >= k1) break;
      float wv[kSgRowsPerWarp][kVec];
#pragma unroll
      for (int r = 0; r < kSgRowsPerWarp; ++r) {
        if constexpr (sizeof(W) == 2) {
          const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[u][r]);
#pragma unroll
          for (int v = 0; v < kVec / 2; ++v) {
            const float2 f = __bfloat1622float2(p2[v]);
            wv[r][2 * v] = f.x;
            wv[r][2 * v + 1] = f.y;
          }
        } else {
          const float* pf = reinterpret_cast<const float*>(&raw[u][r]);
#pragma unroll
          for (int v = 0; v < kVec; ++v) wv[r][v] = pf[v];
        }
      }
#pragma unroll
      for (int j = 0; j < kSgMaxM; ++j) {
        if (j < m) {
          float xv[kVec];
          const float4* xp = reinterpret_cast<const float4*>(x + j * k + c);
#pragma unroll
          for (int v4 = 0; v4 < kVec / 4; ++v4) {
            const float4 f = __ldg(xp + v4);
            xv[4 * v4] = f.x;
            xv[4 * v4 + 1] = f.y;
            xv[4 * v4 + 2] = f.z;
            xv[4 * v4 + 3] = f.w;
          }
          if constexpr (sizeof(W) == 2) {
#pragma unroll
            for (int v = 0; v < kVec; ++v) xv[v] = __bfloat162float(__float2bfloat16_rn(xv[v]));
          }
#pragma unroll
          for (int r = 0; r < kSgRowsPerWarp; ++r) {
            float sum = 0.0f;
#pragma unroll
            for (int v = 0; v < kVec; ++v) sum += wv[r][v] * xv[v];
            acc[r][j] += sum;
          }
        }
      }
    }
    if (cb + kStep < k1) load(cb + kStep);
  }
#pragma unroll
  for (int j = 0; j < kSgMaxM; ++j) {
    if (j < m) {  // uniform
#pragma unroll
      for (int r = 0; r < kSgRowsPerWarp; ++r) {
        const float v = WarpSum(acc[r][j]);
        if (lane == 0) part[j][warp * kSgRowsPerWarp + r] = v;
      }
    }
  }
  cluster.sync();  // every block's partials are written and visible cluster-wide
  if (rank == 0 && threadIdx.x < m * kSgRows) {
    const int j = threadIdx.x / kSgRows, r = threadIdx.x % kSgRows;
    float sum = 0.0f;
    for (unsigned s = 0; s < csize; ++s) sum += *cluster.map_shared_rank(&part[j][r], s);
    const int64_t row = tile * kSgRows + r;
    if (row < n) y[static_cast<int64_t>(j) * n + row] = sum;
  }
  cluster.sync();  // no block leaves while rank 0 still reads its shared memory
}

template <typename W>
absl::Status LaunchSplitGemv(const float* x, int64_t m, int64_t k, const W* w, int64_t n,
                             float* y, cudaStream_t stream) {
  const int64_t tiles = (n + kSgRows - 1) / kSgRows;
  const int64_t c = std::min<int64_t>(kSgMaxCluster, std::max<int64_t>(1, k / kSgMinSlice));
  // Slices of whole 8-element vectors (16 bytes of bf16, two of fp32).
  const int64_t k_slice = ((k + c - 1) / c + 7) / 8 * 8;
  CUDA_RETURN_IF_ERROR(LaunchPdlCluster(SplitGemvKernel<W>, dim3(static_cast<unsigned>(tiles * c)),
                                        dim3(kSgThreads), 0, stream, static_cast<unsigned>(c), x,
                                        static_cast<int>(m), k, w, n, k_slice, y));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
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

// One batch of a warp's weights: k blocks kb .. kb + kUnroll - 1 of rows lo and hi (zeros past
// `end`), all loads issued before any is used (the guards are uniform across the warp).
template <int kUnroll>
__device__ __forceinline__ void LoadWeightBatch(uint4 (&lo)[kUnroll], uint4 (&hi)[kUnroll],
                                                const uint4* wlo, const uint4* whi, int kb,
                                                int end) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (kb + u < end) {
      lo[u] = LoadWeights16(wlo + (kb + u) * (kMmaKBlock / 8));
      hi[u] = LoadWeights16(whi + (kb + u) * (kMmaKBlock / 8));
    } else {
      lo[u] = hi[u] = make_uint4(0, 0, 0, 0);
    }
  }
}

// One warp's tile of an expert's weight W [rows, k_in] (bf16): output columns out_lo (accumulator
// rows grp: c0, c1) and out_hi (rows grp + 8: c2, c3), and the lane's 16-byte weight streams of
// the W rows behind them. kSwiGlu: gate row c and up row I + c of column c = tile * 8 + grp;
// otherwise rows tile * 16 + grp and + 8. Rows past the end read row 0 instead (in bounds; their
// results are not stored).
struct MmaTile {
  int64_t out_lo, out_hi;
  bool ok_lo, ok_hi;
  bool live;  // the tile has any rows (uniform across the warp)
  const uint4* wlo;
  const uint4* whi;
};

template <bool kSwiGlu>
__device__ __forceinline__ MmaTile MakeMmaTile(const __nv_bfloat16* weight, int32_t e, int64_t tile,
                                               int64_t n_out, int64_t k_in) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
  const int64_t w_rows = kSwiGlu ? 2 * n_out : n_out;
  const __nv_bfloat16* we = weight + static_cast<int64_t>(e) * w_rows * k_in;
  MmaTile t;
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
  t.wlo = reinterpret_cast<const uint4*>(we + (t.ok_lo ? row_lo : 0) * k_in) + quad;
  t.whi = reinterpret_cast<const uint4*>(we + (t.ok_hi ? row_hi : 0) * k_in) + quad;
  return t;
}

// Stores one group's accumulators: tokens g0 + 2 * quad (c0/c2) and g0 + 2 * quad + 1 (c1/c3)
// of the ng in the group. kSwiGlu: acc[h] gate and acc[2 + h] up of column out_lo, h (bf16) in
// assignment order; otherwise rows out_lo and out_hi of y (fp32), at order[a] with scatter_out.
template <bool kSwiGlu>
__device__ __forceinline__ void StoreMmaGroup(const float (&acc)[4], int32_t g0, int ng, int quad,
                                              const MmaTile& mt, int64_t n_out, float limit,
                                              bool scatter_out, const int32_t* order, void* y) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = 2 * quad + h;
    if (j >= ng) continue;
    if constexpr (kSwiGlu) {
      if (mt.ok_lo) {
        // SwiGluKernel's clamps and expression.
        const float gate = fminf(acc[h], limit);
        const float up = fminf(fmaxf(acc[2 + h], -limit), limit);
        static_cast<__nv_bfloat16*>(y)[static_cast<int64_t>(g0 + j) * n_out + mt.out_lo] =
            __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up);
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
// reads word (kb * groups + g) * 32 + l, as in the narrow layout. Per group the products go
// through the same mma sequence as in ExpertMmaKernel with kSplitK 1 (k blocks in order, two
// steps each): the same bits as that kernel (with K split, as for small expert grids, the
// narrow kernel adds partial sums and differs in the last bits). Launched only where an expert
// can have more than 8 assignments (more than 8 tokens) and the experts average at least 4.
constexpr int kWideUnroll = 4;  // k blocks of weights in registers per lane
// Two blocks per SM (16 warps streaming weights; one block of 8 warps reached half the
// bandwidth): at most 128 registers per thread and 100 KiB of staged activations per block.
constexpr int kWideBlocksPerSm = 2;
constexpr size_t kWideMaxSmemBytes = 100 * 1024;
template <typename X, bool kSwiGlu, int kWideGroups>
__global__ void __launch_bounds__(kMmaThreads, kWideBlocksPerSm)
    ExpertMmaWideKernel(const X* x, int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                        const __nv_bfloat16* weight, int64_t n_out, int64_t k_in, float limit,
                        const int32_t* order, const int32_t* offsets, const int32_t* wide,
                        const int32_t* num_wide, int smem_words, void* y) {
  constexpr int kWideTokens = kWideGroups * kMmaTokens;
  // Staging loads in flight per thread: fewer where the accumulators take more registers.
  constexpr int kWideStageUnroll = kWideGroups > 4 ? 2 : 4;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint4* sx = reinterpret_cast<uint4*>(smem_raw);  // smem_words 16-byte words
  // Block y takes the y-th expert of the wide list (the sort kernels write it).
  if (static_cast<int32_t>(blockIdx.y) >= *num_wide) return;  // uniform across the block
  const int32_t e = wide[blockIdx.y];
  const int32_t a0 = offsets[e], a1 = offsets[e + 1];
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kMmaWarps + threadIdx.x / 32;
  const MmaTile mt = MakeMmaTile<kSwiGlu>(weight, e, tile, n_out, k_in);
  const bool live = mt.live;
  const int kblocks = static_cast<int>(k_in / kMmaKBlock);
  const int lane = threadIdx.x & 31, quad = lane & 3;
  // K blocks per chunk for a pass of n assignments: as many as the staged words hold (>= 1: the
  // launcher gives at least kWideTokens * 4 words, one k block of a full pass).
  auto chunk_of = [&](int n) {
    const int c = smem_words / (((n + kMmaTokens - 1) / kMmaTokens) * 32);
    return c < kblocks ? c : kblocks;
  };
  uint4 lo[kWideUnroll], hi[kWideUnroll];
  // The batch of k blocks kb .. min(kb + kWideUnroll, end) - 1.
  auto load_batch = [&](int kb, int end) { LoadWeightBatch(lo, hi, mt.wlo, mt.whi, kb, end); };
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
      for (int i = threadIdx.x; i < (c1 - c0) * (padded - n) * 4; i += kMmaThreads) {
        const int kb = i / ((padded - n) * 4), rem = i - kb * (padded - n) * 4;
        const int j = n + rem / 4;
        sx[(kb * groups + j / kMmaTokens) * 32 + (j % kMmaTokens) * 4 + (rem & 3)] =
            make_uint4(0, 0, 0, 0);
      }
      // Token-major, so that consecutive threads read consecutive 8-element pieces of one row.
      const int per_token = (c1 - c0) * 4;
      StageWords<kWideStageUnroll>(n * per_token, sx, [&](int wi, uint4* v) {
        const int j = wi / per_token, rem = wi - j * per_token;
        const int kb = rem >> 2, q = rem & 3;
        const int64_t src = by_token ? order[p0 + j] / top_k : p0 + j;
        *v = LoadBf16x8(x + src * ldx + (c0 + kb) * kMmaKBlock + q * 8);
        return (kb * groups + j / kMmaTokens) * 32 + (j % kMmaTokens) * 4 + q;
      });
      __syncthreads();
      if (live) {
        // The batch at kb is in lo/hi on entry to each iteration.
        for (int kb = c0; kb < c1; kb += kWideUnroll) {
#pragma unroll
          for (int u = 0; u < kWideUnroll; ++u) {
            if (kb + u < c1) {
              const uint4* xs = sx + ((kb + u - c0) * groups) * 32 + lane;
#pragma unroll
              for (int g = 0; g < kWideGroups; ++g) {
                if (g < groups) {
                  const uint4 b = xs[g * 32];
                  MmaBf16(acc[g], lo[u].x, hi[u].x, lo[u].y, hi[u].y, b.x, b.y);
                  MmaBf16(acc[g], lo[u].z, hi[u].z, lo[u].w, hi[u].w, b.z, b.w);
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
// (or, with `active` null, rows [0, dense_rows) of x against one weight), W bf16 [rows, k_in],
// k_in % 32 == 0; x fp32 (rounded to bf16 here) or bf16; x and W 16-byte aligned. src(a) as in
// GroupedGemvKernel. With `scatter_out`, row a of y is written at order[a] (the assignment's
// (t, k) index) so that the combine needs no inverse permutation. kSwiGlu: see above; n_out = I,
// W has 2I rows, y is bf16 h.
template <typename X, bool kSwiGlu, int kSplitK>
__global__ void __launch_bounds__(kMmaThreads, 2)
    ExpertMmaKernel(const X* x, int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                    const __nv_bfloat16* weight, int64_t n_out, int64_t k_in, float limit,
                    const int32_t* order, const int32_t* offsets, const int32_t* active,
                    const int32_t* num_active, int32_t dense_rows, bool skip_wide, void* y) {
  static_assert(kMmaWarps % kSplitK == 0, "the warps of a block split into whole tiles");
  constexpr int kTilesPerBlock = kMmaWarps / kSplitK;
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
  const MmaTile mt = MakeMmaTile<kSwiGlu>(weight, e, tile, n_out, k_in);
  const bool live = mt.live;
  const int kblocks = static_cast<int>(k_in / kMmaKBlock);
  const int kb_begin = slice * kblocks / kSplitK, kb_end = (slice + 1) * kblocks / kSplitK;
  const int items = kblocks * 32;  // 16-byte words of the staged group

  // One batch of weights: kMmaUnroll k blocks of rows lo and hi, all loads issued before any is
  // used (the guards are uniform across the warp). Weights do not depend on x, so the first batch
  // of the first group is requested before the staging below, and the first batch of the next
  // group (the same rows again) before that group's staging: the weight stream does not wait for
  // the x round trip and the barriers.
  uint4 lo[kMmaUnroll], hi[kMmaUnroll];
  auto load_batch = [&](int kb) { LoadWeightBatch(lo, hi, mt.wlo, mt.whi, kb, kb_end); };
  if (live && a0 < a1) load_batch(kb_begin);

  for (int32_t g0 = a0; g0 < a1; g0 += kMmaTokens) {
    const int ng = a1 - g0 < kMmaTokens ? a1 - g0 : kMmaTokens;
    __syncthreads();  // the previous group's readers of sx (and red) are done
    // Word i holds token j = (i / 4) % 8, k = (i / 32) * 32 + (i % 4) * 8 .. + 7; tokens past
    // the group are zeros (their columns are never stored), written without loads. The group's
    // own words (kblocks * 4 * ng of them, w -> k block w / (4 ng), token (w % (4 ng)) / 4,
    // quarter w % 4) are loaded kStageUnroll per thread at a time, loads first, then the stores:
    // a decode group of one token takes one round trip, not items / (256 * kStageUnroll).
    if (ng < kMmaTokens) {
      for (int i = threadIdx.x; i < items; i += kMmaThreads) {
        if (((i >> 2) & (kMmaTokens - 1)) >= ng) sx[i] = make_uint4(0, 0, 0, 0);
      }
    }
    const int words_per_kb = 4 * ng;
    StageWords<kStageUnroll>(kblocks * words_per_kb, sx, [&](int wi, uint4* v) {
      const int kb = wi / words_per_kb;
      const int rem = wi - kb * words_per_kb;
      const int j = rem >> 2, q = rem & 3;
      const int64_t src = by_token ? order[g0 + j] / top_k : g0 + j;
      *v = LoadBf16x8(x + src * ldx + kb * kMmaKBlock + q * 8);
      return kb * 32 + j * 4 + q;
    });
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const uint4* xs = sx + lane;
      const bool more_groups = g0 + kMmaTokens < a1;
      // The batch at kb is in lo/hi on entry to each iteration.
      for (int kb = kb_begin; kb < kb_end; kb += kMmaUnroll) {
#pragma unroll
        for (int u = 0; u < kMmaUnroll; ++u) {
          if (kb + u < kb_end) {
            const uint4 b = xs[(kb + u) * 32];
            MmaBf16(acc, lo[u].x, hi[u].x, lo[u].y, hi[u].y, b.x, b.y);
            MmaBf16(acc, lo[u].z, hi[u].z, lo[u].w, hi[u].w, b.z, b.w);
          }
        }
        if (kb + kMmaUnroll < kb_end) {
          load_batch(kb + kMmaUnroll);
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

// out[t] = Σ_k weights[t, k] · y[pos(t, k)], k in order; pos is the identity (y already in
// (t, k) order) when `position` is null.
__global__ void CombineKernel(const float* y, const int32_t* position, const float* weights,
                              int64_t top_k, int64_t dim, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t p = position != nullptr ? position[t * top_k + k] : t * top_k + k;
      acc += weights[t * top_k + k] * y[p * dim + i];
    }
    out[t * dim + i] = acc;
  }
}

__global__ void InvertKernel(const int32_t* order, int64_t n, int32_t* position) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    position[order[i]] = static_cast<int32_t>(i);
  }
}

struct Workspace {
  int32_t* keys_out;
  int32_t* order_in;
  int32_t* order;
  int32_t* position;
  int32_t* offsets;
  int32_t* active;
  int32_t* num_active;
  int32_t* wide;
  int32_t* num_wide;
  float* gu;
  float* h;
  float* y;
  void* sort_temp;
  size_t sort_bytes;
};

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

// Whether ExpertMmaKernel takes a reduction of length k_in (the staged group must fit in shared
// memory) over these operands (16-byte vector loads).
bool MmaFits(int64_t k_in) {
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

template <typename X, bool kSwiGlu, int kSplitK>
absl::Status LaunchExpertMma(dim3 grid, cudaStream_t stream, const X* x, int64_t ldx, bool by_token,
                             bool scatter_out, int64_t top_k, const __nv_bfloat16* weight,
                             int64_t n_out, int64_t k_in, float limit, const int32_t* order,
                             const int32_t* offsets, const int32_t* active,
                             const int32_t* num_active, int32_t dense_rows, bool wide, void* y) {
  const size_t smem = static_cast<size_t>(k_in) * kMmaTokens * sizeof(__nv_bfloat16);
  auto kernel = ExpertMmaKernel<X, kSwiGlu, kSplitK>;
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
bool UseWide(bool wide, int64_t tokens, int64_t assignments, int64_t experts) {
  return wide && tokens > kMmaTokens && assignments >= 4 * experts;
}

// ExpertMmaWideKernel with kWideGroups groups per pass over at most a / (kMmaTokens + 1) experts
// (those with more than kMmaTokens of the a assignments; the blocks past the wide list's length
// return at once).
template <typename X, bool kSwiGlu, int kWideGroups>
absl::Status LaunchExpertMmaWide(int64_t assignments, unsigned max_active, cudaStream_t stream,
                                 const X* x, int64_t ldx, bool by_token, bool scatter_out,
                                 int64_t top_k, const __nv_bfloat16* weight, int64_t n_out,
                                 int64_t k_in, float limit, const int32_t* order,
                                 const int32_t* offsets, const int32_t* wide,
                                 const int32_t* num_wide, void* y) {
  const unsigned experts =
      static_cast<unsigned>(std::min<int64_t>(max_active, assignments / (kMmaTokens + 1)));
  if (experts == 0) return absl::OkStatus();
  // All of K for a full pass, or as much as fits.
  const size_t smem =
      std::min<size_t>(static_cast<size_t>(k_in) * kWideGroups * kMmaTokens * sizeof(__nv_bfloat16),
                       kWideMaxSmemBytes) /
      512 * 512;
  auto kernel = ExpertMmaWideKernel<X, kSwiGlu, kWideGroups>;
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
template <typename X, bool kSwiGlu>
absl::Status LaunchExpertMmaWideFor(int64_t experts, int64_t assignments, unsigned max_active,
                                    cudaStream_t stream, const X* x, int64_t ldx, bool by_token,
                                    bool scatter_out, int64_t top_k, const __nv_bfloat16* weight,
                                    int64_t n_out, int64_t k_in, float limit, const int32_t* order,
                                    const int32_t* offsets, const int32_t* wide,
                                    const int32_t* num_wide, void* y) {
  if (assignments >= 16 * experts) {
    return LaunchExpertMmaWide<X, kSwiGlu, 8>(assignments, max_active, stream, x, ldx, by_token,
                                              scatter_out, top_k, weight, n_out, k_in, limit, order,
                                              offsets, wide, num_wide, y);
  }
  return LaunchExpertMmaWide<X, kSwiGlu, 4>(assignments, max_active, stream, x, ldx, by_token,
                                            scatter_out, top_k, weight, n_out, k_in, limit, order,
                                            offsets, wide, num_wide, y);
}

// K split over the warps of a block (kSplitK tiles per block fewer, kSplitK times the blocks)
// when the expert grid is small (decode: 6 experts x 32 blocks at T = 1, below 1.5 blocks per
// SM): more, shorter weight streams in flight. Depends on the shapes only (graph capture).
int MoeSplitK(unsigned blocks_per_expert, unsigned max_active) {
  const int64_t blocks = int64_t{blocks_per_expert} * max_active;
  if (blocks <= 264) return 4;  // <= 2 blocks per SM of 132
  if (blocks <= 528) return 2;
  return 1;
}

template <typename X, bool kSwiGlu>
absl::Status LaunchExpertMmaSplit(int split, unsigned max_active, cudaStream_t stream, const X* x,
                                  int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                                  const __nv_bfloat16* weight, int64_t n_out, int64_t k_in,
                                  float limit, const int32_t* order, const int32_t* offsets,
                                  const int32_t* active, const int32_t* num_active,
                                  int32_t dense_rows, bool wide, void* y) {
  switch (split) {
    case 4:
      return LaunchExpertMma<X, kSwiGlu, 4>(dim3(MmaBlocks<kSwiGlu, 4>(n_out), max_active), stream,
                                            x, ldx, by_token, scatter_out, top_k, weight, n_out,
                                            k_in, limit, order, offsets, active, num_active,
                                            dense_rows, wide, y);
    case 2:
      return LaunchExpertMma<X, kSwiGlu, 2>(dim3(MmaBlocks<kSwiGlu, 2>(n_out), max_active), stream,
                                            x, ldx, by_token, scatter_out, top_k, weight, n_out,
                                            k_in, limit, order, offsets, active, num_active,
                                            dense_rows, wide, y);
    default:
      return LaunchExpertMma<X, kSwiGlu, 1>(dim3(MmaBlocks<kSwiGlu, 1>(n_out), max_active), stream,
                                            x, ldx, by_token, scatter_out, top_k, weight, n_out,
                                            k_in, limit, order, offsets, active, num_active,
                                            dense_rows, wide, y);
  }
}

size_t SortTempBytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(n));
  return bytes;
}

// Lays out (or, with base == nullptr, sizes) the workspace.
size_t Layout(const ExpertsDims& d, void* base, Workspace* w) {
  const int64_t a = d.tokens * d.top_k;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* p = base == nullptr ? nullptr : static_cast<char*>(base) + off;
    off += Align(bytes);
    return p;
  };
  w->keys_out = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->order_in = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->order = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->position = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->offsets = static_cast<int32_t*>(take(sizeof(int32_t) * (d.experts + 1)));
  w->active = static_cast<int32_t*>(take(sizeof(int32_t) * d.experts));
  w->num_active = static_cast<int32_t*>(take(sizeof(int32_t)));
  w->wide = static_cast<int32_t*>(take(sizeof(int32_t) * d.experts));
  w->num_wide = static_cast<int32_t*>(take(sizeof(int32_t)));
  w->gu = static_cast<float*>(take(sizeof(float) * a * 2 * d.inter));
  w->h = static_cast<float*>(take(sizeof(float) * a * d.inter));
  w->y = static_cast<float*>(take(sizeof(float) * a * d.dim));
  w->sort_bytes = SortTempBytes(a);
  w->sort_temp = take(w->sort_bytes);
  return off;
}

}  // namespace

absl::Status Route(const RouterDims& d, const float* logits, const float* bias,
                   const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx, float* weights,
                   cudaStream_t stream) {
  if (d.experts > 32 * kMaxExpertsPerLane || d.top_k > kMaxTopK) {
    return absl::UnimplementedError("router: at most 1024 experts and top-16 are compiled");
  }
  if (d.tokens == 0) return absl::OkStatus();
  const int threads = 128;
  const unsigned blocks = static_cast<unsigned>((d.tokens * 32 + threads - 1) / threads);
  const int64_t per_lane = (d.experts + 31) / 32;
  cudaError_t err = cudaSuccess;
  auto launch = [&](auto kernel) {
    err = LaunchPdl(kernel, dim3(blocks), dim3(threads), 0, stream, d, logits, bias, tid2eid,
                    token_ids, idx, weights);
  };
  if (per_lane <= 1) {
    launch(RouteKernel<1>);
  } else if (per_lane <= 2) {
    launch(RouteKernel<2>);
  } else if (per_lane <= 4) {
    launch(RouteKernel<4>);
  } else if (per_lane <= 8) {
    launch(RouteKernel<8>);
  } else if (per_lane <= 16) {
    launch(RouteKernel<16>);
  } else {
    launch(RouteKernel<32>);
  }
  CUDA_RETURN_IF_ERROR(err);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float limit, float* h,
                    cudaStream_t stream) {
  if (rows * inter == 0) return absl::OkStatus();
  const int64_t n = rows * inter;
  SwiGluKernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)), 256, 0, stream>>>(
      gate_up, rows, inter, limit, h);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

size_t MoeWorkspaceBytes(const ExpertsDims& d) {
  Workspace w;
  return Layout(d, nullptr, &w);
}

absl::Status SmallGemv(const float* x, int64_t m, int64_t k, const void* w, DType wdtype, int64_t n,
                       float* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (m > kSmallGemvMaxRows || k % 8 != 0) {
    return absl::InvalidArgumentError("SmallGemv: needs m <= 8 and k a multiple of 8");
  }
  if (Aligned16(x) && Aligned16(w) && (wdtype == DType::kBF16 || wdtype == DType::kF32)) {
    // Split-K over a cluster: >= 128 blocks for a 256-row, 4096-wide weight.
    if (wdtype == DType::kBF16) {
      return LaunchSplitGemv(x, m, k, static_cast<const __nv_bfloat16*>(w), n, y, stream);
    }
    return LaunchSplitGemv(x, m, k, static_cast<const float*>(w), n, y, stream);
  }
  constexpr int kRows = kGemvRowsPerWarp * kWarps;
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows), 1);
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<__nv_bfloat16, kGemvRowsPerWarp><<<grid, kGemmThreads, 0, stream>>>(
        x, k, false, 1, static_cast<const __nv_bfloat16*>(w), n, k, nullptr, nullptr, nullptr,
        nullptr, static_cast<int32_t>(m), y);
  } else {
    GroupedGemvKernel<float, kGemvRowsPerWarp><<<grid, kGemmThreads, 0, stream>>>(
        x, k, false, 1, static_cast<const float*>(w), n, k, nullptr, nullptr, nullptr, nullptr,
        static_cast<int32_t>(m), y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MoeExperts(const ExpertsDims& d, const float* u, const int32_t* idx,
                        const float* weights, const void* gate_up, const void* down, DType wdtype,
                        void* workspace, float* out, cudaStream_t stream, bool wide) {
  if (d.tokens == 0) return absl::OkStatus();
  if (d.dim % 8 != 0 || d.inter % 8 != 0) {
    return absl::UnimplementedError("MoE: hidden and intermediate sizes must be multiples of 8");
  }
  Workspace w;
  Layout(d, workspace, &w);
  const int64_t a = d.tokens * d.top_k;
  const bool mma = wdtype == DType::kBF16 && MmaFits(d.dim) && MmaFits(d.inter) && Aligned16(u) &&
                   Aligned16(gate_up) && Aligned16(down);
  // Experts with more than 8 assignments go to the wide kernel when one can have them; the sort
  // kernels list them.
  const bool use_wide = mma && UseWide(wide, d.tokens, a, d.experts);
  int32_t* wide_list = use_wide ? w.wide : nullptr;
  // Sort the assignments (t, k) by expert; radix sort is stable, so each expert's assignments
  // stay in (t, k) order.
  const size_t offsets_smem = sizeof(int32_t) * static_cast<size_t>(d.experts);
  if (a <= kSmallSortMax) {
    // Decode: sort, offsets and active list in one launch.
    if (offsets_smem > 32 * 1024) {  // + ~8 KiB static: under the 48 KiB default
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(SmallSortKernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(offsets_smem)));
    }
    SmallSortKernel<<<1, kOffsetsThreads, offsets_smem, stream>>>(
        idx, a, d.experts, w.order, w.offsets, w.active, w.num_active, wide_list, w.num_wide);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  } else {
    IotaKernel<<<static_cast<unsigned>((a + 255) / 256), 256, 0, stream>>>(w.order_in, a);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    size_t sort_bytes = w.sort_bytes;
    int end_bit = 1;
    while ((int64_t{1} << end_bit) < d.experts) ++end_bit;
    CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(w.sort_temp, sort_bytes, idx,
                                                         w.keys_out, w.order_in, w.order,
                                                         static_cast<int>(a), 0, end_bit, stream));
    if (offsets_smem > 48 * 1024) {
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(OffsetsKernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(offsets_smem)));
    }
    OffsetsKernel<<<1, kOffsetsThreads, offsets_smem, stream>>>(
        w.keys_out, a, d.experts, w.offsets, w.active, w.num_active, wide_list, w.num_wide);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(d.experts, a));
  if (mma) {
    // Tensor-core path: gate_up with SwiGLU in its epilogue (h in bf16, the precision the down
    // projection reads it at), then down writing y in (t, k) order for the combine.
    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(w.h);
    const auto* gu_w = static_cast<const __nv_bfloat16*>(gate_up);
    const auto* dn_w = static_cast<const __nv_bfloat16*>(down);
    RETURN_IF_ERROR((LaunchExpertMmaSplit<float, true>(
        MoeSplitK(MmaBlocks<true, 1>(d.inter), max_active), max_active, stream, u, d.dim, true,
        false, d.top_k, gu_w, d.inter, d.dim, d.swiglu_limit, w.order, w.offsets, w.active,
        w.num_active, 0, use_wide, h)));
    if (use_wide) {
      RETURN_IF_ERROR((LaunchExpertMmaWideFor<float, true>(
          d.experts, a, max_active, stream, u, d.dim, true, false, d.top_k, gu_w, d.inter, d.dim,
          d.swiglu_limit, w.order, w.offsets, w.wide, w.num_wide, h)));
    }
    RETURN_IF_ERROR((LaunchExpertMmaSplit<__nv_bfloat16, false>(
        MoeSplitK(MmaBlocks<false, 1>(d.dim), max_active), max_active, stream, h, d.inter, false,
        true, d.top_k, dn_w, d.dim, d.inter, 0.0f, w.order, w.offsets, w.active, w.num_active, 0,
        use_wide, w.y)));
    if (use_wide) {
      RETURN_IF_ERROR((LaunchExpertMmaWideFor<__nv_bfloat16, false>(
          d.experts, a, max_active, stream, h, d.inter, false, true, d.top_k, dn_w, d.dim, d.inter,
          0.0f, w.order, w.offsets, w.wide, w.num_wide, w.y)));
    }
    CombineKernel<<<static_cast<unsigned>(d.tokens), 256, 0, stream>>>(w.y, nullptr, weights,
                                                                       d.top_k, d.dim, out);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  InvertKernel<<<static_cast<unsigned>((a + 255) / 256), 256, 0, stream>>>(w.order, a, w.position);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  const int64_t n_gu = 2 * d.inter;
  constexpr int kRows = kMoeRowsPerWarp * kWarps;
  const dim3 grid_gu(static_cast<unsigned>((n_gu + kRows - 1) / kRows), max_active);
  const dim3 grid_down(static_cast<unsigned>((d.dim + kRows - 1) / kRows), max_active);
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<__nv_bfloat16, kMoeRowsPerWarp><<<grid_gu, kGemmThreads, 0, stream>>>(
        u, d.dim, true, d.top_k, static_cast<const __nv_bfloat16*>(gate_up), n_gu, d.dim, w.order,
        w.offsets, w.active, w.num_active, 0, w.gu);
  } else {
    GroupedGemvKernel<float, kMoeRowsPerWarp><<<grid_gu, kGemmThreads, 0, stream>>>(
        u, d.dim, true, d.top_k, static_cast<const float*>(gate_up), n_gu, d.dim, w.order,
        w.offsets, w.active, w.num_active, 0, w.gu);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  absl::Status st = SwiGlu(w.gu, a, d.inter, d.swiglu_limit, w.h, stream);
  if (!st.ok()) return st;
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<__nv_bfloat16, kMoeRowsPerWarp><<<grid_down, kGemmThreads, 0, stream>>>(
        w.h, d.inter, false, d.top_k, static_cast<const __nv_bfloat16*>(down), d.dim, d.inter,
        w.order, w.offsets, w.active, w.num_active, 0, w.y);
  } else {
    GroupedGemvKernel<float, kMoeRowsPerWarp><<<grid_down, kGemmThreads, 0, stream>>>(
        w.h, d.inter, false, d.top_k, static_cast<const float*>(down), d.dim, d.inter, w.order,
        w.offsets, w.active, w.num_active, 0, w.y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  CombineKernel<<<static_cast<unsigned>(d.tokens), 256, 0, stream>>>(w.y, w.position, weights,
                                                                     d.top_k, d.dim, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
