// The routed experts of prefill-sized steps as two tiled grouped GEMMs (moe_tiled.h).
//
// The decode-shaped expert kernels (moe_mma.cuh) stream an expert's weights from global memory
// straight into mma fragments, once per 8 (or 64) of its assignments: right for decode, where the
// bytes bound the step, but at an 8k-token prefill every expert has ~190 assignments and the
// products bound it (~7.4 TFLOP of routed experts on the 3-layer Flash slice). Here each block
// computes one tile of one expert's product, BM assignments x 128 weight rows, with K in slices
// of 64 through a 3-stage shared-memory ring: the assignments' activations (bf16) arrive by
// cp.async, gathered by token for gate_up; bf16 weights arrive by cp.async too, MXFP4 and FP8
// weights are loaded into registers one slice ahead and expanded to bf16 as they are stored
// (MXFP4 exactly; FP8 e4m3 x scale rounded once, as everywhere). 8 warps (2 along the
// assignments x 4 along the weight rows; DSV4_MOE_TILE_WARPS=4: 2 x 2) run mma.sync m16n8k16 from
// ldmatrix fragments (rows of 144 bytes: conflict-free), each warp a (BM / 2) x 32 tile (x 64
// with 4 warps), every output summed over k in order with no split: its value depends on its own
// row and column only.
//
// gate_up: a block's 128 weight rows are 64 gate rows and the 64 up rows of the same columns,
// and each warp's n8 tiles pair them (tiles 0, 1 gate; 2, 3 up), so the clamped SwiGLU runs on
// the accumulators and h is written in bf16 [A, I] in the sorted order. down: y fp32 [A, D]
// written at the assignment's (t, k) index for the combine.
//
// Blocks are numbered expert by expert, and within an expert by weight tile, then token tile:
// the token tiles of one weight tile run side by side (its weights read from HBM once, the rest
// from L2) and an expert's activations stay in L2 across its weight tiles. A small scan turns the
// experts' assignment counts into the prefix of their token tiles; a block finds its expert by
// binary search in it. The grid is the bound (A / BM + min(E, A)) x weight tiles, shapes only
// (graph capture); the blocks past the end return at once.
#include "kernels/cuda/moe_tiled.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <limits>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_activations.h"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/moe_tile_parts.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kStages = 3;
// Blocks of 2 x kWarpsN warps: 2 along the assignments, kWarpsN (4 or 2) along the 128 weight
// rows; kThreads = 64 kWarpsN.
constexpr int kPitch = PitchLayout::kPitch;  // bf16 per shared row (144 bytes)

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

// Where a block's tile row r (0 .. 127) is in its expert's weight: gate_up (kSwiGlu) rows
// j0 + r for r < 64 and I + j0 + r - 64 above (j0 = 64 x weight tile), down rows n0 + r.
template <bool kSwiGlu>
__device__ __forceinline__ int64_t WeightRow(int r, int32_t n_tile, int64_t n_out) {
  if constexpr (kSwiGlu) {
    const int64_t j0 = int64_t{n_tile} * (kTileN / 2);
    return r < kTileN / 2 ? j0 + r : n_out + j0 + r - kTileN / 2;
  } else {
    return int64_t{n_tile} * kTileN + r;
  }
}

template <int kThreads>
using PitchBf16 = TileBf16<kThreads, PitchLayout>;
template <int kThreads>
using PitchMxfp4 = TileMxfp4<kThreads, PitchLayout>;
template <int kThreads>
using PitchFp8 = TileFp8<kThreads, PitchLayout>;

using GemmArgs = TileGemmArgs;

