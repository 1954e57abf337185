// FP8 block-scaled products (fp8_linear.h).
//
// Fp8Gemv streams the e4m3 bytes once for all m <= 8 rows of x through the tensor cores:
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate) with 16 weight rows as the mma's m rows and the m
// rows of x as its n = 8 columns (the unused columns are zeros), as the bf16 expert GEMV of
// moe.cu does. Every e4m3 value is exact in bf16, so the weights go in exactly; x goes in as
// bf16(x) (round_x_bf16) or, in fp32 mode, as three bf16 terms whose sum is x exactly
// (hi = bf16(x), mid = bf16(x - hi), lo = x - hi - mid: 24 significant bits in three 8-bit
// pieces), three mmas per step. The products are then exact and only the accumulation rounds
// (fp32). On CUDA cores the m products per weight (at m = 8, 8 FMAs per byte streamed) and the
// conversions would be the limit; the tensor cores make m nearly free, leaving the decode (a few
// integer operations per 4 bytes, E4m3x4ToBf16) as the only per-byte work. The NaN codes
// (S.1111.111, absent from the release) decode as ±480 there; Fp8Dequantize keeps them NaN.
// Fp8GemvFits: cols % 16 == 0 (whole 16-byte loads), block_cols % 64 == 0 (a k step in one scale
// block), group_rows all rows or a multiple of 32 (a warp tile in one group), 16-byte aligned x
// and codes.
//
// Work split: each warp owns a tile of 32 weight rows (two 16-row mma tiles sharing the B
// fragments, so x is read once per 32 rows) and one k slice of it; kW warps of a block take the
// kW slices of one tile (blocks of at least 8 warps: 8 / kW tiles each), their partial sums meet
// in shared memory and are added in slice order. The grid aims at one wave of kSmWarps = 16
// warps on each of ~128 SMs (the H200 has 132): k is split in powers of two, at most 16 ways,
// until tiles x slices reaches 2048 warps or a slice would drop under 128 columns. 16 resident
// warps per SM leave 128 registers per thread, what two steps of loads in flight and fp32 mode's
// three x terms need without spills. A grid of few tiles (under 2048 rows: wq_a, wkv, 16-32
// tiles) would stream on as few SMs, so there a tile's slices (up to 8 x 8 of at least 128
// columns, aiming at ~2 cluster blocks per SM) go to a thread-block cluster of C blocks of 8
// warps (one tile per block, slices rank * 8 .. rank * 8 + 7; about 2 steps per warp, all in
// flight at once), and block rank 0 adds the blocks' sums through distributed shared memory in
// rank order (as SplitGemvKernel in small_gemv.cu). Within a slice a lane quad (lanes 4g..4g+3)
// reads 64 contiguous bytes of each of its rows g, g+8, g+16, g+24 per 64-wide k step: one
// 16-byte load (16 consecutive k) per lane and row. The loads run kDepth = 2 steps ahead of their use, a ring
// of two register sets (the load of step s + 2 is issued as step s is consumed; the first two
// go out before the PDL wait: weights and scales are constant), so every warp keeps 4 KiB in
// flight all along its slice (64 KiB per SM sustained). The dot product does not care how k is
// permuted as long as A and B see the same permutation, so lane quad q's 16 bytes at k0 + 16q
// feed four m16n8k16 steps j = 0..3 with no shuffles: word j (codes b0..b3 at k0 + 16q + 4j +
// 0..3) gives the A registers
//   a0 = row g (b0, b2), a1 = row g+8 (b0, b2), a2 = row g (b1, b3), a3 = row g+8 (b1, b3)
// i.e. the PTX fragment (a0: row g, logical k 2q, 2q+1; a1: row g+8; a2: row g, logical k 2q+8,
// 2q+9; a3: row g+8) under the map logical 2q, 2q+1, 2q+8, 2q+9 -> physical +0, +2, +1, +3, and
// B (b0: logical k 2q, 2q+1 of x row g; b1: 2q+8, 2q+9) is then (x0, x2), (x1, x3) of the float4
// of x row g at the same four k.
//
// Measured on the H200, warmed up (bench/dsv4_gpu_kernels_bench --fp8-only --warmup-ms 20
// --iters 500; bench/results/2026-12-02-quantized/runA/fp8_v*.log), in us, the former kernel
// (one step of loads in flight, 32 warps per SM, k split for ~4096 warps) in brackets:
//   M = 1: wq_b 13.4 (14.4), wo_a 14.1 (15.2), wo_b 14.2 (14.6), idx_wq_b 3.9 (5.7),
//          shared_down 4.1 (5.4), wq_a 4.3 (4.9), wkv 4.2 (4.7);
//   M = 8: about level: wq_b 10.6 (10.3), wo_a 10.8 (10.8), wo_b 11.5 (11.7), idx_wq_b 4.1 (6.1).
// Two other layouts measured in the same run, 16-row warp tiles (x read once per 16 rows) with
// 4 steps in flight at 16 warps per SM or 2 steps at 32, were slower at M = 8 (14 us).
//
// Scales: a 64-wide step lies in one scale block, so each thread accumulates a scale block's
// partial dot products in d (the tensor cores) and, at the block's end, adds scale(row, block) *
// d to its fp32 sums in acc (one fmaf per accumulator; the scales of a block are loaded as it
// starts). Summation order, all fixed: within a scale block the mma chain (k steps in order, j in
// order, hi/mid/lo in order), then the scale blocks in order (fmaf), then the k slices in order
// (warps, then cluster ranks): deterministic.
//
// Fp8Dequantize: an elementwise kernel, 16 columns of one row per thread (one 16-byte load), the
// same decode (NaN codes restored as NaN) times the fp32 scale of each column's block.
#include "kernels/cuda/fp8_linear.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <limits>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

