// The tiled grouped expert GEMMs on Hopper warpgroup MMAs (moe_tile_parts.cuh: RunTiledWgmma).
//
// Same tiles, block numbering, operands and epilogues as the mma.sync kernel (moe_tiled.cu):
// a block computes BM assignments (64 or 128) x 128 weight rows of one expert, K in slices of 64
// through a ring of shared-memory stages filled by cp.async (activations gathered by token for
// gate_up, bf16 weights) or by the weight format's expansion to bf16 (MXFP4 exactly, FP8 e4m3 x
// scale rounded once). The stages hold [rows][64] bf16 in the 128-byte swizzle, so that both
// operands are read by wgmma straight from shared memory (wgmma.cuh). Two warpgroups: at BM 128
// warpgroup g takes assignments 64 g .. 64 g + 63 against all 128 weight rows (m64n128k16), at
// BM 64 all 64 assignments against weight rows 64 g .. 64 g + 63 (m64n64k16). The products of a
// stage are issued asynchronously and the next quantised slice is expanded into its stage while
// they run. Every output is summed over k in order with no split.
//
// gate_up: a warpgroup's N weight rows are N / 2 gate rows and the N / 2 up rows of the same
// h columns (the tile-row map below), so the clamped SwiGLU runs on its accumulators.
#include <cuda_bf16.h>

#include <limits>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/moe_tile_parts.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kWgThreads = 256;  // two warpgroups
constexpr int kAlign = 1024;     // the swizzled tiles' alignment

template <int kRows>
struct WgmmaCfg {
  static constexpr int kN = kRows == 128 ? 128 : 64;  // weight rows per warpgroup
  static constexpr int kAcc = kN / 2;                 // fp32 accumulators per thread
  static constexpr int kStages = kRows == 128 ? 3 : 4;
  static constexpr int kAStage = kRows * kTileK;      // bf16 elements
  static constexpr int kBStage = kTileN * kTileK;
  static constexpr size_t kSmem = sizeof(bf16) * kStages * (kAStage + kBStage) + kAlign;
};

// Tile row r (0 .. 127) in the expert's weight. gate_up: warpgroup group r / N holds gate rows
// j0 + group * N / 2 + (r % N) for r % N < N / 2, and the up rows of the same columns above
// (j0 = 64 x weight tile); down: n0 + r.
template <bool kSwiGlu, int kN>
__device__ __forceinline__ int64_t WgWeightRow(int r, int32_t n_tile, int64_t n_out) {
  if constexpr (kSwiGlu) {
    constexpr int kHalf = kN / 2;
    const int64_t j = int64_t{n_tile} * (kTileN / 2) + (r / kN) * kHalf;
    const int rr = r % kN;
    return rr < kHalf ? j + rr : n_out + j + rr - kHalf;
  } else {
    return int64_t{n_tile} * kTileN + r;
  }
}

template <int kN>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], uint64_t a, uint64_t b) {
  if constexpr (kN == 128) {
    WgmmaBf16N128(d, a, b);
  } else {
    WgmmaBf16N64(d, a, b);
  }
}