// kMt m16 tiles per warp (BM = 32 kMt), kWarpsN warps along the weight rows, each with
// kNt = 16 / kWarpsN n8 tiles (warp tiles (BM / 2) x 32 or x 64).
template <template <int> class WT, bool kSwiGlu, int kMt, int kWarpsN>
__global__ void __launch_bounds__(64 * kWarpsN, 2) ExpertTileKernel(const GemmArgs g) {
  constexpr int kThreads = 64 * kWarpsN;
  constexpr int kNt = 16 / kWarpsN;
  using W = WT<kThreads>;
  constexpr int kRows = 32 * kMt;  // BM: assignments per block
  constexpr int kAChunks = kRows * kTileK / 8 / kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const sa = reinterpret_cast<bf16*>(smem_raw);  // [kStages][kRows][kPitch]
  bf16* const sb = sa + kStages * kRows * kPitch;     // [kStages][kTileN][kPitch]

  TileCoord tc;
  if (!FindTile(g, kRows, reinterpret_cast<int32_t*>(smem_raw), &tc)) return;
  const int32_t e = tc.e, a0 = tc.a0, count = tc.count, n_tile = tc.n_tile, m0 = tc.m0;

  // The thread's activation chunks (row, 16 bytes) and weight rows, fixed over k.
  const bf16* ap[kAChunks];
  int adst[kAChunks];
  bool aok[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int c = threadIdx.x + i * kThreads, r = c >> 3, col = (c & 7) * 8;
    aok[i] = m0 + r < count;
    int64_t src = 0;
    if (aok[i]) {
      const int32_t a = a0 + m0 + r;
      src = g.by_token ? g.order[a] / g.top_k : a;
    }
    ap[i] = g.x + src * g.k_in + col;
    adst[i] = r * kPitch + col;
  }
  const int64_t w_rows = kSwiGlu ? 2 * g.n_out : g.n_out;
  W wt;
  wt.Init(g.w, int64_t{e} * w_rows, [&](int r) { return WeightRow<kSwiGlu>(r, n_tile, g.n_out); },
          g.k_in);

  auto load_a = [&](int64_t k0, bf16* stage) {
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) CpAsync16(stage + adst[i], ap[i] + k0, aok[i]);
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  // The warp's weight rows in the tile: kNt / 2 groups of 16 (n8 tiles 2p, 2p + 1); gate_up:
  // the first half gate rows, the second half the up rows of the same columns.
  auto n_base = [&](int p) {
    if constexpr (kSwiGlu) {
      constexpr int kHalf = kNt / 4;
      return p < kHalf ? wn * 8 * kNt / 2 + 16 * p : kTileN / 2 + wn * 8 * kNt / 2 + 16 * (p - kHalf);
    } else {
      return wn * 8 * kNt + 16 * p;
    }
  };
  float acc[kMt][kNt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    }

  const int kt_count = static_cast<int>(g.k_in / kTileK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) {
      load_a(int64_t{s} * kTileK, sa + s * kRows * kPitch);
      wt.Load(int64_t{s} * kTileK, sb + s * kTileN * kPitch);
      wt.Store(int64_t{s} * kTileK, sb + s * kTileN * kPitch);
    }
    CpAsyncCommit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int pf = kt + kStages - 1;
    bf16* const pa = sa + (pf % kStages) * kRows * kPitch;
    bf16* const pb = sb + (pf % kStages) * kTileN * kPitch;
    if (pf < kt_count) {
      load_a(int64_t{pf} * kTileK, pa);
      wt.Load(int64_t{pf} * kTileK, pb);
    }
    CpAsyncCommit();
    const bf16* ca = sa + (kt % kStages) * kRows * kPitch;
    const bf16* cb = sb + (kt % kStages) * kTileN * kPitch;
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t af[kMt][4], bw[kNt / 2][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        LdMatrixX4(af[mt], ca + (wm * 16 * kMt + mt * 16 + (lane & 15)) * kPitch + ks * 16 +
                               (lane >> 4) * 8);
      }
#pragma unroll
      for (int p = 0; p < kNt / 2; ++p) {
        LdMatrixX4(bw[p], cb + (n_base(p) + (lane & 7) + ((lane >> 4) << 3)) * kPitch + ks * 16 +
                              ((lane >> 3) & 1) * 8);
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
          MmaBf16(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3],
                  bw[nt >> 1][(nt & 1) * 2], bw[nt >> 1][(nt & 1) * 2 + 1]);
    }
    if (pf < kt_count) wt.Store(int64_t{pf} * kTileK, pb);
  }
  CpAsyncWait<0>();

  // Epilogue: accumulator c0, c1 at row lane / 4, columns 2 (lane % 4) + 0, 1; c2, c3 row + 8.
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t m = m0 + wm * 16 * kMt + mt * 16 + (lane >> 2) + half * 8;
      if (m >= count) continue;
      const int64_t a = a0 + m;
      if constexpr (kSwiGlu) {
        bf16* h = static_cast<bf16*>(g.y) + a * g.n_out;
#pragma unroll
        for (int q = 0; q < kNt / 2; ++q) {
          const int64_t col =
              int64_t{n_tile} * (kTileN / 2) + wn * 8 * kNt / 2 + q * 8 + (lane & 3) * 2;
          float v[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            v[j] = ClampedSwiGlu(acc[mt][q][half * 2 + j], acc[mt][q + kNt / 2][half * 2 + j],
                                 g.limit);
          }
          *reinterpret_cast<__nv_bfloat162*>(h + col) = __floats2bfloat162_rn(v[0], v[1]);
        }
      } else {
        float* yr = static_cast<float*>(g.y) + int64_t{g.order[a]} * g.n_out +
                    int64_t{n_tile} * kTileN;
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          const int col = n_base(nt >> 1) + (nt & 1) * 8 + (lane & 3) * 2;
          *reinterpret_cast<float2*>(yr + col) =
              make_float2(acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]);
        }
      }
    }
  }
}