// The warp tile (see the top of the file).
constexpr int kTileRows = 32;     // weight rows per warp tile
constexpr int kSubTiles = 2;      // 16-row mma tiles per warp tile
constexpr int kLaneRows = 4;      // rows per lane: g, g + 8, g + 16, g + 24
constexpr int kStepK = 64;        // k per step: a lane quad's 4 x 16 bytes of a row
constexpr int kDepth = 2;         // k steps of loads in flight per warp
constexpr int kSliceAlign = 128;  // k slices are whole 128-column (default) scale blocks
// Resident warps per SM asked of the compiler (its register budget: 65536 / (32 kSmWarps) = 128
// registers per thread) and SMs the grid aims to fill: one wave of kSmWarps x kWaveSms warps.
constexpr int kSmWarps = 16;
constexpr int64_t kWaveSms = 128;
constexpr int kMaxSlices = kSmWarps;  // warps per tile: blocks of at most kSmWarps warps
constexpr int kMinBlockWarps = 8;     // blocks of at least 256 threads (several tiles)
// Grids of fewer than kClusterMaxRows rows take the cluster form when a tile gets at least
// 2 x kClusterWarps slices: about half the SMs or more then stream.
constexpr int64_t kClusterMaxRows = 2048;  // 64 tiles of 32 rows
constexpr int kClusterWarps = 8;         // warps (slices) per block of a cluster
constexpr int kMaxCluster = 8;           // portable cluster size
constexpr int64_t kClusterSmBlocks = 2;  // cluster blocks per SM aimed for

constexpr int BlockWarps(int slices) { return slices < kMinBlockWarps ? kMinBlockWarps : slices; }
// Resident blocks asked of the compiler: kSmWarps warps per SM.
constexpr int MinBlocks(int slices) {
  return kSmWarps / BlockWarps(slices) < 1 ? 1 : kSmWarps / BlockWarps(slices);
}

struct GemvArgs {
  const float* x;
  int64_t ldx;         // x row stride: (rows / group_rows) * cols
  Fp8Matrix w;
  int64_t group_rows;  // rows sharing one x vector (a multiple of 32 or all rows)
  int64_t tiles;       // ceil(rows / kTileRows)
  int slice;           // k per warp (a multiple of kSliceAlign)
  int m;
  float* y;
};

