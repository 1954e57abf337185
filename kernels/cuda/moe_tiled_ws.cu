// The tiled grouped expert GEMMs as persistent warp-specialised kernels (moe_tile_parts.cuh:
// RunTiledWs; DSV4_MOE_WS=1, an experiment: bench/results/2026-12-07-ws-experts has where they
// stand against the wgmma kernels, which they match bit for bit).
//
// The wgmma kernels (moe_tiled_wgmma.cu) give every thread every job: each stage the whole block
// waits for its copies, synchronises, issues the products, expands the next quantised slice and
// waits for the products again, so the tensor cores idle at every stage boundary, and their
// token tiles are 64 or 128 assignments, so an expert's last tile is padded. Here the roles are
// split and the tiles follow the experts:
//
// * Block: three warpgroups, one block per SM, the grid one wave (persistent): a producer
//   warpgroup and two consumer warpgroups (setmaxnreg: 112 and 184 registers a thread; the
//   consumers' 128 accumulators and the producer's copies and expansion then fit unspilled).
// * Tile: 128 weight rows (64 a consumer warpgroup, the wgmma's M) x N assignments of one expert
//   (the wgmma's N): an expert's c assignments are split into ceil(c / kMaxN) even token tiles
//   (kMaxN 256, 128 or 64 by the step's average assignments an expert, MoeTiledWsRows) and each
//   tile's N is its count rounded up to 32 (N = 32 .. kMaxN: the products of padding rows are at
//   most 31 a tile). Tiles are numbered expert by expert, then weight tile, then token tile (a
//   weight tile's token tiles run side by side and share its weights through L2); block b takes
//   tiles b, b + grid, ... and finds each one's expert by a forward scan of the token-tile prefix
//   (TileStartKernel at kMaxN rows) kept in shared memory with the experts' offsets; each
//   tile's rows (its tokens, or down's output rows) are loaded a tile ahead into a table ring.
// * Stages: K in slices of 64 through a ring of 3 to 8 stages (WsRing: deeper for smaller
//   tiles), each a [128][64] bf16 weight tile and a [kMaxN][64] bf16 activation tile in the
//   128-byte swizzle (read by wgmma from shared memory: weights as A, assignments as B). Per
//   stage the producer waits for the stage to be empty, copies the activations (gathered by
//   token for gate_up; rows past the tile's count zero-filled) and bf16 weights with cp.async
//   and lets them arrive on the stage's `full` barrier as they land
//   (cp.async.mbarrier.arrive.noinc: the producer never waits for its own copies, so the whole
//   ring is in flight). Quantised weights (MXFP4 codes and the
//   4-byte word holding a row's two UE8M0 scales of the stage, or FP8 bytes and their block
//   scale) go through a second, deeper ring of small raw slices, copied kAhead stages ahead by
//   a second cursor over the same tiles; at stage it the producer waits for its own copies of
//   that stage's raw slice, expands it into the weight tile (each thread expands exactly what
//   it copied: no barrier), fences for the async proxy and arrives a second time. The header
//   of a tile's first stage (its first assignment, count, weight tile and N, or the end of the
//   work) tells the consumers what follows; every tile has K / 64 stages.
// * Consumers: per tile, one loop compiled for its N (so that the accumulators stay in place
//   between asynchronous products): wait `full`, fence (the copies were made by the generic
//   proxy, wgmma reads through the async one), issue the stage's four m64nNk16 products
//   (scale-d 0 on the tile's first), commit, wait for the previous stage's group and release
//   that stage (`empty`, one arrival a warp); after the last, wait for everything, release it
//   and run the epilogue from registers while the producer already fills the next tile's
//   stages.
// * gate_up: in each consumer warp's 16 weight rows, rows 0..7 are gate rows and rows 8..15 the
//   up rows of the same 8 h columns (WsWeightRow), so a thread holds gate and up of one column
//   for the clamped SwiGLU (h in bf16 [A, I], sorted order). down: y fp32 [A, D] at the
//   assignment's (t, k) index for the combine.
//
// Every output is summed over k in order, 16 k a product, from the same bf16 operands as the
// other tiled kernels, and depends on its own row and column only.
#include <cuda_bf16.h>