template <template <int> class W, bool kSwiGlu, int kMt, int kWarpsN>
absl::Status LaunchTiles(const GemmArgs& g, int64_t assignments, cudaStream_t stream) {
  constexpr int kRows = 32 * kMt;
  const size_t smem = sizeof(bf16) * kStages * (kRows + kTileN) * kPitch;
  auto kernel = ExpertTileKernel<W, kSwiGlu, kMt, kWarpsN>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  // Two blocks an SM need the whole carveout at 128-row tiles (2 x 109 KiB).
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
  const int64_t bound = TileGridBound(assignments, g.experts, kRows, g.n_tiles);
  if (bound > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("MoeExpertsTiled: more tiles than a grid holds");
  }
  kernel<<<static_cast<unsigned>(bound), 64 * kWarpsN, smem, stream>>>(g);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <template <int> class W, int kMt, int kWarpsN>
absl::Status RunTiled(const ExpertsShape& d, GemmArgs gu, GemmArgs dn, cudaStream_t stream) {
  const int64_t a = d.tokens * d.top_k;
  RETURN_IF_ERROR((LaunchTiles<W, true, kMt, kWarpsN>(gu, a, stream)));
  return LaunchTiles<W, false, kMt, kWarpsN>(dn, a, stream);
}

template <template <int> class W>
absl::Status RunTiledRows(int rows, int warps, const ExpertsShape& d, const GemmArgs& gu,
                          const GemmArgs& dn, cudaStream_t stream) {
  if (warps == 4) {
    return rows == 128 ? RunTiled<W, 4, 2>(d, gu, dn, stream) : RunTiled<W, 2, 2>(d, gu, dn, stream);
  }
  return rows == 128 ? RunTiled<W, 4, 4>(d, gu, dn, stream) : RunTiled<W, 2, 4>(d, gu, dn, stream);
}

bool FormatFits(const TiledExpertWeights& w) {
  switch (w.format) {
    case QuantFormat::kNone:
      return w.bf16 != nullptr && Aligned16(w.bf16);
    case QuantFormat::kMxfp4:
      return w.fp4.w != nullptr && w.fp4.scale != nullptr && Aligned16(w.fp4.w);
    case QuantFormat::kFp8Block:
      return w.fp8.w != nullptr && w.fp8.scale != nullptr && Aligned16(w.fp8.w) &&
             w.fp8.block_cols > 0 && w.fp8.block_cols % 16 == 0 && w.fp8.block_rows > 0;
  }
  return false;
}

}  // namespace

