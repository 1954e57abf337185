// The parts the two tiled grouped expert GEMMs share (moe_tiled.cu: mma.sync from ldmatrix;
// moe_tiled_wgmma.cu: Hopper warpgroup MMAs from swizzled shared memory): the tile geometry,
// cp.async, the shared-memory layouts of a stage, the weight formats' loaders, the token-tile
// prefix and the block -> (expert, weight tile, token tile) lookup.
//
// Included by both .cu files: everything here is in an unnamed namespace (each file instantiates
// its own kernels), except the declaration of the wgmma launcher at the end.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "absl/status/status.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/moe_tiled.h"

namespace dsv4::cuda {

// The arguments of one of the two GEMMs (gate_up with SwiGLU, or down).
struct TileGemmArgs {
  const __nv_bfloat16* x;    // gate_up: u in bf16 [T, K] (rows by token); down: h [A, K] sorted
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
  void* y;  // gate_up: h bf16 [A, I] (fp32: FP8 kernels); down: y fp32 [A, D] at order[a]
  // The FP8 kernels' activations (moe_tiled_fp8.cu): x in e4m3 with its 1 x 128 group scales
  // [K / 128][x8_rows] (QuantizeFp8Groups), rows as for x.
  const uint8_t* x8 = nullptr;
  const float* x8_scales = nullptr;
  int64_t x8_rows = 0;
};

// The wgmma kernels (moe_tiled_wgmma.cu) for `format`, with token tiles of `tile_rows` (64 or
// 128), gate_up then down; `assignments` = T * top_k.
absl::Status RunTiledWgmma(QuantFormat format, int tile_rows, const TileGemmArgs& gu,
                           const TileGemmArgs& dn, int64_t assignments, cudaStream_t stream);

// The warp-specialised persistent kernels (moe_tiled_ws.cu), gate_up then down, with token tiles
// of at most `max_n` assignments (MoeTiledWsRows: 256, 128 or 64 by the experts' average
// assignments, shapes only); `tile_start` of both must be the token-tile prefix at max_n rows
// (TileStartKernel). TiledWsFits: whether they take these shapes and weights on this device
// (MXFP4: D and I multiples of 128 and word-aligned scales; the rings and the experts' prefix
// within the device's shared memory).
int MoeTiledWsRows(int64_t assignments, int64_t experts);
bool TiledWsFits(QuantFormat format, int max_n, int64_t dim, int64_t inter, int64_t experts,
                 const TiledExpertWeights& gate_up, const TiledExpertWeights& down);
absl::Status RunTiledWs(QuantFormat format, int max_n, const TileGemmArgs& gu,
                        const TileGemmArgs& dn, cudaStream_t stream);

// The FP8 kernels (moe_tiled_fp8.cu): MXFP4 experts expanded to e4m3 in shared memory against
// e4m3 activations, 64-row token tiles; gate_up writes h in fp32 (quantised between the two).
absl::Status RunTiledFp8Gemm(bool swiglu, const TileGemmArgs& g, int64_t assignments,
                             cudaStream_t stream);

namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileN = 128;  // weight rows per block (gate_up: 64 gate + their 64 up)
constexpr int kTileK = 64;   // k per stage
constexpr int kScanThreads = 1024, kScanItems = 4;
constexpr int64_t kMaxExperts = int64_t{kScanThreads} * kScanItems - 1;

__device__ __forceinline__ void StoreShared16(bf16* smem, const uint4& v) {
  *reinterpret_cast<uint4*>(smem) = v;
}

// ---- Where element (row r, column c) of a stage's [rows][kTileK] bf16 tile is ----
// Chunks of 8 columns (16 bytes) are never split: c % 8 == 0 at every store.

// Rows of 144 bytes (ldmatrix conflict-free): the mma.sync kernel's.
struct PitchLayout {
  static constexpr int kPitch = kTileK + 8;
  __device__ __forceinline__ static int At(int r, int c) { return r * kPitch + c; }
};
// Rows of 128 bytes with the 16-byte chunks of row r XOR-ed by r % 8 (the 128-byte swizzle of
// the wgmma shared-memory descriptors; the tile must start 1024-byte aligned).
struct Swizzle128Layout {
  static constexpr int kPitch = kTileK;
  __device__ __forceinline__ static int At(int r, int c) {
    return r * kTileK + ((((c >> 3) ^ r) & 7) << 3);
  }
};

// ---- Weight formats: a thread's share of a 128 x 64 weight slice ----
// Init(w, row0_of_expert, tile-row map, k_in): the thread's rows; Load(k0, stage): cp.async into
// the stage (bf16) or into registers (quantised); Store(k0, stage): the registers expanded into
// the stage (quantised; nothing for bf16).

template <int kThreads, class L>
struct TileBf16 {
  static constexpr int kChunks = kTileN * kTileK / 8 / kThreads;  // 2, 4 or 8 x 16 bytes
  const bf16* p[kChunks];
  int dst[kChunks];  // offset in the stage
  template <class RowOf>
  __device__ __forceinline__ void Init(const TiledExpertWeights& w, int64_t row0, RowOf row_of,
                                       int64_t k_in) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c >> 3, col = (c & 7) * 8;
      p[i] = static_cast<const bf16*>(w.bf16) + (row0 + row_of(r)) * k_in + col;
      dst[i] = L::At(r, col);
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
template <int kThreads, class L>
struct TileMxfp4 {
  static constexpr int kChunks = kTileN * kTileK / 32 / kThreads;  // 1 or 2
  const uint8_t* codes[kChunks];
  const uint8_t* scale[kChunks];
  int row[kChunks], col[kChunks];
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
      row[i] = r;
      col[i] = half * 32;
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
        StoreShared16(stage + L::At(row[i], col[i] + 8 * j),
                      Mxfp4Bf16x8(Unshuffle(words[j]), s2));
      }
    }
  }
};

