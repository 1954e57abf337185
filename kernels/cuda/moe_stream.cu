// The weight-streaming MXFP4 expert GEMMs (moe_stream.h).
//
// At a 1k-token prefill the 256 experts get ~24 assignments each: every expert's weights are
// read (3.4 GB a Flash layer, 0.7 ms at 4.8 TB/s) and there are too few tokens for the tiled
// GEMMs' 64-row tiles. The wide kernel (moe_mma.cuh) keeps an expert's weights in registers and
// so has two k blocks in flight per warp, and each block of 128 weight rows stages the expert's
// activations in chunks between barriers that drain that stream: 4.0 ms a layer (0.84 TB/s).
//
// Here each warp owns a 16-row tile (8 gate + 8 up rows, or 16 down rows) as in the wide kernel,
// with the same lane-quad layout (MmaTile, Mxfp4FoldWeights: a lane's 16-byte word is 32 e2m1
// codes of one scale group, expanded to four bf16 A-fragment words in registers), but its weights
// come through a ring of kStages k blocks in shared memory filled by cp.async: each lane copies
// its own 16-byte words (rows lo and hi) and the 4-byte scale words holding its groups' bytes,
// and reads back only what it copied, so a warp's ring needs no barrier, only
// cp.async.wait_group. 16 warps (256 weight rows) share one block's staged activations: the
// pass's tokens (up to kGroups groups of 8) in chunks of kChunk k blocks, three buffers, each
// chunk copied by cp.async two chunks ahead in the same commit groups as the weights, so the one
// barrier per chunk never drains a weight ring. The activations are stored in the column order
// the products read (below): u by a cast kernel here, h by the gate_up epilogue, so a 16-byte
// copy needs no shuffle. An expert with more than kGroups * 8 assignments streams its weights
// once per pass.
//
// The products (DSV4_MOE_STREAM_WGMMA): by default on warpgroup MMAs, wgmma m64nNk16 with N = 8
// per group: each warp's expanded words are its 16 rows of A in registers (two register sets, so
// the next word expands while a word's products run), and the staged activations are B, read by
// the tensor cores from shared memory in the 128-byte swizzle (no shared-memory loads per warp,
// which were the mma.sync kernel's largest stall). For that u and h are stored in the order the
// A fragments take the columns (LogicalOfPhysical: each k16 step's 16 columns consecutive). The
// baseline, `mma.sync` m16n8k16, reads each group's B word from shared memory per warp, with u
// and h in the expansion's pair order (Pair4Column).
//
// gate_up: h = SwiGLU in bf16 [A, I] in assignment order; down: y in (t, k) order
// (scatter_out), then the deterministic combine. Per output the products are the wide kernel's
// (moe_mma.cuh, the same bf16 operands, k blocks in order, K unsplit): both product paths give
// the wide kernel's bits (CudaMoeStream.GivesTheWideKernelsBits). The k loop is compiled per
// group count (DispatchGroups): with a runtime bound the products of absent groups were issued
// predicated off.
//
// H200, 256 Flash experts, uniform routing (bench/dsv4_gpu_kernels_bench --moe-quant-only;
// bench/results/2026-12-04-stream-experts/): T = 1024 2.54 ms on wgmma, 2.81 on mma.sync, against
// the wide kernel's 4.16 (1.35 TB/s of MXFP4 weights against 0.82); T = 512 2.42 / 2.38 against
// 2.69; slice3 TTFT at 1k in precision fp8 12.26 ms (mma.sync 13.34, the wide kernel 16.9).
// Nsight Compute (gate_up, 1k prefill): 0.47 instructions issued a scheduler cycle (mma.sync
// 0.38, whose top stalls were shared-memory loads: short scoreboard and MIO throttle), DRAM 29 %;
// the e2m1 to bf16 expansion (~20 instructions per 8 codes) is most of what is left. Not kept: 5
// or 6 ring stages (no faster, 6 slower), a swizzle of the mma.sync kernel's staged words
// (conflict-free copies; no faster), two tiles a warp with 4 groups a pass (kernel 2.57 ms at
// T = 1024 on mma.sync, but TTFT 13.62 ms: experts over 32 assignments take a second pass), 8
// warps a block at two blocks an SM (TTFT 13.79 ms).
#include "kernels/cuda/moe_stream.h"