#include <algorithm>
#include <limits>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/moe_tile_parts.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kWsThreads = 384;         // producer warpgroup + two consumer warpgroups
constexpr int kWsProducers = 128;       // producer threads (full barriers' arrival count)
constexpr int kWsConsumerWarps = 8;     // consumer warps (empty barriers' arrival count)
constexpr int kWsRows = 128;            // weight rows a tile, 64 a consumer warpgroup
constexpr int kWsNStep = 32;            // a tile's N: its count rounded up to this
constexpr uint32_t kWsProducerRegs = 112, kWsConsumerRegs = 184;
constexpr uint32_t kWsProducerBarrier = 1;  // named barrier of the producer warpgroup
constexpr int kWsWBytes = kWsRows * kTileK * 2;  // a stage's weights in bf16 (16 KiB)
constexpr int kWsAlign = 1024;                   // the swizzled tiles' alignment

struct WsHeader {
  int32_t a0;      // the tile's first sorted assignment
  int32_t count;   // its assignments (<= n)
  int32_t n_tile;  // weight tile
  int16_t n;       // the tile's N
  int16_t table;   // its rows' table in the table ring, or kWsDone: the end of the work
};
constexpr int16_t kWsDone = -1;

// Weight row (within the expert) of tile row r: gate_up rows 16 g + i (i < 8) are the gate rows
// of h column 64 n_tile + 8 g + i, rows 16 g + 8 + i their up rows; down: 128 n_tile + r.
template <bool kSwiGlu>
__device__ __forceinline__ int64_t WsWeightRow(int r, int32_t n_tile, int64_t n_out) {
  if constexpr (kSwiGlu) {
    const int64_t j = int64_t{n_tile} * (kWsRows / 2) + (r >> 4) * 8 + (r & 7);
    return (r & 8) ? n_out + j : j;
  } else {
    return int64_t{n_tile} * kWsRows + r;
  }
}

// ---- Weight formats: producer thread t's share of a stage's 128 x 64 weight slice ----
// Init: the thread's rows of a tile. bf16 (kExpands false): IssueWeights copies the stage's
// weights into its weight tile with the activations. Quantised: IssueRaw copies a stage's raw
// slice (kRawBytes) into a raw ring a few stages before the stage is issued (WsRing: the raw
// slices are small, so more are in flight than the activation and weight tiles, which take
// most of the shared memory), and Expand turns the raw slice this thread copied itself into
// bf16 in the weight tile. `odd`: the stage's k0 / 64 is odd.

struct WsBf16 {
  static constexpr int kRawBytes = 0;
  static constexpr bool kPair4 = false;
  static constexpr bool kExpands = false;
  static constexpr int kChunks = kWsRows * kTileK / 8 / kWsProducers;  // 8 x 16 bytes
  const bf16* src[kChunks];
  template <bool kSwiGlu>
  __device__ __forceinline__ void Init(const TileGemmArgs& g, int64_t row0, int32_t n_tile,
                                       int t) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int q = t + i * kWsProducers;
      src[i] = static_cast<const bf16*>(g.w.bf16) +
               (row0 + WsWeightRow<kSwiGlu>(q >> 3, n_tile, g.n_out)) * g.k_in + (q & 7) * 8;
    }
  }
  __device__ __forceinline__ void IssueWeights(int64_t k0, bf16* wt, int t) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int q = t + i * kWsProducers;
      CpAsync16(wt + Swizzle128Layout::At(q >> 3, (q & 7) * 8), src[i] + k0);
    }
  }
};