int MoeTiledRows(const ExpertsShape& d, const TiledExpertWeights& gate_up,
                 const TiledExpertWeights& down, int mode) {
  if (mode == 0 || d.tokens <= 0) return 0;
  const int64_t a = d.tokens * d.top_k;
  // The grid bound of the larger GEMM at 64-row tiles must fit a 1-D grid.
  const int64_t grid = (a / 64 + 1 + std::min<int64_t>(d.experts, a)) *
                       std::max<int64_t>(d.inter / (kTileN / 2), d.dim / kTileN);
  const bool fits = a > 0 && d.dim > 0 && d.inter > 0 && d.dim % kTileN == 0 &&
                    d.inter % (kTileN / 2) == 0 && d.experts >= 1 && d.experts <= kMaxExperts &&
                    gate_up.format == down.format && FormatFits(gate_up) && FormatFits(down) &&
                    a <= (int64_t{1} << 30) && grid <= std::numeric_limits<int32_t>::max();
  if (!fits) return 0;
  if (mode == 64 || mode == 128) return mode;
  if (a < kMoeTiledMinAverage * d.experts) return 0;
  // 128-row tiles from 128 assignments an expert (slice3, 8k prompt, ~192 an expert: 85.9 ms
  // against 98.5 with 64-row tiles; bench/results/2026-12-03-tiled-experts/).
  return a >= 128 * d.experts ? 128 : 64;
}

bool Fp8TiledFits(const ExpertsShape& d, const TiledExpertWeights& gate_up) {
  return gate_up.format == QuantFormat::kMxfp4 && d.dim % 128 == 0 && d.inter % 128 == 0;
}

namespace {

// The FP8 path: u to e4m3, gate_up (h in fp32 into w.h), h to e4m3 (into w.gu, unused by the
// tiled kernels otherwise), down. u8 and its scales take w.xb's room (2 T D bytes).
absl::Status RunFp8(const ExpertsShape& d, const float* u, GemmArgs gu, GemmArgs dn,
                    const MoeWorkspace& w, cudaStream_t stream) {
  const int64_t a = d.tokens * d.top_k;
  uint8_t* const u8 = reinterpret_cast<uint8_t*>(w.xb);
  float* const us = reinterpret_cast<float*>(u8 + d.tokens * d.dim);
  RETURN_IF_ERROR(QuantizeFp8Groups(u, d.tokens, d.dim, d.dim, u8, us, stream));
  TileStartKernel<<<1, kScanThreads, 0, stream>>>(w.offsets, static_cast<int32_t>(d.experts), 64,
                                                  w.tile_start);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  gu.x8 = u8;
  gu.x8_scales = us;
  gu.x8_rows = d.tokens;
  gu.y = w.h;
  RETURN_IF_ERROR(RunTiledFp8Gemm(true, gu, a, stream));
  uint8_t* const h8 = reinterpret_cast<uint8_t*>(w.gu);
  float* const hs = reinterpret_cast<float*>(h8 + a * d.inter);
  RETURN_IF_ERROR(QuantizeFp8Groups(w.h, a, d.inter, d.inter, h8, hs, stream));
  dn.x8 = h8;
  dn.x8_scales = hs;
  dn.x8_rows = a;
  return RunTiledFp8Gemm(false, dn, a, stream);
}

}  // namespace