// Four e4m3 codes [b3 b2 b1 b0] (one little-endian 32-bit word) -> the bf16 pairs lo = (b0, b2)
// and hi = (b1, b3) (the lower code in the low half), exactly: each code's exponent and mantissa
// bits are moved under bf16's (S.EEEE.MMM -> S.0000EEEE.MMM0000, the value times 2^-120, e4m3
// subnormals landing on bf16 subnormals) and one bf16x2 multiply by 2^120 restores the exponent
// bias (exact: every e4m3 value is a normal bf16). The NaN codes S.1111.111 come out as ±480.
__device__ __forceinline__ void E4m3x4ToBf16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kSign = 0x80008000u;     // the sign bit of each half
  constexpr uint32_t kMag = 0x7f007f00u;      // exponent and mantissa of the halves' high bytes
  constexpr uint32_t kRebias = 0x7b807b80u;   // bf16 2^120 (exponent field 247) in both halves
  const uint32_t w02 = w << 8;                // b0 and b2 in the halves' high bytes
  const uint32_t l = (w02 & kSign) | ((w02 & kMag) >> 4);
  const uint32_t h = (w & kSign) | ((w & kMag) >> 4);
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(lo) : "r"(l), "r"(kRebias));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(hi) : "r"(h), "r"(kRebias));
}

__device__ __forceinline__ float Bf16Lo(uint32_t p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }

// Four consecutive activations (x0..x3) as the B registers of one mma: b[s] = ((x0, x2), (x1, x3))
// of term s, kSplits = 1: bf16(x); kSplits = 3: hi, mid, lo with hi + mid + lo = x exactly (each
// residual is exact in fp32).
template <int kSplits>
__device__ __forceinline__ void SplitX(float4 v, uint32_t (&b)[kSplits][2]) {
  float r0 = v.x, r1 = v.y, r2 = v.z, r3 = v.w;
#pragma unroll
  for (int s = 0; s < kSplits; ++s) {
    b[s][0] = PackBf16x2(r0, r2);
    b[s][1] = PackBf16x2(r1, r3);
    if (s + 1 < kSplits) {
      r0 -= Bf16Lo(b[s][0]);
      r2 -= Bf16Hi(b[s][0]);
      r1 -= Bf16Lo(b[s][1]);
      r3 -= Bf16Hi(b[s][1]);
    }
  }
}