// MXFP4: items q = t, t + 128 (row q / 2, scale group q % 2: 32 codes, 16 bytes); the 4-byte
// word of a row's scales that holds the stage's two (k_in % 128 == 0 keeps rows word-aligned).
// A word's 8 codes expand as they lie (Mxfp4Bf16x8Fold: columns 0, 4, 1, 5, ...), so the
// activations come in that order too (kPair4: u cast by CastToBf16Pair4, h written at
// Pair4Column) and the k sum is the same over a permuted k.
struct WsMxfp4 {
  static constexpr bool kPair4 = true;
  static constexpr int kCodeBytes = kWsRows * kTileK / 2;
  static constexpr int kRawBytes = kCodeBytes + 2 * kWsProducers * 4;
  static constexpr bool kExpands = true;
  const uint8_t* code[2];
  const uint8_t* scale[2];
  template <bool kSwiGlu>
  __device__ __forceinline__ void Init(const TileGemmArgs& g, int64_t row0, int32_t n_tile,
                                       int t) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = t + i * kWsProducers;
      const int64_t row = row0 + WsWeightRow<kSwiGlu>(q >> 1, n_tile, g.n_out);
      code[i] = g.w.fp4.w + row * (g.k_in / 2) + 16 * (q & 1);
      scale[i] = g.w.fp4.scale + row * (g.k_in / 32);
    }
  }
  __device__ __forceinline__ void IssueRaw(const TileGemmArgs&, int64_t k0, unsigned char* raw,
                                           int t) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = t + i * kWsProducers;
      CpAsync16(raw + 16 * q, code[i] + k0 / 2);
      CpAsync4(raw + kCodeBytes + 4 * q, scale[i] + (k0 / 128) * 4);
    }
  }
  __device__ __forceinline__ static void Expand(const unsigned char* raw, bf16* wt, bool odd,
                                                int t) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = t + i * kWsProducers, r = q >> 1, grp = q & 1;
      const uint4 v = *reinterpret_cast<const uint4*>(raw + 16 * q);
      const uint32_t word = *reinterpret_cast<const uint32_t*>(raw + kCodeBytes + 4 * q);
      const uint32_t s = (word >> (8 * (2 * static_cast<int>(odd) + grp))) & 0xFFu;
      const uint32_t fold2 = E8M0FoldBf16x2(s), rest2 = E8M0RestBf16x2(s);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint4 o = Mxfp4Bf16x8Fold(words[j], fold2);  // columns in Pair4Column's order
        if (s > 128u) o = MulBf16x8(o, rest2);  // scales above 2^1 (E8M0FoldBf16x2's cap)
        StoreShared16(wt + Swizzle128Layout::At(r, 32 * grp + 8 * j), o);
      }
    }
  }
};

// FP8 blocks: items q = t + 128 i (i < 4; row q / 4, 16 columns q % 4) and the block scale of
// each (block_cols % 16 == 0). The rows' code and scale-row offsets are found once a tile (Init:
// ScaleIndex's divisions), not every stage.
struct WsFp8 {
  static constexpr bool kPair4 = false;
  static constexpr int kCodeBytes = kWsRows * kTileK;
  static constexpr int kRawBytes = kCodeBytes + 4 * kWsProducers * 4;
  static constexpr bool kExpands = true;
  const uint8_t* code[4];
  const float* scale[4];  // the row's scales at column 0
  template <bool kSwiGlu>
  __device__ __forceinline__ void Init(const TileGemmArgs& g, int64_t row0, int32_t n_tile,
                                       int t) {
    const Fp8Matrix& m = g.w.fp8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = t + i * kWsProducers;
      const int64_t row = row0 + WsWeightRow<kSwiGlu>(q >> 2, n_tile, g.n_out);
      code[i] = m.w + row * g.k_in + (q & 3) * 16;
      scale[i] = m.scale + m.ScaleIndex(row, 0);
    }
  }
  __device__ __forceinline__ void IssueRaw(const TileGemmArgs& g, int64_t k0, unsigned char* raw,
                                           int t) const {
    const int32_t block_cols = g.w.fp8.block_cols;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = t + i * kWsProducers;
      CpAsync16(raw + 16 * q, code[i] + k0);
      CpAsync4(raw + kCodeBytes + 4 * q,
               scale[i] + static_cast<int32_t>(k0 + (q & 3) * 16) / block_cols);
    }
  }
  __device__ __forceinline__ static void Expand(const unsigned char* raw, bf16* wt, bool,
                                                int t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = t + i * kWsProducers, r = q >> 2, c = (q & 3) * 16;
      const uint4 v = *reinterpret_cast<const uint4*>(raw + 16 * q);
      const float s = *reinterpret_cast<const float*>(raw + kCodeBytes + 4 * q);
      StoreShared16(wt + Swizzle128Layout::At(r, c), Fp8Bf16x8(v.x, v.y, s));
      StoreShared16(wt + Swizzle128Layout::At(r, c + 8), Fp8Bf16x8(v.z, v.w, s));
    }
  }
};