#include <algorithm>
#include <type_traits>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace dsv4::cuda {
namespace {

using P = Mxfp4FoldWeights;
constexpr int kStreamWarps = 16;
constexpr int kStreamThreads = kStreamWarps * 32;
constexpr int kBlocksPerSm = kStreamWarps >= 16 ? 1 : 2;
constexpr int kGroups = 8;  // 8-token groups per pass: 64 assignments
constexpr int kChunk = 2;   // k blocks of staged activations per chunk
constexpr int kXBuffers = 3;  // chunks staged: in use, landed, in flight
constexpr int kKBlock = P::kKBlock;  // 128: four scale groups of 32
constexpr int kW = P::kWords;        // 4 bf16 words of 8 k per lane per k block
// 16-byte words of one staged chunk (all kGroups groups) and per thread.
constexpr int kChunkWords = kChunk * kW * kGroups * 32;
constexpr int kChunkWordsPerThread = kChunkWords / kStreamThreads;
static_assert(kChunkWords % kStreamThreads == 0, "every thread stages the same count of words");
// k blocks of weights in a warp's ring (kStages - 1 in flight; 5 and 6 were no faster on the
// H200, bench/results/2026-12-04-stream-experts/).
constexpr int kStages = 4;
static_assert(kChunk * 16 == 32, "a warp stages one token's chunk: 32 words, one per lane");
// A warp's ring slot: rows lo and hi, 32 lanes' 16-byte codes (then, in the scale ring, their
// 4-byte scale words).
constexpr int kSlotWords = 2 * 32;
static_assert((kStages & (kStages - 1)) == 0 && kStreamWarps % kMmaTokens == 0, "slots by mask");
// Bytes between the staged words of a thread's consecutive tokens (kStreamWarps apart).
constexpr uint32_t kXTokenStride = (kStreamWarps / kMmaTokens) * 32 * 16;
constexpr size_t kSmemBytes = kXBuffers * kChunkWords * sizeof(uint4) +
                              size_t{kStreamWarps} * kStages * kSlotWords * (sizeof(uint4) + 4);

// The wgmma kernels' column order: in each 128 columns (a k block), the column that A-fragment
// position (k16 step σ = 2 t + h, k ℓ) holds after the expansion of word t of quad lane q:
// physical 32 q + 8 t + 2 h + o + 4 e for ℓ = 8 o + 2 q + e, stored at logical 16 σ + ℓ, so that
// a k16 step's B tile is 16 consecutive stored columns.
__device__ __forceinline__ int LogicalOfPhysical(int p) {
  const int q = p >> 5, t = (p >> 3) & 3, r = p & 7;
  return 16 * (2 * t + ((r >> 1) & 1)) + 8 * (r & 1) + 2 * q + (r >> 2);
}
__device__ __forceinline__ int PhysicalOfLogical(int l) {
  const int sg = l >> 4, r = l & 15;
  return 32 * ((r & 7) >> 1) + 8 * (sg >> 1) + 2 * (sg & 1) + (r >> 3) + 4 * (r & 1);
}
template <bool kWg>
__device__ __forceinline__ int64_t StoredColumn(int64_t c) {
  if constexpr (kWg) {
    return (c & ~int64_t{127}) | LogicalOfPhysical(static_cast<int>(c & 127));
  } else {
    return Pair4Column(c);
  }
}
// u [T, D] fp32 -> bf16 in the wgmma kernels' order (8 stored columns a thread; D % 128 == 0).
__global__ void CastLogicalKernel(const float* u, int64_t words, uint4* xb) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= words) return;
  const float* blk = u + (8 * i & ~int64_t{127});
  const int l0 = static_cast<int>(8 * i & 127);
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[j] = PackBf16x2(blk[PhysicalOfLogical(l0 + 2 * j)], blk[PhysicalOfLogical(l0 + 2 * j + 1)]);
  }
  xb[i] = make_uint4(o[0], o[1], o[2], o[3]);
}

