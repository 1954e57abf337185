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
#include <cub/block/block_scan.cuh>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe_mma.cuh"

namespace dsv4::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileN = 128;         // weight rows per block (gate_up: 64 gate + their 64 up)
constexpr int kTileK = 64;          // k per stage
constexpr int kStages = 3;
// Blocks of 2 x kWarpsN warps: 2 along the assignments, kWarpsN (4 or 2) along the 128 weight
// rows; kThreads = 64 kWarpsN.
constexpr int kPitch = kTileK + 8;  // bf16 per shared row (144 bytes: ldmatrix conflict-free)
constexpr int kScanThreads = 1024, kScanItems = 4;
constexpr int64_t kMaxExperts = int64_t{kScanThreads} * kScanItems - 1;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, zero-filled when !valid (the source is then not read).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}
__device__ __forceinline__ void StoreShared16(bf16* smem, const uint4& v) {
  *reinterpret_cast<uint4*>(smem) = v;
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

// ---- Weight formats: a thread's share of a 128 x 64 weight slice ----
// Init(w, row0_of_expert, tile-row map, k_in): the thread's rows; Load(k0, stage): cp.async into
// the stage (bf16) or into registers (quantised); Store(k0, stage): the registers expanded into
// the stage (quantised; nothing for bf16).

template <int kThreads>
struct TileBf16 {
  static constexpr int kChunks = kTileN * kTileK / 8 / kThreads;  // 4 or 8 x 16 bytes
  const bf16* p[kChunks];
  int dst[kChunks];  // offset in the stage
  template <class RowOf>
  __device__ __forceinline__ void Init(const TiledExpertWeights& w, int64_t row0, RowOf row_of,
                                       int64_t k_in) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c >> 3, col = (c & 7) * 8;
      p[i] = static_cast<const bf16*>(w.bf16) + (row0 + row_of(r)) * k_in + col;
      dst[i] = r * kPitch + col;
    }
  }
  __device__ __forceinline__ void Load(int64_t k0, bf16* stage) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) CpAsync16(stage + dst[i], p[i] + k0, true);
  }
  __device__ __forceinline__ void Store(int64_t, bf16*) const {}
};

// MXFP4: a thread takes one row's 32 codes of one scale group (16 bytes and the UE8M0 byte),
// once or twice.
template <int kThreads>
struct TileMxfp4 {
  static constexpr int kChunks = kTileN * kTileK / 32 / kThreads;  // 1 or 2
  const uint8_t* codes[kChunks];
  const uint8_t* scale[kChunks];
  int dst[kChunks];
  uint4 raw[kChunks];
  uint32_t s[kChunks];
  template <class RowOf>
  __device__ __forceinline__ void Init(const TiledExpertWeights& w, int64_t row0, RowOf row_of,
                                       int64_t k_in) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c >> 1, half = c & 1;
      const int64_t g = row0 + row_of(r);
      codes[i] = w.fp4.w + g * (k_in / 2) + half * 16;
      scale[i] = w.fp4.scale + g * (k_in / 32) + half;
      dst[i] = r * kPitch + half * 32;
    }
  }
  __device__ __forceinline__ void Load(int64_t k0, bf16*) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      raw[i] = LoadWeights16(reinterpret_cast<const uint4*>(codes[i] + k0 / 2));
      s[i] = __ldg(scale[i] + k0 / 32);
    }
  }
  // Codes 2j and 2j + 1 of a word to nibbles j and j + 4 (Mxfp4Bf16x8 then pairs them).
  __device__ __forceinline__ static uint32_t Unshuffle(uint32_t w) {
    uint32_t e = w & 0x0F0F0F0Fu, o = (w >> 4) & 0x0F0F0F0Fu;
    e = (e | (e >> 4)) & 0x00FF00FFu;
    o = (o | (o >> 4)) & 0x00FF00FFu;
    e = (e | (e >> 8)) & 0x0000FFFFu;
    o = (o | (o >> 8)) & 0x0000FFFFu;
    return e | (o << 16);
  }
  __device__ __forceinline__ void Store(int64_t, bf16* stage) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const uint32_t s2 = E8M0Bf16x2(s[i]);
      const uint32_t words[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        StoreShared16(stage + dst[i] + 8 * j, Mxfp4Bf16x8(Unshuffle(words[j]), s2));
      }
    }
  }
};