// The rings of a kernel for weight format F and token tiles of at most kMaxN assignments
// (256, 128 or 64, from the experts' average assignments: MoeTiledWsRows): kStages activation +
// weight stages (a [128][64] weight tile and a [kMaxN][64] activation tile each, so small tiles
// get a deeper ring), kRawSlots raw slices for quantised weights, copied kAhead stages ahead,
// and kTables tables of a tile's rows (the producer may run a tile ahead per stage it holds).
template <class F, int kMaxN>
struct WsRing {
  static constexpr int kTBytes = kMaxN * kTileK * 2;
  static constexpr int kSlotBytes = kWsWBytes + kTBytes;
  static constexpr int kStages = F::kRawBytes == 0 ? (kMaxN == 256 ? 4 : kMaxN == 128 ? 6 : 8)
                                 : F::kPair4      ? (kMaxN == 256 ? 4 : kMaxN == 128 ? 5 : 6)
                                                  : (kMaxN == 256 ? 3 : kMaxN == 128 ? 4 : 5);
  static constexpr int kRawSlots = F::kRawBytes == 0 ? 0
                                   : F::kPair4      ? (kMaxN == 256 ? 5 : kMaxN == 128 ? 6 : 10)
                                                    : (kMaxN == 256 ? 7 : kMaxN == 128 ? 8 : 9);
  static constexpr int kAhead = kRawSlots > 0 ? kRawSlots - 1 : 0;
  static constexpr int kTables = kStages + 1;
  static_assert(kRawSlots == 0 || kAhead >= 3, "raw slices a few stages ahead");
  static constexpr size_t Bytes(int64_t experts) {
    return size_t{kWsAlign} + size_t{kStages} * kSlotBytes + size_t{kRawSlots} * F::kRawBytes +
           sizeof(int32_t) * (2 * (experts + 1) + size_t{kTables} * kMaxN);
  }
};

struct WsShared {
  unsigned char* slots;  // [kStages][kSlotBytes]: weights [128][64] then activations [kMaxN][64]
  unsigned char* raws;   // [kRawSlots][F::kRawBytes]
  int32_t* tile_end;     // [E + 1]: tiles before expert e (token tiles x weight tiles)
  int32_t* offsets;      // [E + 1]
  int32_t* tables;       // [kTables][kMaxN]: a tile's rows: gate_up its tokens, down its
                         // outputs' (t, k) rows (order); -1 past its count
  uint64_t* full;
  uint64_t* empty;
  WsHeader* header;
  int slot_bytes;
  __device__ __forceinline__ bf16* Weights(int slot) const {
    return reinterpret_cast<bf16*>(slots + slot * slot_bytes);
  }
  __device__ __forceinline__ bf16* Acts(int slot) const {
    return reinterpret_cast<bf16*>(slots + slot * slot_bytes + kWsWBytes);
  }
};

// A tile of the block's sequence (tile = blockIdx.x + j * gridDim.x) decoded by a forward scan
// of the prefix from the expert `e` of the cursor's previous tile.
struct WsTile {
  int32_t tile = 0, e = 0, n_tile = 0, a0 = 0, count = 0;
  int n = 0;
};
__device__ __forceinline__ void WsDecode(const TileGemmArgs& g, const WsShared& sh,
                                         WsTile& c) {
  while (sh.tile_end[c.e + 1] <= c.tile) ++c.e;
  const int32_t local = c.tile - sh.tile_end[c.e];
  const int32_t count = sh.offsets[c.e + 1] - sh.offsets[c.e];
  const int32_t m_tiles = (sh.tile_end[c.e + 1] - sh.tile_end[c.e]) / g.n_tiles;
  const int32_t j = local % m_tiles, base = count / m_tiles, rem = count % m_tiles;
  c.n_tile = local / m_tiles;
  c.count = base + (j < rem ? 1 : 0);
  c.a0 = sh.offsets[c.e] + j * base + min(j, rem);
  c.n = (c.count + kWsNStep - 1) / kWsNStep * kWsNStep;
}

// A tile's table entries r = t, t + 128 (kMaxN / 128 of them, or one for t < 64 at kMaxN 64),
// loaded a tile ahead into registers so that no tile start waits for order[].
template <int kMaxN>
struct WsRows {
  static constexpr int kEach = kMaxN >= kWsProducers ? kMaxN / kWsProducers : 1;
  int32_t v[kEach];
  __device__ __forceinline__ void Load(const TileGemmArgs& g, const WsTile& c, int t) {
#pragma unroll
    for (int i = 0; i < kEach; ++i) {
      const int r = t + i * kWsProducers;
      v[i] = c.tile >= 0 && r < c.count ? g.order[c.a0 + r] : -1;
      if (g.by_token && v[i] >= 0) v[i] /= static_cast<int32_t>(g.top_k);
    }
  }
  __device__ __forceinline__ void Store(int32_t* table, int t) const {
#pragma unroll
    for (int i = 0; i < kEach; ++i) {
      const int r = t + i * kWsProducers;
      if (r < kMaxN) table[r] = v[i];
    }
  }
};