// f(integral_constant<int, groups>) for 1 <= groups <= G.
template <int G, class F>
__device__ __forceinline__ void DispatchGroups(int groups, F& f) {
  if constexpr (G > 1) {
    if (groups < G) {
      DispatchGroups<G - 1>(groups, f);
      return;
    }
  }
  f(std::integral_constant<int, G>{});
}

// A warp's k block of weights from its ring slot: rows lo and hi (the lane's 16-byte codes and
// its group's scale byte); true where either scale is above 2^1 (the two-product expansion).
__device__ __forceinline__ bool LoadSlot(const uint4* ring_w, const uint32_t* ring_s, int slot,
                                         int lane, P::Raw& lo, P::Raw& hi) {
  const int quad = lane & 3;
  lo.w = ring_w[slot * kSlotWords + lane];
  hi.w = ring_w[slot * kSlotWords + 32 + lane];
  lo.s = (ring_s[slot * kSlotWords + lane] >> (8 * quad)) & 0xFFu;
  hi.s = (ring_s[slot * kSlotWords + 32 + lane] >> (8 * quad)) & 0xFFu;
  return P::Big(lo) || P::Big(hi);
}

// One k block's products on mma.sync: each word t of the lane's codes expanded to A words, then
// per group g one 16-byte B word of the staged chunk xk (k block kbl of it) and two m16n8k16.
template <int G>
__device__ __forceinline__ void MmaSyncKBlock(float (&acc)[G][4], const P::Raw& lo,
                                              const P::Raw& hi, bool big, const uint4* xk,
                                              int kbl, int lane) {
  auto products = [&](auto expand) {
#pragma unroll
    for (int t = 0; t < kW; ++t) {
      const int v = kbl * kW + t;
      const uint4 a_lo = expand(lo, t), a_hi = expand(hi, t);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const uint4 b = xk[(v * kGroups + g) * 32 + lane];  // one 16-byte load
        MmaWord(acc[g], a_lo, a_hi, b);
      }
    }
  };
  // A warp with any scale above 2^1 in this k block takes the two products (the lanes are
  // converged: the loop and the tile are uniform per warp).
  if (__any_sync(0xffffffffu, big)) {
    products([](const P::Raw& r, int t) { return P::ExpandBig(r, t); });
  } else {
    products([](const P::Raw& r, int t) { return P::Expand(r, t); });
  }
}

// One k block's products on the warpgroup: word t's two k16 steps (h = 0, 1), A from registers,
// B the staged tiles at shared address `tiles` (this k block's two 64-column tiles). Two register
// sets a (the caller's, alive across k blocks) so that word t + 1 is expanded while word t's
// products run. One code path for the whole warpgroup: the scale product of a k block with
// scales above 2^1 is a select, not a branch around the wgmma.
template <int G>
__device__ __forceinline__ void WgmmaKBlock(float (&d)[4 * G], uint4 (&a)[2][2],
                                            const P::Raw& lo, const P::Raw& hi, bool big,
                                            uint32_t tiles) {
  const bool any_big = __any_sync(0xffffffffu, big);
#pragma unroll
  for (int t = 0; t < kW; ++t) {
    WgmmaWait<1>();  // word t - 2's products, the last readers of a[t % 2]
    WgmmaFenceOperands(a[t % 2]);
    a[t % 2][0] = P::Expand(lo, t);
    a[t % 2][1] = P::Expand(hi, t);
    if (any_big) {
      a[t % 2][0] = MulBf16x8(a[t % 2][0], E8M0RestBf16x2(lo.s));
      a[t % 2][1] = MulBf16x8(a[t % 2][1], E8M0RestBf16x2(hi.s));
    }
    const uint4 al = a[t % 2][0], ah = a[t % 2][1];
    const uint32_t tile = tiles + (t / 2) * 8192 + (t % 2) * 64;  // steps 2t, 2t + 1
    WgmmaFenceOperands(d);
    WgmmaFence();
    WgmmaBf16RegA<8 * G>(d, al.x, ah.x, al.y, ah.y, WgmmaDescSw128Addr(tile));
    WgmmaBf16RegA<8 * G>(d, al.z, ah.z, al.w, ah.w, WgmmaDescSw128Addr(tile + 32));
    WgmmaCommit();
  }
}