__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Fp8Matrix::ScaleIndex of (r, column 0) in 32-bit arithmetic (the launchers keep rows and the
// scale count below 2^30), the grid's sizes divided out once.
struct ScaleRows {
  uint32_t part_rows, block_rows;
  uint32_t per_part, cols;  // ScaleRowsPerPart, ScaleCols
  __device__ __forceinline__ explicit ScaleRows(const Fp8Matrix& w)
      : part_rows(static_cast<uint32_t>(w.PartRows())),
        block_rows(static_cast<uint32_t>(w.block_rows)),
        per_part(static_cast<uint32_t>(w.ScaleRowsPerPart())),
        cols(static_cast<uint32_t>(w.ScaleCols())) {}
  __device__ __forceinline__ int32_t Base(uint32_t r) const {
    const uint32_t part = r / part_rows;
    return static_cast<int32_t>((part * per_part + (r - part * part_rows) / block_rows) * cols);
  }
};

// The GEMV (see the top of the file). Block: BlockWarps(kW) warps = tiles_per_block tiles x kW k
// slices (warp w: tile w / kW, slice w % kW); kCluster (kW = kClusterWarps, one tile per block):
// the cluster's blocks share the tile, block rank c taking slices c * kW + w. Lane rows:
// tile * 32 + g + 8i (i < 4; i = 2t + h: mma tile t, accumulator half h). Accumulators: d[t] /
// acc[t] of mma tile t (c0, c1: row 16t + g, x rows 2q, 2q + 1; c2, c3: row 16t + g + 8). k and
// cols in 32 bits (ValidMatrix).
template <int kSplits, int kW, bool kCluster>
__global__ void __launch_bounds__(32 * BlockWarps(kW), MinBlocks(kW))
    Fp8GemvKernel(const GemvArgs a) {
  constexpr int kWarps = BlockWarps(kW);
  constexpr int kTilesPerBlock = kWarps / kW;
  static_assert(!kCluster || (kW == kClusterWarps && kTilesPerBlock == 1), "cluster blocks");
  PdlTrigger();
  __shared__ int32_t scale_row[kTilesPerBlock * kTileRows];
  __shared__ float4 red[kW > 1 ? kWarps : 1][kSubTiles][32];
  __shared__ float4 part[kCluster ? kSubTiles : 1][32];  // the block's sums (cluster form)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const Fp8Matrix& w = a.w;
  const int64_t rows = w.rows;
  const int cols = static_cast<int>(w.cols);
  unsigned rank = 0, csize = 1;
  if constexpr (kCluster) {
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    rank = cluster.block_rank();
    csize = cluster.num_blocks();
  }
  const int64_t first_tile = kCluster ? blockIdx.x / csize : int64_t{blockIdx.x} * kTilesPerBlock;
  const int64_t tile = first_tile + warp / kW;
  const bool live = tile < a.tiles;
  const int k0 = std::min(cols, static_cast<int>(rank * kW + warp % kW) * a.slice);
  const int k1 = live ? std::min(cols, k0 + a.slice) : k0;
  // Row g of the lane's tile at this lane's 16 bytes; row g + 8i is 8i rows further. Rows past
  // the end are not loaded (bit i of `row_ok`; their accumulators are never stored).
  const int64_t row0 = tile * kTileRows + g;
  const uint8_t* wr = w.w + (live ? row0 : 0) * w.cols + 16 * q;
  const int64_t row_step = 8 * w.cols;
  unsigned row_ok = 0;
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) row_ok |= (live && row0 + 8 * i < rows ? 1u : 0u) << i;
  // The load ring: v[p] holds the step at k0 + (n kDepth + p) kStepK (n = 0, 1, ...).
  uint4 v[kDepth][kLaneRows];
  auto load = [&](uint4 (&vv)[kLaneRows], int k) {
    const bool in = k + 16 * q < k1;
#pragma unroll
    for (int i = 0; i < kLaneRows; ++i) {
      vv[i] = in && (row_ok >> i & 1u)
                  ? LoadWeights16(reinterpret_cast<const uint4*>(wr + i * row_step + k))
                  : make_uint4(0, 0, 0, 0);
    }
  };
  // Weights and scales are constant: the first kDepth steps' loads go out before the PDL wait,
  // and the scale rows of the block's tiles are located meanwhile (one row per thread).
#pragma unroll
  for (int p = 0; p < kDepth; ++p) {
    if (k0 + p * kStepK < k1) load(v[p], k0 + p * kStepK);
  }
  {
    const int64_t r = first_tile * kTileRows + threadIdx.x;
    if (threadIdx.x < kTilesPerBlock * kTileRows) {
      scale_row[threadIdx.x] = r < rows ? ScaleRows(w).Base(static_cast<uint32_t>(r)) : 0;
    }
  }
  __syncthreads();
  const int32_t* srow = scale_row + (warp / kW) * kTileRows + g;  // row g + 8i: srow[8i]
  const int bc = w.block_cols;
  int cb = k0 / bc;                        // the current scale block
  int flush = std::min(k1, (cb + 1) * bc);  // where it ends in this slice
  float sc[kLaneRows];                     // its scales for the lane's rows
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) sc[i] = k0 < k1 ? __ldg(w.scale + srow[8 * i] + cb) : 0.0f;
  PdlWait();
  // x row g of this tile's group (only lanes with g < m read it), at this lane's 16 k.
  const bool has_x = g < a.m;
  const int64_t group = live ? tile * kTileRows / a.group_rows : 0;
  const float* xr = a.x + (has_x ? g : 0) * a.ldx + group * w.cols + 16 * q;
  float d[kSubTiles][4], acc[kSubTiles][4];