// The producer warpgroup. Per stage `it` (slot it % kStages): wait for the slot to be empty,
// copy the activations (and bf16 weights) into it and let the hardware arrive on its `full`
// barrier when they land (one arrival a thread); for quantised weights also copy the raw slice
// of stage it + kAhead (a second cursor over the same tiles) and expand stage it's raw slice,
// which the thread copied kAhead stages ago, into the weight tile, then arrive (a second
// arrival); for bf16 thread 0 arrives a second time (the header's and table's release). Tile
// j's rows go to table j % kTables at its first stage; tile j + 1's are loaded into registers
// meanwhile.
template <class F, bool kSwiGlu, int kMaxN>
__device__ __forceinline__ void WsProducer(const TileGemmArgs& g, const WsShared& sh) {
  using Ring = WsRing<F, kMaxN>;
  constexpr int S = Ring::kStages;
  const int t = threadIdx.x;
  for (int i = t; i <= g.experts; i += kWsProducers) {
    sh.tile_end[i] = g.tile_start[i] * g.n_tiles;
    sh.offsets[i] = g.offsets[i];
  }
  NamedBarrierSync(kWsProducerBarrier, kWsProducers);
  const int32_t total = sh.tile_end[g.experts];
  const int64_t w_rows = kSwiGlu ? 2 * g.n_out : g.n_out;
  const int kt_count = static_cast<int>(g.k_in / kTileK);
  F ahead;  // quantised: the raw slices' cursor, kAhead stages ahead
  WsTile at{static_cast<int32_t>(blockIdx.x)};
  int at_kt = 0;
  auto issue_ahead = [&](int stage) {  // the raw slice of `stage`, one commit group a call
    if constexpr (F::kExpands) {
      if (at.tile < total) {
        if (at_kt == 0) {
          WsDecode(g, sh, at);
          ahead.template Init<kSwiGlu>(g, int64_t{at.e} * w_rows, at.n_tile, t);
        }
        ahead.IssueRaw(g, int64_t{at_kt} * kTileK,
                       sh.raws + (stage % Ring::kRawSlots) * F::kRawBytes, t);
        if (++at_kt == kt_count) {
          at_kt = 0;
          at.tile += gridDim.x;
        }
      }
      CpAsyncCommit();
    }
  };
  if constexpr (F::kExpands) {
    for (int p = 0; p < Ring::kAhead; ++p) issue_ahead(p);
  }
  F fmt;  // bf16: the weights' cursor, with the activations
  WsTile cur{static_cast<int32_t>(blockIdx.x)}, next;
  if (cur.tile < total) WsDecode(g, sh, cur);
  WsRows<kMaxN> rows;
  rows.Load(g, cur.tile < total ? cur : WsTile{-1}, t);
  int it = 0;
  for (int j = 0; cur.tile < total; ++j, cur = next) {
    const int table = j % Ring::kTables;
    int32_t* const tab = sh.tables + table * kMaxN;
    if constexpr (!F::kExpands) {
      fmt.template Init<kSwiGlu>(g, int64_t{cur.e} * w_rows, cur.n_tile, t);
    }
    const int chunk = (t & 7) * 8;
    for (int kt = 0; kt < kt_count; ++kt, ++it) {
      const int slot = it % S;
      MbarWait(&sh.empty[slot], ((it / S) & 1) ^ 1);
      if (kt == 0) {
        // Only now is the table free: the consumers have released stage it - S, so the oldest
        // tile whose epilogue may still read its table is the one holding that stage, at most
        // S tiles back (kTables = S + 1; before the wait it could be S + 1 back at one stage a
        // tile).
        rows.Store(tab, t);
        NamedBarrierSync(kWsProducerBarrier, kWsProducers);  // the table is written
        next = cur;  // the scan goes on from cur's expert
        next.tile += gridDim.x;
        if (next.tile < total) WsDecode(g, sh, next);
        rows.Load(g, next.tile < total ? next : WsTile{-1}, t);
        if (t == 0) {
          sh.header[slot] = WsHeader{cur.a0, cur.count, cur.n_tile, static_cast<int16_t>(cur.n),
                                     static_cast<int16_t>(table)};
        }
      }
      const int64_t k0 = int64_t{kt} * kTileK;
      bf16* const acts = sh.Acts(slot);
      for (int r = t >> 3; r < cur.n; r += kWsProducers / 8) {
        const int32_t src = kSwiGlu ? tab[r] : r < cur.count ? cur.a0 + r : -1;
        CpAsync16(acts + Swizzle128Layout::At(r, chunk),
                  g.x + int64_t{max(src, 0)} * g.k_in + k0 + chunk, src >= 0);
      }
      if constexpr (!F::kExpands) fmt.IssueWeights(k0, sh.Weights(slot), t);
      MbarArriveOnCopies(&sh.full[slot]);
      if constexpr (!F::kExpands) {
        // The header and the table reach the consumers through an ordinary (release) arrival:
        // the copies' arrivals are not documented to order this thread's stores. The named
        // barrier above ordered the other threads' table stores before thread 0's.
        if (t == 0) MbarArrive(&sh.full[slot]);
      } else {
        issue_ahead(it + Ring::kAhead);
        CpAsyncWait<Ring::kAhead>();  // the group holding stage it's raw slice has landed
        F::Expand(sh.raws + (it % Ring::kRawSlots) * F::kRawBytes, sh.Weights(slot), kt & 1,
                  t);
        FenceProxyAsyncShared();
        MbarArrive(&sh.full[slot]);
      }
    }
  }
  CpAsyncWait<0>();  // nothing in flight at exit
  const int slot = it % S;  // the end of the work
  MbarWait(&sh.empty[slot], ((it / S) & 1) ^ 1);
  if (t == 0) sh.header[slot].table = kWsDone;
  MbarArrive(&sh.full[slot]);
  if (F::kExpands || t == 0) MbarArrive(&sh.full[slot]);
}