// The pass's outputs of a warp's tile: kSwiGlu h (bf16, column in the products' stored order) of
// gate acc[g][hh] and up acc[g][2 + hh] for token 2 quad + hh of group g; else y (StoreMmaGroup).
template <bool kSwiGlu, bool kWg, int G>
__device__ __forceinline__ void StoreTile(const float (&acc)[G][4], const MmaTile<P>& mt,
                                          int32_t p0, int n, int quad, int64_t n_out,
                                          float limit, bool scatter_out, const int32_t* order,
                                          void* y) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int g0 = p0 + g * kMmaTokens, ng = min(n - g * kMmaTokens, kMmaTokens);
    if constexpr (kSwiGlu) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int j = 2 * quad + hh;
        if (j < ng && mt.ok_lo) {
          static_cast<__nv_bfloat16*>(y)[static_cast<int64_t>(g0 + j) * n_out +
                                         StoredColumn<kWg>(mt.out_lo)] =
              __float2bfloat16_rn(ClampedSwiGlu(acc[g][hh], acc[g][2 + hh], limit));
        }
      }
    } else {
      StoreMmaGroup<false>(acc[g], g0, ng, quad, mt, n_out, limit, scatter_out, order, y);
    }
  }
}

// One block: tile blockIdx.x * kStreamWarps + warp of expert active[blockIdx.y]. x bf16 rows in
// the products' stored column order (by_token: row order[a] / top_k of assignment a, else row
// a). kSwiGlu: y is h [A, n_out] bf16 in that order too (the down kernel's x); else y fp32 as
// StoreMmaGroup writes.
template <bool kSwiGlu, bool kWg>
__global__ void __launch_bounds__(kStreamThreads, kBlocksPerSm)
    ExpertStreamKernel(const __nv_bfloat16* x, int64_t ldx, bool by_token, bool scatter_out,
                       int64_t top_k, Mxfp4Matrix weight, int64_t n_out, int64_t k_in,
                       float limit, const int32_t* order, const int32_t* offsets,
                       const int32_t* active, const int32_t* num_active, void* y) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // [3][kChunk * kW][kGroups][32] words; kWg: [3][kChunk][2][64 rows][128 bytes] swizzled tiles,
  // 1024-byte aligned.
  uint4* const xs =
      reinterpret_cast<uint4*>(smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023));
  if (static_cast<int32_t>(blockIdx.y) >= *num_active) return;  // uniform across the block
  const int32_t e = active[blockIdx.y];
  const int32_t a0 = offsets[e], a1 = offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane & 3;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kStreamWarps + warp;
  const MmaTile<P> mt = MakeMmaTile<P, kSwiGlu>(weight, e, tile, n_out, k_in);
  // The 4-byte scale words of the lane's rows (k block kb's four group bytes at word kb).
  const uint32_t* const s_lo = reinterpret_cast<const uint32_t*>(mt.lo.s - quad);
  const uint32_t* const s_hi = reinterpret_cast<const uint32_t*>(mt.hi.s - quad);
  const int kblocks = static_cast<int>(k_in / kKBlock);
  const int chunks = (kblocks + kChunk - 1) / kChunk;
  uint4* const ring_w = xs + kXBuffers * kChunkWords + warp * kStages * kSlotWords;
  uint32_t* const ring_s = reinterpret_cast<uint32_t*>(xs + kXBuffers * kChunkWords +
                                                       kStreamWarps * kStages * kSlotWords) +
                           warp * kStages * kSlotWords;
  // Shared addresses of this lane's copies: ring slot 0, and its staged activation word of
  // chunk buffer 0 for its first token (lane = k block kbl * 16 + quarter q * 4 + word t; kWg:
  // tile (kbl, half) = lane / 8, row = token, 16-byte chunk lane % 8 swizzled by row % 8, which
  // is warp % 8 for all of this thread's tokens).
  const uint32_t ring_w_addr = SmemAddr(ring_w + lane), ring_s_addr = SmemAddr(ring_s + lane);
  const uint32_t x_dst =
      kWg ? SmemAddr(xs) + (lane / 8) * 8192 + warp * 128 + (((lane % 8) ^ (warp % 8)) << 4)
          : SmemAddr(xs + (((lane / 16) * kW + lane % 4) * kGroups + warp / kMmaTokens) * 32 +
                     (warp % kMmaTokens) * 4 + (lane % 16) / 4);
  constexpr uint32_t kTokenStride = kWg ? kStreamWarps * 128 : kXTokenStride;

  for (int32_t p0 = a0; p0 < a1; p0 += kGroups * kMmaTokens) {
    const int n = min(a1 - p0, kGroups * kMmaTokens);
    const int groups = (n + kMmaTokens - 1) / kMmaTokens;
    const int padded = groups * kMmaTokens;
    // Chunk c of the pass's activations into buffer c % kXBuffers: warp w copies tokens w + 16 i,
    // lane l the token's 16-byte word l of the chunk (k blocks of 16 words, in k order). xoff[i]:
    // token w + 16 i's row in x plus this lane's column, read once per pass (-1: past n in the
    // last group, zero-filled; -2: past the pass's groups, skipped). Its word lands at x_dst +
    // i * kTokenStride (the token's group advances by kStreamWarps / 8 with i, its place in the
    // group stays).
    int32_t xoff[kChunkWordsPerThread];
#pragma unroll
    for (int i = 0; i < kChunkWordsPerThread; ++i) {
      const int j = warp + i * kStreamWarps;
      xoff[i] = j < n ? (by_token ? order[p0 + j] / static_cast<int32_t>(top_k) : p0 + j) *
                            static_cast<int32_t>(ldx) + lane * 8
                      : (j < padded ? -1 : -2);
    }
    auto issue_x = [&](int c) {
      if (c >= chunks || static_cast<int64_t>(c * kChunk) * kKBlock + lane * 8 >= k_in) return;
      const uint32_t dst = x_dst + (c % kXBuffers) * (kChunkWords * 16);
      const __nv_bfloat16* const src = x + c * kChunk * kKBlock;
#pragma unroll
      for (int i = 0; i < kChunkWordsPerThread; ++i) {
        if (xoff[i] >= -1) {
          CpAsync16(dst + i * kTokenStride, src + (xoff[i] < 0 ? 0 : xoff[i]), xoff[i] >= 0);
        }
      }
    };
    // K block kb of the lane's rows into ring slot kb % kStages (kWg: every warp of a
    // warpgroup multiplies, a tile past n_out on row 0's weights).
    auto issue_w = [&](int kb) {
      if ((kWg || mt.live) && kb < kblocks) {
        const uint32_t w = ring_w_addr + (kb & (kStages - 1)) * (kSlotWords * 16);
        const uint32_t sc = ring_s_addr + (kb & (kStages - 1)) * (kSlotWords * 4);
        CpAsync16Stream(w, mt.lo.w + kb * 4);
        CpAsync16Stream(w + 512, mt.hi.w + kb * 4);
        CpAsync4(sc, s_lo + kb);
        CpAsync4(sc + 128, s_hi + kb);
      }
    };
    // Commit groups: group s < kStages - 1 of the prologue holds k block s (and chunks 0, 1),
    // the group of iteration kb k block kb + kStages - 1 (and at a chunk's first k block the
    // chunk after next). Before iteration kb, wait_group<kStages - 2> means k block kb has
    // landed; at a chunk's first k block (c + 2) C the chunk issued at cC needs
    // wait_group<2 kChunk - 1> (the same where kStages - 1 <= 2 kChunk).
    static_assert(kXBuffers == 3, "chunks are issued two ahead");
    constexpr int kWaitChunk = kStages - 2 < 2 * kChunk - 1 ? kStages - 2 : 2 * kChunk - 1;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      issue_w(s);
      if (s < 2) issue_x(s);
      CpAsyncCommit();
    }

    // The k loop and the epilogue for G groups (G = groups, a compile-time count: the products
    // of absent groups would otherwise be issued predicated off, and their accumulators kept).
    auto run = [&](auto groups_tag) {
      constexpr int G = decltype(groups_tag)::value;
      float acc[G][4];  // kWg: the wgmma accumulators of n8 tile g, the same layout
#pragma unroll
      for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
      float(&d)[4 * G] = reinterpret_cast<float(&)[4 * G]>(acc[0][0]);
      [[maybe_unused]] uint4 a[2][2] = {};  // kWg: the A register sets of the words in flight
      for (int kb = 0; kb < kblocks; ++kb) {
        const int c = kb / kChunk, kbl = kb % kChunk;
        if (kbl == 0) {
          CpAsyncWait<kWaitChunk>();  // this thread's copies of k block kb and of chunk c
          if constexpr (kWg) {
            WgmmaWait<0>();  // this warpgroup's products reading chunk c - 1
            WgmmaFenceOperands(a[0]);
            WgmmaFenceOperands(a[1]);
            WgmmaFenceOperands(d);
            FenceProxyAsyncShared();  // chunk c's copies, for the products' reads
          }
          // Chunk c is everyone's; buffer (c + 2) % 3 was chunk c - 1's, whose readers are done.
          __syncthreads();
          issue_x(c + 2);
        } else {
          CpAsyncWait<kStages - 2>();  // this thread's copies of k block kb
        }
        issue_w(kb + kStages - 1);
        CpAsyncCommit();
        if (!kWg && !mt.live) continue;
        P::Raw lo, hi;
        const bool big = LoadSlot(ring_w, ring_s, kb % kStages, lane, lo, hi);
        const uint4* const xk = xs + (c % kXBuffers) * kChunkWords;
        if constexpr (kWg) {
          WgmmaKBlock<G>(d, a, lo, hi, big, SmemAddr(xk) + kbl * 2 * 8192);
        } else {
          MmaSyncKBlock<G>(acc, lo, hi, big, xk, kbl, lane);
        }
      }
      if constexpr (kWg) {
        WgmmaWait<0>();
        WgmmaFenceOperands(a[0]);
        WgmmaFenceOperands(a[1]);
        WgmmaFenceOperands(d);
      }
      if (mt.live) {
        StoreTile<kSwiGlu, kWg, G>(acc, mt, p0, n, quad, n_out, limit, scatter_out, order, y);
      }
    };
    DispatchGroups<kGroups>(groups, run);
    __syncthreads();  // the last chunks' readers are done before the next pass stages its own
  }
}