// FP8 blocks: a thread takes 16 bytes of each of two rows' slices (within one scale block:
// block_cols % 16 == 0).
template <int kThreads>
struct TileFp8 {
  static constexpr int kChunks = kTileN * kTileK / 16 / kThreads;  // 2 or 4
  const uint8_t* p[kChunks];
  const float* srow[kChunks];  // the row's scales at column 0
  int col[kChunks], dst[kChunks];
  int32_t block_cols;
  uint4 raw[kChunks];
  float s[kChunks];
  template <class RowOf>
  __device__ __forceinline__ void Init(const TiledExpertWeights& w, int64_t row0, RowOf row_of,
                                       int64_t k_in) {
    block_cols = w.fp8.block_cols;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c >> 2;
      col[i] = (c & 3) * 16;
      const int64_t g = row0 + row_of(r);
      p[i] = w.fp8.w + g * k_in + col[i];
      srow[i] = w.fp8.scale + w.fp8.ScaleIndex(g, 0);
      dst[i] = r * kPitch + col[i];
    }
  }
  __device__ __forceinline__ void Load(int64_t k0, bf16*) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      raw[i] = LoadWeights16(reinterpret_cast<const uint4*>(p[i] + k0));
      s[i] = __ldg(srow[i] + static_cast<int32_t>(k0 + col[i]) / block_cols);  // 32-bit divide
    }
  }
  __device__ __forceinline__ void Store(int64_t, bf16* stage) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      StoreShared16(stage + dst[i], Fp8Bf16x8(raw[i].x, raw[i].y, s[i]));
      StoreShared16(stage + dst[i] + 8, Fp8Bf16x8(raw[i].z, raw[i].w, s[i]));
    }
  }
};

// m-tiles[e] prefix: tile_start[e] = Σ_{e' < e} ceil(count(e') / rows), tile_start[E] the total.
__global__ void __launch_bounds__(kScanThreads) TileStartKernel(const int32_t* offsets,
                                                                int32_t experts, int32_t rows,
                                                                int32_t* tile_start) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  int32_t v[kScanItems];
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = threadIdx.x * kScanItems + i;
    v[i] = e < experts ? (offsets[e + 1] - offsets[e] + rows - 1) / rows : 0;
  }
  Scan(temp).ExclusiveSum(v, v);
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = threadIdx.x * kScanItems + i;
    if (e <= experts) tile_start[e] = v[i];
  }
}

struct GemmArgs {
  const bf16* x;             // gate_up: u in bf16 [T, K] (rows by token); down: h [A, K] sorted
  bool by_token;             // x row of sorted assignment a: order[a] / top_k, else a
  int64_t top_k;
  TiledExpertWeights w;
  int64_t n_out;             // gate_up: I (h columns); down: D
  int64_t k_in;
  float limit;
  const int32_t* order;
  const int32_t* offsets;
  const int32_t* tile_start;  // token tiles prefix (TileStartKernel)
  int32_t experts;
  int32_t n_tiles;           // weight tiles per expert
  void* y;                   // gate_up: h bf16 [A, I]; down: y fp32 [A, D] at order[a]
};

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

  // This block's tile: expert e with tile_start[e] * n_tiles <= b < tile_start[e + 1] * n_tiles,
  // found in a copy of the prefix in shared memory (the stages' space, not yet in use).
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  int32_t* const ts = reinterpret_cast<int32_t*>(smem_raw);
  for (int i = threadIdx.x; i <= g.experts; i += kThreads) ts[i] = g.tile_start[i] * g.n_tiles;
  __syncthreads();
  if (b >= ts[g.experts]) return;
  int lo = 0, hi = g.experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (ts[mid] <= b) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int32_t e = lo;
  const int32_t local = b - ts[e];
  __syncthreads();  // every thread has read the prefix before the stages overwrite it
  const int32_t a0 = g.offsets[e], count = g.offsets[e + 1] - a0;
  const int32_t m_tiles = (count + kRows - 1) / kRows;
  const int32_t n_tile = local / m_tiles, m0 = (local % m_tiles) * kRows;

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
            // SwiGluKernel's clamps and expression.
            const float gate = fminf(acc[mt][q][half * 2 + j], g.limit);
            const float up =
                fminf(fmaxf(acc[mt][q + kNt / 2][half * 2 + j], -g.limit), g.limit);
            v[j] = gate / (1.0f + expf(-gate)) * up;
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
  const int64_t bound =
      ((assignments + kRows - 1) / kRows + std::min<int64_t>(g.experts, assignments)) * g.n_tiles;
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

absl::Status MoeExpertsTiled(const ExpertsShape& d, int tile_rows, int warps, const float* u,
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
  RETURN_IF_ERROR(CastToBf16(u, w.xb, d.tokens * d.dim, stream));
  TileStartKernel<<<1, kScanThreads, 0, stream>>>(w.offsets, static_cast<int32_t>(d.experts),
                                                  tile_rows, w.tile_start);
  CUDA_RETURN_IF_LAUNCH_ERROR();
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
  switch (gate_up.format) {
    case QuantFormat::kNone:
      RETURN_IF_ERROR(RunTiledRows<TileBf16>(tile_rows, warps, d, gu, dn, stream));
      break;
    case QuantFormat::kMxfp4:
      RETURN_IF_ERROR(RunTiledRows<TileMxfp4>(tile_rows, warps, d, gu, dn, stream));
      break;
    case QuantFormat::kFp8Block:
      RETURN_IF_ERROR(RunTiledRows<TileFp8>(tile_rows, warps, d, gu, dn, stream));
      break;
  }
  return CombineAssignments(d, w.y, nullptr, weights, out, stream);
}

}  // namespace dsv4::cuda