// A stage's four k16 products for a tile of N assignments.
template <int N>
__device__ __forceinline__ void WsProducts(float (&acc)[128], uint64_t desc_w, uint64_t desc_x,
                                           bool first) {
#pragma unroll
  for (int ks = 0; ks < kTileK / 16; ++ks) {  // 32 bytes = 2 descriptor units a step
    WgmmaBf16Ss<N>(acc, desc_w + 2 * ks, desc_x + 2 * ks, first && ks == 0 ? 0 : 1);
  }
}

// The tile's outputs from the accumulators of consumer warpgroup cg (warp w, lane l): rows 16 w
// + l / 4 (+ 8) of its 64 weight rows, assignments 8 jj + 2 (l % 4) (+ 1); down's output rows
// from the tile's table.
template <bool kSwiGlu, bool kPair4, int N>
__device__ __forceinline__ void WsEpilogue(const TileGemmArgs& g, const float (&acc)[128],
                                           const WsHeader& h, const int32_t* tab, int cg, int w,
                                           int l) {
  const int q2 = 2 * (l & 3);
  if constexpr (kSwiGlu) {
    // Row a0 + 8 jj + q2 (+ 1) of h, column j = 64 n_tile + 32 cg + 8 w + l / 4 (stored at
    // Pair4Column(j) for the MXFP4 down GEMM): one pointer stepped by 8 rows (the addresses are
    // not all held at once next to the accumulators).
    const int64_t j = int64_t{h.n_tile} * (kWsRows / 2) + 32 * cg + 8 * w + (l >> 2);
    bf16* out = static_cast<bf16*>(g.y) + int64_t{h.a0 + q2} * g.n_out +
                (kPair4 ? Pair4Column(j) : j);
    const int64_t step = 8 * g.n_out;
#pragma unroll
    for (int jj = 0; jj < N / 8; ++jj, out += step) {
      const int m = 8 * jj + q2;
      if (m < h.count) {
        out[0] = __float2bfloat16_rn(ClampedSwiGlu(acc[4 * jj], acc[4 * jj + 2], g.limit));
      }
      if (m + 1 < h.count) {
        out[g.n_out] =
            __float2bfloat16_rn(ClampedSwiGlu(acc[4 * jj + 1], acc[4 * jj + 3], g.limit));
      }
    }
  } else {
    float* const out =
        static_cast<float*>(g.y) + int64_t{h.n_tile} * kWsRows + 64 * cg + 16 * w + (l >> 2);
#pragma unroll
    for (int jj = 0; jj < N / 8; ++jj) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int m = 8 * jj + q2 + q;
        if (m < h.count) {
          float* const row = out + int64_t{tab[m]} * g.n_out;  // order[a0 + m]
          row[0] = acc[4 * jj + q];
          row[8] = acc[4 * jj + 2 + q];
        }
      }
    }
  }
}