// Grid x: 16-row tiles (8 SwiGLU columns), kStreamWarps a block.
template <bool kSwiGlu>
unsigned StreamBlocks(int64_t n_out) {
  constexpr int64_t kPerBlock = (kSwiGlu ? 8 : 16) * kStreamWarps;
  return static_cast<unsigned>((n_out + kPerBlock - 1) / kPerBlock);
}

template <bool kSwiGlu, bool kWg>
absl::Status LaunchStream(unsigned max_active, cudaStream_t stream, const __nv_bfloat16* x,
                          int64_t ldx, bool by_token, bool scatter_out, int64_t top_k,
                          const Mxfp4Matrix& weight, int64_t n_out, int64_t k_in, float limit,
                          const MoeWorkspace& w, void* y) {
  auto kernel = ExpertStreamKernel<kSwiGlu, kWg>;
  constexpr size_t smem = kSmemBytes + 1024;  // + the 1024-byte alignment of the staged tiles
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  kernel<<<dim3(StreamBlocks<kSwiGlu>(n_out), max_active), kStreamThreads, smem, stream>>>(
      x, ldx, by_token, scatter_out, top_k, weight, n_out, k_in, limit, w.order, w.offsets,
      w.active, w.num_active, y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool Aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

}  // namespace

bool MoeStreamFits(const ExpertsShape& d, const Mxfp4Matrix& gate_up, const Mxfp4Matrix& down,
                   int mode) {
  if (mode == 0 || d.tokens <= 0 || d.top_k <= 0) return false;
  const int64_t a = d.tokens * d.top_k;
  const bool fits = d.dim > 0 && d.inter > 0 && d.dim % kKBlock == 0 &&
                    d.inter % kKBlock == 0 && d.experts >= 1 && d.experts <= 65535 &&
                    gate_up.w != nullptr && down.w != nullptr && gate_up.scale != nullptr &&
                    down.scale != nullptr && gate_up.rows == d.experts * 2 * d.inter &&
                    gate_up.cols == d.dim && down.rows == d.experts * d.dim &&
                    down.cols == d.inter && Aligned16(gate_up.w) && Aligned16(down.w) &&
                    Aligned4(gate_up.scale) && Aligned4(down.scale) && a <= (int64_t{1} << 30) &&
                    d.tokens * d.dim < (int64_t{1} << 31) && a * d.inter < (int64_t{1} << 31);
  if (!fits) return false;
  return mode == 2 || a >= kMoeStreamMinAverage * d.experts;
}

absl::Status MoeExpertsStream(const ExpertsShape& d, bool wgmma, const float* u,
                              const float* weights, const Mxfp4Matrix& gate_up,
                              const Mxfp4Matrix& down, const MoeWorkspace& w, float* out,
                              cudaStream_t stream) {
  if (!MoeStreamFits(d, gate_up, down, 2)) {
    return absl::InvalidArgumentError(
        "MoeExpertsStream: needs D % 128 == 0, I % 128 == 0, gate_up [E * 2I, D], down [E * D, "
        "I], 16-byte aligned codes and 4-byte aligned scales (MoeStreamFits)");
  }
  const int64_t a = d.tokens * d.top_k;
  const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(d.experts, a));
  const int64_t words = d.tokens * d.dim / 8;
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(w.xb);
  auto* h = reinterpret_cast<__nv_bfloat16*>(w.h);
  if (wgmma) {
    CastLogicalKernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(
        u, words, reinterpret_cast<uint4*>(w.xb));
    CUDA_RETURN_IF_LAUNCH_ERROR();
    RETURN_IF_ERROR((LaunchStream<true, true>(max_active, stream, xb, d.dim, true, false,
                                              d.top_k, gate_up, d.inter, d.dim, d.swiglu_limit,
                                              w, h)));
    RETURN_IF_ERROR((LaunchStream<false, true>(max_active, stream, h, d.inter, false, true,
                                               d.top_k, down, d.dim, d.inter, 0.0f, w, w.y)));
    return CombineAssignments(d, w.y, nullptr, weights, out, stream);
  }
  RETURN_IF_ERROR(CastToBf16Pair4(u, w.xb, d.tokens * d.dim, stream));  // Pair4Column's order
  RETURN_IF_ERROR((LaunchStream<true, false>(max_active, stream, xb, d.dim, true, false, d.top_k,
                                             gate_up, d.inter, d.dim, d.swiglu_limit, w, h)));
  RETURN_IF_ERROR((LaunchStream<false, false>(max_active, stream, h, d.inter, false, true,
                                              d.top_k, down, d.dim, d.inter, 0.0f, w, w.y)));
  return CombineAssignments(d, w.y, nullptr, weights, out, stream);
}

}  // namespace dsv4::cuda