template <template <int, class> class WT, bool kSwiGlu, int kRows>
__global__ void __launch_bounds__(kWgThreads, 2) ExpertWgmmaKernel(const TileGemmArgs g) {
  using Cfg = WgmmaCfg<kRows>;
  constexpr int kN = Cfg::kN, kStages = Cfg::kStages;
  using W = WT<kWgThreads, Swizzle128Layout>;
  constexpr int kAChunks = kRows * kTileK / 8 / kWgThreads;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kAlign - 1) & ~uintptr_t{kAlign - 1});
  bf16* const sa = reinterpret_cast<bf16*>(base);  // [kStages][kRows][64]
  bf16* const sb = sa + kStages * Cfg::kAStage;    // [kStages][128][64]

  TileCoord tc;
  if (!FindTile(g, kRows, reinterpret_cast<int32_t*>(base), &tc)) return;
  const int32_t a0 = tc.a0, count = tc.count, n_tile = tc.n_tile, m0 = tc.m0;

  const bf16* ap[kAChunks];
  int adst[kAChunks];
  bool aok[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int c = threadIdx.x + i * kWgThreads, r = c >> 3, col = (c & 7) * 8;
    aok[i] = m0 + r < count;
    int64_t src = 0;
    if (aok[i]) {
      const int32_t a = a0 + m0 + r;
      src = g.by_token ? g.order[a] / g.top_k : a;
    }
    ap[i] = g.x + src * g.k_in + col;
    adst[i] = Swizzle128Layout::At(r, col);
  }
  const int64_t w_rows = kSwiGlu ? 2 * g.n_out : g.n_out;
  W wt;
  wt.Init(g.w, int64_t{tc.e} * w_rows,
          [&](int r) { return WgWeightRow<kSwiGlu, kN>(r, n_tile, g.n_out); }, g.k_in);
  auto load_a = [&](int64_t k0, bf16* stage) {
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) CpAsync16(stage + adst[i], ap[i] + k0, aok[i]);
  };

  const int wg = threadIdx.x >> 7;
  const int wg_row0 = kRows == 128 ? 64 * wg : 0;  // the warpgroup's assignments in the tile
  const int wg_n0 = kRows == 128 ? 0 : 64 * wg;    // and its weight rows
  float acc[Cfg::kAcc];
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;

  const int kt_count = static_cast<int>(g.k_in / kTileK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) {
      load_a(int64_t{s} * kTileK, sa + s * Cfg::kAStage);
      wt.Load(int64_t{s} * kTileK, sb + s * Cfg::kBStage);
      wt.Store(int64_t{s} * kTileK, sb + s * Cfg::kBStage);
    }
    CpAsyncCommit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    CpAsyncWait<kStages - 2>();
    FenceProxyAsyncShared();  // this thread's cp.async data and expanded stores, for wgmma
    __syncthreads();
    const int pf = kt + kStages - 1;
    bf16* const pa = sa + (pf % kStages) * Cfg::kAStage;
    bf16* const pb = sb + (pf % kStages) * Cfg::kBStage;
    if (pf < kt_count) {
      load_a(int64_t{pf} * kTileK, pa);
      wt.Load(int64_t{pf} * kTileK, pb);
    }
    CpAsyncCommit();
    const bf16* ca = sa + (kt % kStages) * Cfg::kAStage + wg_row0 * kTileK;
    const bf16* cb = sb + (kt % kStages) * Cfg::kBStage + wg_n0 * kTileK;
    WgmmaFenceOperands(acc);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      Wgmma<kN>(acc, WgmmaDescSw128(ca + ks * 16), WgmmaDescSw128(cb + ks * 16));
    }
    WgmmaCommit();
    // The next quantised slice is expanded while the products run (a different stage).
    if (pf < kt_count) wt.Store(int64_t{pf} * kTileK, pb);
    WgmmaWait<0>();
    WgmmaFenceOperands(acc);
  }
  CpAsyncWait<0>();

  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int32_t m = m0 + wg_row0 + 16 * warp + (lane >> 2) + 8 * half;
    if (m >= count) continue;
    const int64_t a = a0 + m;
    if constexpr (kSwiGlu) {
      bf16* h = static_cast<bf16*>(g.y) + a * g.n_out;
#pragma unroll
      for (int j = 0; j < kN / 16; ++j) {
        const int64_t col = int64_t{n_tile} * (kTileN / 2) + wg_n0 / 2 + 8 * j + 2 * (lane & 3);
        float v[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          v[q] = ClampedSwiGlu(acc[4 * j + 2 * half + q], acc[4 * (j + kN / 16) + 2 * half + q],
                               g.limit);
        }
        *reinterpret_cast<__nv_bfloat162*>(h + col) = __floats2bfloat162_rn(v[0], v[1]);
      }
    } else {
      float* yr = static_cast<float*>(g.y) + int64_t{g.order[a]} * g.n_out +
                  int64_t{n_tile} * kTileN + wg_n0;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        *reinterpret_cast<float2*>(yr + 8 * j + 2 * (lane & 3)) =
            make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
}

template <template <int, class> class W, bool kSwiGlu, int kRows>
absl::Status LaunchWgmma(const TileGemmArgs& g, int64_t assignments, cudaStream_t stream) {
  constexpr size_t smem = WgmmaCfg<kRows>::kSmem;
  auto kernel = ExpertWgmmaKernel<W, kSwiGlu, kRows>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
  const int64_t bound = TileGridBound(assignments, g.experts, kRows, g.n_tiles);
  if (bound > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("MoeExpertsTiled: more tiles than a grid holds");
  }
  kernel<<<static_cast<unsigned>(bound), kWgThreads, smem, stream>>>(g);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <template <int, class> class W>
absl::Status RunFormat(int rows, const TileGemmArgs& gu, const TileGemmArgs& dn,
                       int64_t assignments, cudaStream_t stream) {
  if (rows == 128) {
    if (absl::Status s = LaunchWgmma<W, true, 128>(gu, assignments, stream); !s.ok()) return s;
    return LaunchWgmma<W, false, 128>(dn, assignments, stream);
  }
  if (absl::Status s = LaunchWgmma<W, true, 64>(gu, assignments, stream); !s.ok()) return s;
  return LaunchWgmma<W, false, 64>(dn, assignments, stream);
}

}  // namespace

absl::Status RunTiledWgmma(QuantFormat format, int tile_rows, const TileGemmArgs& gu,
                           const TileGemmArgs& dn, int64_t assignments, cudaStream_t stream) {
  switch (format) {
    case QuantFormat::kNone:
      return RunFormat<TileBf16>(tile_rows, gu, dn, assignments, stream);
    case QuantFormat::kMxfp4:
      return RunFormat<TileMxfp4>(tile_rows, gu, dn, assignments, stream);
    case QuantFormat::kFp8Block:
      return RunFormat<TileFp8>(tile_rows, gu, dn, assignments, stream);
  }
  return absl::InvalidArgumentError("MoeExpertsTiled: unknown weight format");
}

}  // namespace dsv4::cuda