absl::Status MoeExpertsTiled(const ExpertsShape& d, int tile_rows, TiledKernel kernel,
                             int warps, bool fp8, const float* u,
                             const float* weights, const TiledExpertWeights& gate_up,
                             const TiledExpertWeights& down, const MoeWorkspace& w, float* out,
                             cudaStream_t stream) {
  if ((tile_rows != 64 && tile_rows != 128) || (warps != 4 && warps != 8)) {
    return absl::InvalidArgumentError("MoeExpertsTiled: tile_rows must be 64 or 128, warps 4 or 8");
  }
  // The kernels copy the token-tile prefix into their stage memory (kMaxExperts keeps it there).
  if (MoeTiledRows(d, gate_up, down, tile_rows) != tile_rows) {
    return absl::InvalidArgumentError(
        "MoeExpertsTiled: needs D % 128 == 0, I % 64 == 0, at most 4095 experts and aligned "
        "weights of one format (MoeTiledRows)");
  }
  const bool use_fp8 = fp8 && Fp8TiledFits(d, gate_up);
  const int ws_rows = MoeTiledWsRows(d.tokens * d.top_k, d.experts);
  const bool use_ws =
      !use_fp8 && kernel == TiledKernel::kWarpSpecialized &&
      TiledWsFits(gate_up.format, ws_rows, d.dim, d.inter, d.experts, gate_up, down);
  if (!use_fp8) {  // RunFp8 quantises u itself and numbers its own 64-row tiles
    // The warp-specialised kernels take MXFP4 activations in the expansion's pair order.
    if (use_ws && gate_up.format == QuantFormat::kMxfp4) {
      RETURN_IF_ERROR(CastToBf16Pair4(u, w.xb, d.tokens * d.dim, stream));
    } else {
      RETURN_IF_ERROR(CastToBf16(u, w.xb, d.tokens * d.dim, stream));
    }
    TileStartKernel<<<1, kScanThreads, 0, stream>>>(w.offsets, static_cast<int32_t>(d.experts),
                                                    use_ws ? ws_rows : tile_rows,
                                                    w.tile_start);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  bf16* h = reinterpret_cast<bf16*>(w.h);
  GemmArgs gu;
  gu.x = reinterpret_cast<const bf16*>(w.xb);
  gu.by_token = true;
  gu.top_k = d.top_k;
  gu.w = gate_up;
  gu.n_out = d.inter;
  gu.k_in = d.dim;
  gu.limit = d.swiglu_limit;
  gu.order = w.order;
  gu.offsets = w.offsets;
  gu.tile_start = w.tile_start;
  gu.experts = static_cast<int32_t>(d.experts);
  gu.n_tiles = static_cast<int32_t>(d.inter / (kTileN / 2));
  gu.y = h;
  GemmArgs dn = gu;
  dn.x = h;
  dn.by_token = false;
  dn.w = down;
  dn.n_out = d.dim;
  dn.k_in = d.inter;
  dn.n_tiles = static_cast<int32_t>(d.dim / kTileN);
  dn.y = w.y;
  if (use_fp8) {
    RETURN_IF_ERROR(RunFp8(d, u, gu, dn, w, stream));
    return CombineAssignments(d, w.y, nullptr, weights, out, stream);
  }
  if (use_ws) {
    RETURN_IF_ERROR(RunTiledWs(gate_up.format, ws_rows, gu, dn, stream));
    return CombineAssignments(d, w.y, nullptr, weights, out, stream);
  }
  if (kernel != TiledKernel::kMmaSync) {
    RETURN_IF_ERROR(RunTiledWgmma(gate_up.format, tile_rows, gu, dn, d.tokens * d.top_k, stream));
    return CombineAssignments(d, w.y, nullptr, weights, out, stream);
  }
  switch (gate_up.format) {
    case QuantFormat::kNone:
      RETURN_IF_ERROR(RunTiledRows<PitchBf16>(tile_rows, warps, d, gu, dn, stream));
      break;
    case QuantFormat::kMxfp4:
      RETURN_IF_ERROR(RunTiledRows<PitchMxfp4>(tile_rows, warps, d, gu, dn, stream));
      break;
    case QuantFormat::kFp8Block:
      RETURN_IF_ERROR(RunTiledRows<PitchFp8>(tile_rows, warps, d, gu, dn, stream));
      break;
  }
  return CombineAssignments(d, w.y, nullptr, weights, out, stream);
}

}  // namespace dsv4::cuda