#pragma unroll
  for (int t = 0; t < kSubTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) d[t][e] = acc[t][e] = 0.0f;
  }
  for (int kb = k0; kb < k1; kb += kDepth * kStepK) {
#pragma unroll
    for (int p = 0; p < kDepth; ++p) {
      const int k = kb + p * kStepK;
      if (k >= k1) break;  // warp-uniform: the slice's last ring pass
      const bool in = has_x && k + 16 * q < k1;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 xv =
            in ? *reinterpret_cast<const float4*>(xr + k + 4 * j) : make_float4(0, 0, 0, 0);
        uint32_t b[kSplits][2];
        SplitX<kSplits>(xv, b);
#pragma unroll
        for (int t = 0; t < kSubTiles; ++t) {
          uint32_t lo02, lo13, hi02, hi13;  // rows 16t + g (lo) and 16t + g + 8 (hi)
          E4m3x4ToBf16(Word(v[p][2 * t], j), lo02, lo13);
          E4m3x4ToBf16(Word(v[p][2 * t + 1], j), hi02, hi13);
#pragma unroll
          for (int s = 0; s < kSplits; ++s) Mma(d[t], lo02, hi02, lo13, hi13, b[s][0], b[s][1]);
        }
      }
      const int next = k + kStepK;
      if (k + kDepth * kStepK < k1) load(v[p], k + kDepth * kStepK);
      if (next >= flush) {  // the scale block ends: acc += scale * d
#pragma unroll
        for (int t = 0; t < kSubTiles; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[t][e] = fmaf(sc[2 * t + e / 2], d[t][e], acc[t][e]);
            d[t][e] = 0.0f;
          }
        }
        ++cb;
        flush = std::min(k1, flush + bc);
        if (next < k1) {
#pragma unroll
          for (int i = 0; i < kLaneRows; ++i) sc[i] = __ldg(w.scale + srow[8 * i] + cb);
        }
      }
    }
  }
  if constexpr (kW > 1) {
#pragma unroll
    for (int t = 0; t < kSubTiles; ++t) {
      red[warp][t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    }
    __syncthreads();
    if (!kCluster && warp % kW != 0) return;
    if (warp % kW == 0) {
#pragma unroll
      for (int t = 0; t < kSubTiles; ++t) {
        float4 s = red[warp][t][lane];
        for (int p = 1; p < kW; ++p) {
          const float4 o = red[warp + p][t][lane];
          s.x += o.x;
          s.y += o.y;
          s.z += o.z;
          s.w += o.w;
        }
        acc[t][0] = s.x;
        acc[t][1] = s.y;
        acc[t][2] = s.z;
        acc[t][3] = s.w;
      }
    }
  }
  if constexpr (kCluster) {
    // Every thread of every block reaches both cluster barriers; warp 0 of rank 0 adds the
    // blocks' sums in rank order and is the only writer.
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (warp == 0) {
#pragma unroll
      for (int t = 0; t < kSubTiles; ++t) {
        part[t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
      }
    }
    cluster.sync();  // every block's sums are written and visible cluster-wide
    if (rank == 0 && warp == 0) {
#pragma unroll
      for (int t = 0; t < kSubTiles; ++t) {
        float4 s = part[t][lane];
        for (unsigned r = 1; r < csize; ++r) {
          const float4 o = *cluster.map_shared_rank(&part[t][lane], r);
          s.x += o.x;
          s.y += o.y;
          s.z += o.z;
          s.w += o.w;
        }
        acc[t][0] = s.x;
        acc[t][1] = s.y;
        acc[t][2] = s.z;
        acc[t][3] = s.w;
      }
    }
    cluster.sync();  // no block leaves while rank 0 still reads its shared memory
    if (rank != 0 || warp != 0) return;
  }
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) {
    if (!(row_ok >> i & 1u)) continue;
    const int t = i / 2, h = i % 2;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = 2 * q + e;
      if (j < a.m) a.y[j * rows + row0 + 8 * i] = acc[t][2 * h + e];
    }
  }
}