// FP8 blocks: a thread takes 16 bytes of each of two rows' slices (within one scale block:
// block_cols % 16 == 0).
template <int kThreads, class L>
struct TileFp8 {
  static constexpr int kChunks = kTileN * kTileK / 16 / kThreads;  // 2 or 4
  const uint8_t* p[kChunks];
  const float* srow[kChunks];  // the row's scales at column 0
  int row[kChunks], col[kChunks];
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
      row[i] = r;
      col[i] = (c & 3) * 16;
      const int64_t g = row0 + row_of(r);
      p[i] = w.fp8.w + g * k_in + col[i];
      srow[i] = w.fp8.scale + w.fp8.ScaleIndex(g, 0);
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
      StoreShared16(stage + L::At(row[i], col[i]), Fp8Bf16x8(raw[i].x, raw[i].y, s[i]));
      StoreShared16(stage + L::At(row[i], col[i] + 8), Fp8Bf16x8(raw[i].z, raw[i].w, s[i]));
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

// A block's tile: expert e, its first sorted assignment a0 and count, weight tile n_tile and the
// first assignment m0 of its token tile (within the expert).
struct TileCoord {
  int32_t e, a0, count, n_tile, m0;
};

// Block b's tile, or false for a block past the end (uniform over the block). The expert is
// found by binary search in a copy of the prefix in `scratch` (shared memory for experts + 1
// ints, free again when this returns). Blocks are numbered expert by expert, and within an
// expert by weight tile, then token tile.
__device__ __forceinline__ bool FindTile(const TileGemmArgs& g, int rows, int32_t* scratch,
                                         TileCoord* tc) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  for (int i = threadIdx.x; i <= g.experts; i += blockDim.x) {
    scratch[i] = g.tile_start[i] * g.n_tiles;
  }
  __syncthreads();
  if (b >= scratch[g.experts]) return false;
  int lo = 0, hi = g.experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (scratch[mid] <= b) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int32_t local = b - scratch[lo];
  __syncthreads();  // every thread has read the prefix before the caller reuses the space
  tc->e = lo;
  tc->a0 = g.offsets[lo];
  tc->count = g.offsets[lo + 1] - tc->a0;
  const int32_t m_tiles = (tc->count + rows - 1) / rows;
  tc->n_tile = local / m_tiles;
  tc->m0 = (local % m_tiles) * rows;
  return true;
}

// The grid bound of a GEMM: every expert's token tiles (at most A / rows full ones plus one
// partial per expert with assignments) times its weight tiles; shapes only (graph capture).
inline int64_t TileGridBound(int64_t assignments, int64_t experts, int rows, int32_t n_tiles) {
  return ((assignments + rows - 1) / rows + std::min<int64_t>(experts, assignments)) * n_tiles;
}

}  // namespace
}  // namespace dsv4::cuda