// One tile for consumer warpgroup cg: its kt_count stages from stage `it` (whose `full` the
// caller has waited for), products issued a stage ahead of their wait, each stage released once
// its products are done; then the epilogue. N is fixed over the tile's loop, so the accumulators
// stay in place between the asynchronous products.
template <bool kSwiGlu, bool kPair4, int S, int N>
__device__ __forceinline__ void WsConsumeTile(const TileGemmArgs& g, const WsShared& sh,
                                              float (&acc)[128], int& it, const WsHeader& h,
                                              const int32_t* tab, int kt_count, int cg, int w,
                                              int l) {
  int prev = -1;
  for (int kt = 0; kt < kt_count; ++kt, ++it) {
    const int slot = it % S;
    if (kt > 0) MbarWait(&sh.full[slot], (it / S) & 1);
    FenceProxyAsyncShared();  // the stage's cp.async data, now visible, for the async proxy
    WgmmaFence();
    WsProducts<N>(acc, WgmmaDescSw128(sh.Weights(slot) + cg * 64 * kTileK),
                  WgmmaDescSw128(sh.Acts(slot)), kt == 0);
    WgmmaCommit();
    if (prev >= 0) {  // the previous stage's products are done: release it
      WgmmaWait<1>();
      __syncwarp();
      if (l == 0) MbarArrive(&sh.empty[prev]);
    }
    prev = slot;
  }
  WgmmaWait<0>();
  WgmmaFenceOperands(acc);
  __syncwarp();
  if (l == 0) MbarArrive(&sh.empty[prev]);
  WsEpilogue<kSwiGlu, kPair4, N>(g, acc, h, tab, cg, w, l);
}

template <bool kSwiGlu, bool kPair4, int S, int kMaxN>
__device__ __forceinline__ void WsConsumer(const TileGemmArgs& g, const WsShared& sh) {
  const int cg = (threadIdx.x >> 7) - 1;  // consumer warpgroup 0 or 1
  const int w = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  const int kt_count = static_cast<int>(g.k_in / kTileK);
  float acc[128];
  for (int it = 0;;) {
    const int slot = it % S;  // a tile's first stage, or the end of the work
    MbarWait(&sh.full[slot], (it / S) & 1);
    const WsHeader h = sh.header[slot];
    if (h.table == kWsDone) break;
    const int32_t* const tab = sh.tables + h.table * kMaxN;
    switch (h.n) {
#define DSV4_WS_TILE(N)                                                                   \
  case N:                                                                                 \
    if constexpr (N <= kMaxN) {                                                           \
      WsConsumeTile<kSwiGlu, kPair4, S, N>(g, sh, acc, it, h, tab, kt_count, cg, w, l);   \
      break;                                                                              \
    }                                                                                     \
    [[fallthrough]];
      DSV4_WS_TILE(32) DSV4_WS_TILE(64) DSV4_WS_TILE(96) DSV4_WS_TILE(128)
      DSV4_WS_TILE(160) DSV4_WS_TILE(192) DSV4_WS_TILE(224) DSV4_WS_TILE(256)
#undef DSV4_WS_TILE
      default:
        __trap();  // the producer writes multiples of kWsNStep up to kMaxN only
    }
  }
}

template <class F, bool kSwiGlu, int kMaxN>
__global__ void __launch_bounds__(kWsThreads, 1) ExpertWsKernel(const TileGemmArgs g) {
  using Ring = WsRing<F, kMaxN>;
  constexpr int S = Ring::kStages;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[S], empty[S];
  __shared__ WsHeader header[S];
  unsigned char* const base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kWsAlign - 1) & ~uintptr_t{kWsAlign - 1});
  WsShared sh;
  sh.slots = base;
  sh.slot_bytes = Ring::kSlotBytes;
  sh.raws = base + S * Ring::kSlotBytes;
  sh.tile_end = reinterpret_cast<int32_t*>(sh.raws + Ring::kRawSlots * F::kRawBytes);
  sh.offsets = sh.tile_end + (g.experts + 1);
  sh.tables = sh.offsets + (g.experts + 1);
  sh.full = full;
  sh.empty = empty;
  sh.header = header;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      // bf16: a copies' arrival a producer and thread 0's ordinary one; quantised: a copies'
      // arrival and an ordinary one a producer.
      MbarInit(&full[s], F::kExpands ? 2 * kWsProducers : kWsProducers + 1);
      MbarInit(&empty[s], kWsConsumerWarps);
    }
    MbarInitFence();
  }
  __syncthreads();
  if (threadIdx.x < kWsProducers) {
    WarpgroupRegsDecrease<kWsProducerRegs>();
    WsProducer<F, kSwiGlu, kMaxN>(g, sh);
  } else {
    WarpgroupRegsIncrease<kWsConsumerRegs>();
    WsConsumer<kSwiGlu, F::kPair4, S, kMaxN>(g, sh);
  }
}