template <int kSplits, int kW>
absl::Status LaunchGemv(const GemvArgs& a, cudaStream_t stream) {
  constexpr int kWarps = BlockWarps(kW);
  constexpr int kTilesPerBlock = kWarps / kW;
  const int64_t blocks = (a.tiles + kTilesPerBlock - 1) / kTilesPerBlock;
  CUDA_RETURN_IF_ERROR(LaunchPdl(Fp8GemvKernel<kSplits, kW, false>,
                                 dim3(static_cast<unsigned>(blocks)), dim3(32 * kWarps), 0,
                                 stream, a));
  return absl::OkStatus();
}

// The cluster form: `cluster` blocks of kClusterWarps warps per tile.
template <int kSplits>
absl::Status LaunchGemvCluster(const GemvArgs& a, int cluster, cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(LaunchPdlCluster(Fp8GemvKernel<kSplits, kClusterWarps, true>,
                                        dim3(static_cast<unsigned>(a.tiles * cluster)),
                                        dim3(32 * kClusterWarps), 0, stream,
                                        static_cast<unsigned>(cluster), a));
  return absl::OkStatus();
}

// `slices` warps per tile (a power of two up to kMaxSlices).
template <int kSplits>
absl::Status LaunchGemvSlices(const GemvArgs& a, int slices, cudaStream_t stream) {
  static_assert(kMaxSlices == 16, "the cases below");
  switch (slices) {
    case 1: return LaunchGemv<kSplits, 1>(a, stream);
    case 2: return LaunchGemv<kSplits, 2>(a, stream);
    case 4: return LaunchGemv<kSplits, 4>(a, stream);
    case 8: return LaunchGemv<kSplits, 8>(a, stream);
    case 16: return LaunchGemv<kSplits, 16>(a, stream);
    default: break;
  }
  return absl::InternalError("Fp8Gemv: slice count");
}

// k per slice for `slices` slices of `cols`: whole kSliceAlign pieces.
int SliceK(int64_t cols, int slices) {
  const int64_t s = (cols + slices - 1) / slices;
  return static_cast<int>((s + kSliceAlign - 1) / kSliceAlign * kSliceAlign);
}

// Slices per tile: doubled while below max_slices, the grid below target_warps and a slice
// keeps at least kSliceAlign of k.
int SplitK(int64_t tiles, int64_t cols, int max_slices, int64_t target_warps) {
  int s = 1;
  while (s < max_slices && tiles * s < target_warps &&
         (cols + 2 * s - 1) / (2 * s) >= kSliceAlign) {
    s *= 2;
  }
  return s;
}

// The grid (see the top of the file): the cluster form for fewer than kClusterMaxRows rows where
// it gives a tile 2 x kClusterWarps slices or more (up to kMaxCluster x kClusterWarps, for about
// kClusterSmBlocks blocks per SM); otherwise one wave of kSmWarps warps per SM.
template <int kSplits>
absl::Status RunGemv(GemvArgs a, cudaStream_t stream) {
  const Fp8Matrix& w = a.w;
  a.tiles = (w.rows + kTileRows - 1) / kTileRows;
  if (a.tiles * kTileRows < kClusterMaxRows) {
    const int cs = SplitK(a.tiles, w.cols, kMaxCluster * kClusterWarps,
                          kClusterSmBlocks * kWaveSms * kClusterWarps);
    if (cs >= 2 * kClusterWarps) {
      const int cluster = std::min(kMaxCluster, cs / kClusterWarps);
      a.slice = SliceK(w.cols, cluster * kClusterWarps);
      return LaunchGemvCluster<kSplits>(a, cluster, stream);
    }
  }
  const int slices = SplitK(a.tiles, w.cols, kMaxSlices, kWaveSms * kSmWarps);
  a.slice = SliceK(w.cols, slices);
  return LaunchGemvSlices<kSplits>(a, slices, stream);
}

// ---- dequantisation ----

constexpr int kDqRun = 16;          // columns per thread: one 16-byte load of codes
constexpr int kDqMaxThreads = 256;  // threads per block (fewer for narrow rows)
constexpr int kDqMaxGridY = 65535;  // grid y limit; rows beyond it are strided

// Block (x: runs of kDqRun columns, y: rows, strided): out[r, c] = E4M3Value(code) * scale of
// (r, c), rounded to bf16 (round to nearest even) when kBf16. kVec: cols % 16 == 0 and 16-byte
// aligned codes and output (16-byte loads, vector stores); otherwise element by element.
template <bool kBf16, bool kVec>
__global__ void Fp8DequantizeKernel(const Fp8Matrix w, void* out) {
  PdlTrigger();
  PdlWait();  // out is op scratch an earlier kernel may still be reading
  const int64_t cols = w.cols;
  const int64_t c0 = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kDqRun;
  if (c0 >= cols) return;
  const int n = static_cast<int>(std::min<int64_t>(kDqRun, cols - c0));
  const int64_t bc = w.block_cols;
  const int64_t cb0 = c0 / bc;  // the scale block of the run's first column
  const ScaleRows grid(w);
  for (int64_t r = blockIdx.y; r < w.rows; r += gridDim.y) {
    const int64_t base = grid.Base(static_cast<uint32_t>(r));
    const uint8_t* src = w.w + r * cols + c0;
    float f[kDqRun];
    // The scales of the run's blocks: a new one where a block starts within the run.
    int64_t cb = cb0, next = (cb + 1) * bc;
    float s = __ldg(w.scale + base + cb);
    if constexpr (kVec) {
      const uint4 raw = LoadWeights16(reinterpret_cast<const uint4*>(src));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t word = Word(raw, j);
        uint32_t p02, p13;
        E4m3x4ToBf16(word, p02, p13);
        float e4[4] = {Bf16Lo(p02), Bf16Lo(p13), Bf16Hi(p02), Bf16Hi(p13)};
        // NaN codes (S.1111.111): decoded as ±480 above, restored here.
        if (__vcmpeq4(word & 0x7f7f7f7fu, 0x7f7f7f7fu) != 0) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (((word >> (8 * e)) & 0x7fu) == 0x7fu) e4[e] = __int_as_float(0x7fc00000);
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * j + e;
          if (c0 + i == next) {
            s = __ldg(w.scale + base + ++cb);
            next += bc;
          }
          f[i] = e4[e] * s;
        }
      }
    } else {
      for (int i = 0; i < n; ++i) {
        if (c0 + i == next) {
          s = __ldg(w.scale + base + ++cb);
          next += bc;
        }
        f[i] = E4M3Value(src[i]) * s;
      }
    }
    if constexpr (kBf16) {
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out) + r * cols + c0;
      if constexpr (kVec) {
        uint4 p[2];
        uint32_t* pw = reinterpret_cast<uint32_t*>(p);
#pragma unroll
        for (int i = 0; i < kDqRun / 2; ++i) pw[i] = PackBf16x2(f[2 * i], f[2 * i + 1]);
        reinterpret_cast<uint4*>(o)[0] = p[0];
        reinterpret_cast<uint4*>(o)[1] = p[1];
      } else {
        for (int i = 0; i < n; ++i) o[i] = __float2bfloat16_rn(f[i]);
      }
    } else {
      float* o = static_cast<float*>(out) + r * cols + c0;
      if constexpr (kVec) {
#pragma unroll
        for (int i = 0; i < kDqRun / 4; ++i) {
          reinterpret_cast<float4*>(o)[i] = make_float4(f[4 * i], f[4 * i + 1], f[4 * i + 2],
                                                        f[4 * i + 3]);
        }
      } else {
        for (int i = 0; i < n; ++i) o[i] = f[i];
      }
    }
  }
}