// An attribute of the current device, or 0 where it cannot be read.
int DeviceAttribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) {
    return 0;
  }
  return value;
}

template <class F>
size_t WsSmemOf(int max_n, int64_t experts) {
  return max_n == 256   ? WsRing<F, 256>::Bytes(experts)
         : max_n == 128 ? WsRing<F, 128>::Bytes(experts)
                        : WsRing<F, 64>::Bytes(experts);
}

size_t WsSmem(QuantFormat format, int max_n, int64_t experts) {
  switch (format) {
    case QuantFormat::kNone:
      return WsSmemOf<WsBf16>(max_n, experts);
    case QuantFormat::kMxfp4:
      return WsSmemOf<WsMxfp4>(max_n, experts);
    case QuantFormat::kFp8Block:
      return WsSmemOf<WsFp8>(max_n, experts);
  }
  return 0;
}

template <class F, bool kSwiGlu, int kMaxN>
absl::Status LaunchWs(const TileGemmArgs& g, cudaStream_t stream) {
  const size_t smem = WsRing<F, kMaxN>::Bytes(g.experts);
  auto kernel = ExpertWsKernel<F, kSwiGlu, kMaxN>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  const int sms = DeviceAttribute(cudaDevAttrMultiProcessorCount);
  if (sms <= 0) return absl::InternalError("MoeExpertsTiled: no multiprocessor count");
  kernel<<<static_cast<unsigned>(sms), kWsThreads, smem, stream>>>(g);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <class F>
absl::Status RunWsFormat(int max_n, const TileGemmArgs& gu, const TileGemmArgs& dn,
                         cudaStream_t stream) {
  switch (max_n) {
    case 256:
      RETURN_IF_ERROR((LaunchWs<F, true, 256>(gu, stream)));
      return LaunchWs<F, false, 256>(dn, stream);
    case 128:
      RETURN_IF_ERROR((LaunchWs<F, true, 128>(gu, stream)));
      return LaunchWs<F, false, 128>(dn, stream);
    case 64:
      RETURN_IF_ERROR((LaunchWs<F, true, 64>(gu, stream)));
      return LaunchWs<F, false, 64>(dn, stream);
  }
  return absl::InvalidArgumentError("MoeExpertsTiled: token tiles of 64, 128 or 256 only");
}

}  // namespace

int MoeTiledWsRows(int64_t assignments, int64_t experts) {
  const int64_t average = experts > 0 ? assignments / experts : 0;
  return average > 96 ? 256 : average > 40 ? 128 : 64;
}

bool TiledWsFits(QuantFormat format, int max_n, int64_t dim, int64_t inter, int64_t experts,
                 const TiledExpertWeights& gate_up, const TiledExpertWeights& down) {
  if (format == QuantFormat::kMxfp4) {
    // A row's scales start on a 4-byte word (the stage's two scale bytes are copied as one).
    if (dim % 128 != 0 || inter % 128 != 0 ||
        reinterpret_cast<uintptr_t>(gate_up.fp4.scale) % 4 != 0 ||
        reinterpret_cast<uintptr_t>(down.fp4.scale) % 4 != 0) {
      return false;
    }
  }
  // The barriers and headers are static shared memory: at most 8 stages x 32 bytes.
  constexpr size_t kStaticBytes = 256;
  const size_t optin =
      static_cast<size_t>(DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  return optin > kStaticBytes && WsSmem(format, max_n, experts) <= optin - kStaticBytes;
}

absl::Status RunTiledWs(QuantFormat format, int max_n, const TileGemmArgs& gu,
                        const TileGemmArgs& dn, cudaStream_t stream) {
  switch (format) {
    case QuantFormat::kNone:
      return RunWsFormat<WsBf16>(max_n, gu, dn, stream);
    case QuantFormat::kMxfp4:
      return RunWsFormat<WsMxfp4>(max_n, gu, dn, stream);
    case QuantFormat::kFp8Block:
      return RunWsFormat<WsFp8>(max_n, gu, dn, stream);
  }
  return absl::InvalidArgumentError("MoeExpertsTiled: unknown weight format");
}

}  // namespace dsv4::cuda