template <bool kBf16, bool kVec>
absl::Status LaunchDequantize(const Fp8Matrix& w, void* out, cudaStream_t stream) {
  const int64_t runs = (w.cols + kDqRun - 1) / kDqRun;
  // Threads: the row's runs rounded up to a warp, at most kDqMaxThreads.
  const int threads = static_cast<int>(std::min<int64_t>(kDqMaxThreads, (runs + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>((runs + threads - 1) / threads),
                  static_cast<unsigned>(std::min<int64_t>(w.rows, kDqMaxGridY)));
  CUDA_RETURN_IF_ERROR(
      LaunchPdl(Fp8DequantizeKernel<kBf16, kVec>, grid, dim3(threads), 0, stream, w, out));
  return absl::OkStatus();
}

// The shape checks both launchers share: a consistent block grid and part stacking; rows, cols
// and the scale count below 2^30 (32-bit row, column and scale arithmetic in the kernels, with
// room for a slice past the end).
bool ValidMatrix(const Fp8Matrix& w) {
  constexpr int64_t kMax = int64_t{1} << 30;
  return w.w != nullptr && w.scale != nullptr && w.rows > 0 && w.cols > 0 && w.rows < kMax &&
         w.cols < kMax && w.block_rows > 0 && w.block_cols > 0 && w.part_rows >= 0 &&
         w.rows % w.PartRows() == 0 && w.ScaleCount() < kMax;
}

}  // namespace

bool Fp8GemvFits(const float* x, int64_t m, const Fp8Matrix& w, int64_t group_rows) {
  return m >= 1 && m <= kFp8GemvMaxRows && ValidMatrix(w) && w.cols % 16 == 0 &&
         w.block_cols % kStepK == 0 && group_rows > 0 && w.rows % group_rows == 0 &&
         (group_rows == w.rows || group_rows % kTileRows == 0) && Aligned16(x) && Aligned16(w.w);
}

absl::Status Fp8Gemv(const float* x, int64_t m, const Fp8Matrix& w, int64_t group_rows,
                     bool round_x_bf16, float* y, cudaStream_t stream) {
  if (!Fp8GemvFits(x, m, w, group_rows)) {
    return absl::InvalidArgumentError(
        "Fp8Gemv: needs 1 <= m <= 8, cols a multiple of 16, block_cols a multiple of 64, "
        "group_rows dividing rows (all rows or a multiple of 32), rows a multiple of part_rows, "
        "rows, cols and scales below 2^30 and 16-byte aligned x and codes");
  }
  GemvArgs a;
  a.x = x;
  a.ldx = w.rows / group_rows * w.cols;
  a.w = w;
  a.group_rows = group_rows;
  a.m = static_cast<int>(m);
  a.y = y;
  return round_x_bf16 ? RunGemv<1>(a, stream) : RunGemv<3>(a, stream);
}

absl::Status Fp8Dequantize(const Fp8Matrix& w, bool to_bf16, void* out, cudaStream_t stream) {
  if (w.rows == 0 || w.cols == 0) return absl::OkStatus();
  if (!ValidMatrix(w) || out == nullptr) {
    return absl::InvalidArgumentError(
        "Fp8Dequantize: needs codes, scales, positive block sizes, rows a multiple of part_rows "
        "and rows, cols and scales below 2^30");
  }
  const bool vec = w.cols % kDqRun == 0 && Aligned16(w.w) && Aligned16(out);
  if (to_bf16) {
    return vec ? LaunchDequantize<true, true>(w, out, stream)
               : LaunchDequantize<true, false>(w, out, stream);
  }
  return vec ? LaunchDequantize<false, true>(w, out, stream)
             : LaunchDequantize<false, false>(w, out, stream);
}

}  // namespace dsv4::cuda
