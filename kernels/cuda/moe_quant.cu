// The MoE block's experts with MXFP4 or FP8 routed weights (moe_quant.h).
//
// Many tokens (MoeExpertsQuant): the bf16 grouped path of MoeExperts with its kernels templated
// on the weight format (moe_mma.cuh): the sort by expert, ExpertMmaKernel taking an expert's
// assignments 8 at a time and ExpertMmaWideKernel reading an expert's weights once per 32/64 of
// them, each lane expanding its 16-byte words of nibbles or e4m3 bytes into bf16 A fragments in
// registers right before the mma; then the deterministic combine. fp32 mode (`exact`): the FMA
// grouped GEMV with the weights dequantised exactly to fp32 (the CPU reference's values).
//
// One token (MoeDecodeQuant): MoeDecodeBf16's two weight-streaming kernels (moe_decode.cu), gate/up
// + SwiGLU then down + the slot combine, on tensor cores: a warp streams a 16-row tile of one slot
// (routed expert or the shared one) with the same lane-quad loads and in-register expansion,
// against the token's activations staged once in shared memory in the expansion's k pairing (all 8
// mma columns carry the same token, so every lane ends with its rows' sums). K is split over warps
// so that every warp streams about the same bytes (16 KiB of Flash weights): gate/up tiles over 2
// warps (MXFP4), 4 (FP8) or 8 (bf16 shared expert); in the down kernel one warp per routed slot and
// the shared expert over as many as its bytes need.
//
// MXFP4 expansion: the single-token kernels, and ExpertMmaKernel in steps without a wide pass,
// fold the 2^126 that places the e2m1 bits in bf16 into the UE8M0 scale: one bf16 product per
// nibble pair (Mxfp4FoldWeights; a warp with a scale above 2^1 in a k block takes a second for
// it). The wide kernel, and the 8-token kernel of the steps that have a wide pass, keep the two
// products (Mxfp4Weights). Both give the same bf16 values. On the H200 against two products
// everywhere (`bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 200`,
// bench/results/2026-12-02-quantized/runA/moeq_and_flash37_summary.txt): T = 1 moe_mxfp4 44.1 us
// against 48.5, with the FP8 shared expert 44.2 against 46.1; T = 8 267.8 against 279.6; T = 64
// 1143 against 1196; T = 256 and 1024 level (the wide kernel's steps). Not kept, as slower there:
// the shared expert's gate/up blocks ahead of the routed ones (47.3 us with the shared expert),
// and also the routed gate/up tiles over 4 warps instead of 2 (46.5).
#include "kernels/cuda/moe_quant.h"

#include <algorithm>
#include <type_traits>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/moe_stream.h"
#include "kernels/cuda/moe_tiled.h"

namespace dsv4::cuda {
namespace {

// ---- Many tokens ----

// The checkpoint layout of the experts: gate_up [E * 2I, D], down [E * D, I].
template <typename M>
absl::Status CheckExperts(const ExpertsDims& d, const M& gate_up, const M& down) {
  if (gate_up.w == nullptr || gate_up.scale == nullptr || down.w == nullptr ||
      down.scale == nullptr || gate_up.rows != d.experts * 2 * d.inter || gate_up.cols != d.dim ||
      down.rows != d.experts * d.dim || down.cols != d.inter) {
    return absl::InvalidArgumentError(
        "MoeExpertsQuant: quantised experts must be gate_up [E * 2I, D] and down [E * D, I]");
  }
  return absl::OkStatus();
}

// Whether the tensor-core kernels take these experts in the format P: the staged group fits in
// shared memory for both reductions, and the weights (and u) allow 16-byte loads.
template <class P>
bool QuantMmaFits(const ExpertsDims& d, const float* u, const typename P::Matrix& gate_up,
                  const typename P::Matrix& down) {
  return d.dim > 0 && d.inter > 0 && d.dim % 16 == 0 && d.inter % 16 == 0 &&
         MmaStageBytes<P>(d.dim) <= kMmaMaxSmemBytes &&
         MmaStageBytes<P>(d.inter) <= kMmaMaxSmemBytes && Aligned16(u) && Aligned16(gate_up.w) &&
         Aligned16(down.w);
}

// The FMA path (fp32 mode, or shapes the tensor-core kernels do not take): gate_up products,
// SwiGLU, down products, the combine through the inverse permutation, as MoeExperts' fp32 path.
template <class R>
absl::Status RunExpertFma(const ExpertsDims& d, const float* u, const float* weights,
                          const typename R::Matrix& gate_up, const typename R::Matrix& down,
                          const MoeWorkspace& w, float* out, cudaStream_t stream) {
  const int64_t a = d.tokens * d.top_k;
  RETURN_IF_ERROR(InvertOrder(d, w, stream));
  const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(d.experts, a));
  const int64_t n_gu = 2 * d.inter;
  constexpr int kRows = kMoeRowsPerWarp * kWarps;
  const dim3 grid_gu(static_cast<unsigned>((n_gu + kRows - 1) / kRows), max_active);
  const dim3 grid_down(static_cast<unsigned>((d.dim + kRows - 1) / kRows), max_active);
  GroupedGemvKernel<R, kMoeRowsPerWarp>
      <<<grid_gu, kGemmThreads, 0, stream>>>(u, d.dim, true, d.top_k, gate_up, n_gu, d.dim, w.order,
                                             w.offsets, w.active, w.num_active, 0, w.gu);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  RETURN_IF_ERROR(SwiGlu(w.gu, a, d.inter, d.swiglu_limit, w.h, stream));
  GroupedGemvKernel<R, kMoeRowsPerWarp>
      <<<grid_down, kGemmThreads, 0, stream>>>(w.h, d.inter, false, d.top_k, down, d.dim, d.inter,
                                               w.order, w.offsets, w.active, w.num_active, 0, w.y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return CombineAssignments(d, w.y, w.position, weights, out, stream);
}

// The tiled kernels' view of a quantised expert stack.
TiledExpertWeights TiledOf(const Mxfp4Matrix& m) {
  TiledExpertWeights t;
  t.format = QuantFormat::kMxfp4;
  t.fp4 = m;
  return t;
}
TiledExpertWeights TiledOf(const Fp8Matrix& m) {
  TiledExpertWeights t;
  t.format = QuantFormat::kFp8Block;
  t.fp8 = m;
  return t;
}

// One format: the sort, then the tiled GEMMs (prefill-sized steps), the tensor-core kernels
// (bf16 mode, where they fit) or the FMA kernels (R exact: fp32 mode; Rb with bf16 rounding
// otherwise).
template <class P, class R, class Rb>
absl::Status RunQuantExperts(const ExpertsDims& d, const float* u, const int32_t* idx,
                             const float* weights, const typename P::Matrix& gate_up,
                             const typename P::Matrix& down, bool exact, bool mma_ok,
                             const MoeKernels& kernels, void* workspace, float* out,
                             cudaStream_t stream) {
  const MoeWorkspace w = MoeWorkspaceLayout(d, workspace);
  const bool mma = !exact && mma_ok && QuantMmaFits<P>(d, u, gate_up, down);
  const TiledExpertWeights tgu = TiledOf(gate_up), tdn = TiledOf(down);
  const int tiled_rows = mma ? MoeTiledRows(d, tgu, tdn, kernels.tiled) : 0;
  bool use_stream = false;
  if constexpr (std::is_same_v<P, Mxfp4Weights>) {
    use_stream = mma && tiled_rows == 0 && MoeStreamFits(d, gate_up, down, kernels.stream);
  }
  const bool use_wide = mma && tiled_rows == 0 && !use_stream &&
                        UseWide(kernels.wide, d.tokens, d.tokens * d.top_k, d.experts);
  RETURN_IF_ERROR(SortAssignments(d, idx, use_wide, w, stream));
  if (tiled_rows > 0) {
    return MoeExpertsTiled(d, tiled_rows, kernels.Tiled(), kernels.tile_warps,
                           kernels.fp8_activations, u, weights, tgu, tdn, w, out, stream);
  }
  if constexpr (std::is_same_v<P, Mxfp4Weights>) {
    if (use_stream) {
      return MoeExpertsStream(d, kernels.stream_wgmma, u, weights, gate_up, down, w, out, stream);
    }
    // Steps without a wide pass: ExpertMmaKernel with the folded expansion (Mxfp4FoldWeights,
    // which the wide kernel does not have; steps with one keep Mxfp4Weights in both kernels).
    if (mma && !use_wide) {
      return RunExpertMma<Mxfp4FoldWeights>(d, u, weights, gate_up, down, false, w, out, stream);
    }
  }
  if (mma) return RunExpertMma<P>(d, u, weights, gate_up, down, use_wide, w, out, stream);
  if (exact) return RunExpertFma<R>(d, u, weights, gate_up, down, w, out, stream);
  return RunExpertFma<Rb>(d, u, weights, gate_up, down, w, out, stream);
}

// ---- One token ----

constexpr int kDecodeWarps = 8;  // the gate/up kernel's block
constexpr int kDecodeThreads = kDecodeWarps * 32;
// k blocks of weights per batch in both kernels, two batches in flight (double-buffered: a
// warp requests its next batch before it expands and multiplies the current one): one k block
// of the quantised formats (their expansion keeps more registers live; two spilled at the two
// blocks per SM the down kernel keeps), two of bf16.
template <class P>
constexpr int kDecodeUnroll = P::kWords > 1 ? 1 : 2;
// The down kernel: one warp per routed slot (at most 7: MoeDecodeQuantFits) and up to 4 for the
// shared expert; two blocks per SM.
constexpr int kDownMaxWarps = 11;
constexpr int kDownRows = 16;  // output rows per block (one mma tile)

// Bytes of two weights in a format: the K split that gives every warp the same bytes.
template <class P>
constexpr int kBytesPer2 = 0;
template <>
constexpr int kBytesPer2<Bf16Weights> = 4;
template <>
constexpr int kBytesPer2<Fp8Weights> = 2;
template <>
constexpr int kBytesPer2<Mxfp4FoldWeights> = 1;
// Warps per gate/up tile (16 rows of D): 16 k blocks each at D = 4096.
template <class P>
constexpr int kGateUpSplit = 2 * kBytesPer2<P>;

// Staged activation words (16 bytes) of a reduction of length k in the format P, one token.
template <class P>
__host__ __device__ constexpr int DecodeWords(int64_t k) {
  return P::Blocks(k) * P::kWords * 4;
}

// The products of one batch of k blocks [kb, end) (min(kDecodeUnroll<P>, end - kb) of them):
// each loaded word expanded to kWords bf16 words, two mma steps each. xs(kb, t) is the lane's
// activation word of virtual k block kb * kWords + t.
template <class P, class Xs>
__device__ __forceinline__ void DecodeBatch(const typename P::Raw (&lo)[kDecodeUnroll<P>],
                                            const typename P::Raw (&hi)[kDecodeUnroll<P>], int kb,
                                            int end, Xs xs, float (&acc)[4]) {
#pragma unroll
  for (int u = 0; u < kDecodeUnroll<P>; ++u) {
    if (kb + u < end) {
      if constexpr (kFoldOf<P>) {
        // The warp's lanes are converged here (the tile and its bounds are uniform per warp).
        if (__any_sync(0xffffffffu, P::Big(lo[u]) || P::Big(hi[u]))) {
#pragma unroll
          for (int t = 0; t < P::kWords; ++t) {
            MmaWord(acc, P::ExpandBig(lo[u], t), P::ExpandBig(hi[u], t), xs(kb + u, t));
          }
          continue;
        }
      }
#pragma unroll
      for (int t = 0; t < P::kWords; ++t) {
        MmaWord(acc, P::Expand(lo[u], t), P::Expand(hi[u], t), xs(kb + u, t));
      }
    }
  }
}

// A warp's 16-row tile over k blocks [kb0, kb1) against one token; the batch at kb0 is in
// lo/hi on entry. Two batches alternate: the one after next is requested as soon as a batch is
// used, so the weight stream never waits for the expansion.
template <class P, class Xs>
__device__ __forceinline__ void DecodeTile(const MmaTile<P>& mt, int kb0, int kb1,
                                           typename P::Raw (&lo)[kDecodeUnroll<P>],
                                           typename P::Raw (&hi)[kDecodeUnroll<P>], Xs xs,
                                           float (&acc)[4]) {
  constexpr int kU = kDecodeUnroll<P>;
  typename P::Raw lo2[kU], hi2[kU];
  for (int kb = kb0; kb < kb1; kb += 2 * kU) {
    if (kb + kU < kb1) LoadWeightBatch<P>(lo2, hi2, mt, kb + kU, kb1);
    DecodeBatch<P>(lo, hi, kb, kb1, xs, acc);
    if (kb + kU >= kb1) break;
    if (kb + 2 * kU < kb1) LoadWeightBatch<P>(lo, hi, mt, kb + 2 * kU, kb1);
    DecodeBatch<P>(lo2, hi2, kb + kU, kb1, xs, acc);
  }
}

// The gate/up tiles of one format in one block: tile = column tile c (gate rows 8c.., up rows
// I + 8c..) of a slot, kS warps over K each; h[slot, col] = the clamped SwiGLU (0 for a slot
// without an expert). `shared`: the shared expert's tiles (slot top_k), whose rows are plain
// weights, requested before the PDL wait; the routed ones follow the expert ids, after it.
template <class P, int kS>
__device__ __forceinline__ void GateUpBlock(const MoeDecodeArgs& a, const typename P::Matrix& m,
                                            bool shared, int64_t block, uint4* sx) {
  constexpr int kTilesPerBlock = kDecodeWarps / kS;
  __shared__ float2 red[kDecodeWarps][8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane & 3, grp = lane >> 2;
  const int slice = warp % kS;
  const int64_t col_tiles = (a.inter + 7) / 8;
  const int64_t tile = block * kTilesPerBlock + warp / kS;
  const bool live = tile < (shared ? col_tiles : a.top_k * col_tiles);  // uniform per warp
  const int64_t slot = shared ? a.top_k : tile / col_tiles;
  const int64_t ct = tile % col_tiles;
  const int kblocks = P::Blocks(a.dim);
  const int kb0 = slice * kblocks / kS, kb1 = (slice + 1) * kblocks / kS;
  typename P::Raw lo[kDecodeUnroll<P>], hi[kDecodeUnroll<P>];
  MmaTile<P> mt;
  bool valid = false;
  if (shared && live) {
    mt = MakeMmaTile<P, true>(m, 0, ct, a.inter, a.dim);
    valid = true;
    LoadWeightBatch<P>(lo, hi, mt, kb0, kb1);
  }
  PdlWait();
  if (!shared && live) {
    const int32_t e = a.idx[slot];
    valid = e >= 0 && e < a.experts;
    if (valid) {
      mt = MakeMmaTile<P, true>(m, e, ct, a.inter, a.dim);
      LoadWeightBatch<P>(lo, hi, mt, kb0, kb1);
    }
  }
  // u as bf16 words in P's pairing, [virtual k block][quad lane].
  const int words = DecodeWords<P>(a.dim);
  for (int i = threadIdx.x; i < words; i += kDecodeThreads) {
    sx[i] = P::StageX(a.u, i >> 2, i & 3, a.dim);
  }
  __syncthreads();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (valid) {
    DecodeTile<P>(
        mt, kb0, kb1, lo, hi, [&](int kb, int t) { return sx[(kb * P::kWords + t) * 4 + quad]; },
        acc);
  }
  // Every column holds the token: c0 = gate row grp, c2 = up row grp (of column 8 ct + grp).
  if (quad == 0) red[warp][grp] = make_float2(acc[0], acc[2]);
  __syncthreads();
  if (!live || slice != 0 || quad != 0) return;
  const int64_t col = ct * 8 + grp;
  if (col >= a.inter) return;
  float gate = red[warp][grp].x, up = red[warp][grp].y;
#pragma unroll
  for (int s = 1; s < kS; ++s) {  // the K slices in order
    gate += red[warp + s][grp].x;
    up += red[warp + s][grp].y;
  }
  a.h[slot * a.inter + col] = valid ? ClampedSwiGlu(gate, up, a.swiglu_limit) : 0.0f;
}

// Blocks [0, routed_blocks): the routed slots' tiles (format RP); the rest: the shared expert's
// (format SP; none when there is no shared expert or its SwiGLU came ahead in a.shared_h).
template <class RP, class SP>
__global__ void __launch_bounds__(kDecodeThreads, 3)
    DecodeGateUpKernel(const MoeDecodeArgs a, const typename RP::Matrix routed,
                       const typename SP::Matrix shared, unsigned routed_blocks) {
  PdlTrigger();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint4* sx = reinterpret_cast<uint4*>(smem_raw);
  if (blockIdx.x < routed_blocks) {
    GateUpBlock<RP, kGateUpSplit<RP>>(a, routed, false, blockIdx.x, sx);
  } else {
    GateUpBlock<SP, kGateUpSplit<SP>>(a, shared, true, blockIdx.x - routed_blocks, sx);
  }
}

// One warp of the down kernel: rows 16 b .. of the slot's down weight over k blocks [kb0, kb1)
// of I, against the slot's SwiGLU output staged (by this warp, into its own words) in P's
// pairing. The shared expert's rows are requested before the PDL wait, the routed ones after.
template <class P>
__device__ __forceinline__ void DownWarp(const MoeDecodeArgs& a, const typename P::Matrix& m,
                                         bool shared, int64_t slot, int slice, int slices,
                                         uint4* sxw, float (&acc)[4]) {
  const int lane = threadIdx.x & 31, quad = lane & 3;
  const int kblocks = P::Blocks(a.inter);
  const int kb0 = slice * kblocks / slices, kb1 = (slice + 1) * kblocks / slices;
  typename P::Raw lo[kDecodeUnroll<P>], hi[kDecodeUnroll<P>];
  MmaTile<P> mt;
  bool valid = shared;
  if (shared) {
    mt = MakeMmaTile<P, false>(m, 0, blockIdx.x, a.dim, a.inter);
    LoadWeightBatch<P>(lo, hi, mt, kb0, kb1);
  }
  PdlWait();
  if (!shared) {
    const int32_t e = a.idx[slot];
    valid = e >= 0 && e < a.experts;
    if (valid) {
      mt = MakeMmaTile<P, false>(m, e, blockIdx.x, a.dim, a.inter);
      LoadWeightBatch<P>(lo, hi, mt, kb0, kb1);
    }
  }
  if (!valid) return;
  const float* h = shared && a.shared_h != nullptr ? a.shared_h : a.h + slot * a.inter;
  const int words = (kb1 - kb0) * P::kWords * 4;
  for (int i = lane; i < words; i += 32) {
    sxw[i] = P::StageX(h, kb0 * P::kWords + (i >> 2), i & 3, a.inter);
  }
  __syncwarp();
  DecodeTile<P>(
      mt, kb0, kb1, lo, hi,
      [&](int kb, int t) { return sxw[((kb - kb0) * P::kWords + t) * 4 + quad]; }, acc);
}

// Block b: output rows 16 b .. 16 b + 15. Warp s < top_k: routed slot s (format RP, all of I);
// warps top_k .. top_k + shared_warps - 1: the shared expert (format SP) over as many K slices.
// The block combines in slot order through shared memory, as MoeDecodeBf16's down kernel:
// out[d] = Σ_{s < top_k} weights[s] · sum_s (slots with an expert) + Σ_slices shared.
template <class RP, class SP>
__global__ void __launch_bounds__(kDownMaxWarps * 32, 2)
    DecodeDownKernel(const MoeDecodeArgs a, const typename RP::Matrix routed,
                     const typename SP::Matrix shared, int shared_warps, int warp_words) {
  PdlTrigger();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float red[kDownMaxWarps][kDownRows];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane & 3, grp = lane >> 2;
  uint4* sxw = reinterpret_cast<uint4*>(smem_raw) + warp * warp_words;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (warp >= a.top_k) {
    DownWarp<SP>(a, shared, true, a.top_k, warp - static_cast<int>(a.top_k), shared_warps, sxw,
                 acc);
  } else {
    DownWarp<RP>(a, routed, false, warp, 0, 1, sxw, acc);
  }
  // Every column holds the token: c0 = row grp, c2 = row grp + 8 of the tile.
  if (quad == 0) {
    red[warp][grp] = acc[0];
    red[warp][grp + 8] = acc[2];
  }
  __syncthreads();
  const int64_t d = int64_t{blockIdx.x} * kDownRows + threadIdx.x;
  if (threadIdx.x >= kDownRows || d >= a.dim) return;
  float sum = 0.0f, shared_sum = 0.0f;
  for (int s = 0; s < a.top_k; ++s) {
    const int32_t e = a.idx[s];
    if (e >= 0 && e < a.experts) sum += a.weights[s] * red[s][threadIdx.x];
  }
  for (int j = 0; j < shared_warps; ++j) shared_sum += red[a.top_k + j][threadIdx.x];
  a.out[d] = sum + shared_sum;
}

template <class RP>
const typename RP::Matrix& Routed(const QuantExperts& w, bool gate_up);
template <>
const Mxfp4Matrix& Routed<Mxfp4FoldWeights>(const QuantExperts& w, bool gate_up) {
  return gate_up ? w.fp4_gate_up : w.fp4_down;
}
template <>
const Fp8Matrix& Routed<Fp8Weights>(const QuantExperts& w, bool gate_up) {
  return gate_up ? w.fp8_gate_up : w.fp8_down;
}

// Whether a routed format's experts have the checkpoint layout and allow the decode kernels.
template <class RP>
bool DecodeRoutedFits(const MoeDecodeArgs& a, const QuantExperts& w);
template <>
bool DecodeRoutedFits<Mxfp4FoldWeights>(const MoeDecodeArgs& a, const QuantExperts& w) {
  const Mxfp4Matrix &gu = w.fp4_gate_up, &dn = w.fp4_down;
  return gu.w != nullptr && gu.scale != nullptr && dn.w != nullptr && dn.scale != nullptr &&
         gu.rows == a.experts * 2 * a.inter && gu.cols == a.dim && dn.rows == a.experts * a.dim &&
         dn.cols == a.inter && a.dim % 32 == 0 && a.inter % 32 == 0 && Aligned16(gu.w) &&
         Aligned16(dn.w);
}
template <>
bool DecodeRoutedFits<Fp8Weights>(const MoeDecodeArgs& a, const QuantExperts& w) {
  const Fp8Matrix &gu = w.fp8_gate_up, &dn = w.fp8_down;
  return gu.w != nullptr && gu.scale != nullptr && dn.w != nullptr && dn.scale != nullptr &&
         gu.rows == a.experts * 2 * a.inter && gu.cols == a.dim && dn.rows == a.experts * a.dim &&
         dn.cols == a.inter && Fp8MmaFits(gu) && Fp8MmaFits(dn) && Aligned16(gu.w) &&
         Aligned16(dn.w);
}

// Largest dynamic shared memory the decode kernels ask for (the H200 allows 227 KiB a block).
constexpr size_t kDecodeMaxSmemBytes = 200 * 1024;

template <class RP, class SP>
absl::Status LaunchDecode(const MoeDecodeArgs& a, const QuantExperts& w,
                          const typename SP::Matrix& shared_gu,
                          const typename SP::Matrix& shared_dn, bool has_shared,
                          cudaStream_t stream) {
  // Gate/up: the routed slots' tiles, then the shared expert's unless its SwiGLU came ahead.
  const int64_t col_tiles = (a.inter + 7) / 8;
  constexpr int64_t kRoutedTiles = kDecodeWarps / kGateUpSplit<RP>;
  constexpr int64_t kSharedTiles = kDecodeWarps / kGateUpSplit<SP>;
  const unsigned routed_blocks =
      static_cast<unsigned>((a.top_k * col_tiles + kRoutedTiles - 1) / kRoutedTiles);
  const unsigned shared_blocks =
      has_shared && a.shared_h == nullptr
          ? static_cast<unsigned>((col_tiles + kSharedTiles - 1) / kSharedTiles)
          : 0;
  const size_t gu_smem =
      sizeof(uint4) * static_cast<size_t>(std::max(DecodeWords<RP>(a.dim), DecodeWords<SP>(a.dim)));
  // Down: one warp per routed slot and the shared expert's warps (its bytes over the routed
  // expert's: 4 for bf16 over MXFP4), each with its own staged words.
  const int shared_warps = has_shared ? std::max(1, kBytesPer2<SP> / kBytesPer2<RP>) : 0;
  const int warps = static_cast<int>(a.top_k) + shared_warps;
  const int warp_words = std::max(DecodeWords<RP>(a.inter), DecodeWords<SP>(a.inter));
  const size_t dn_smem = sizeof(uint4) * static_cast<size_t>(warp_words) * warps;
  if (warps > kDownMaxWarps || gu_smem > kDecodeMaxSmemBytes || dn_smem > kDecodeMaxSmemBytes) {
    return absl::InvalidArgumentError("MoeDecodeQuant: too many slots or too wide for the kernels");
  }
  auto gate_up = DecodeGateUpKernel<RP, SP>;
  auto down = DecodeDownKernel<RP, SP>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(gu_smem)));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(down, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(dn_smem)));
  CUDA_RETURN_IF_ERROR(LaunchPdl(gate_up, dim3(routed_blocks + shared_blocks), dim3(kDecodeThreads),
                                 gu_smem, stream, a, Routed<RP>(w, true), shared_gu,
                                 routed_blocks));
  CUDA_RETURN_IF_ERROR(LaunchPdl(
      down, dim3(static_cast<unsigned>((a.dim + kDownRows - 1) / kDownRows)), dim3(warps * 32),
      dn_smem, stream, a, Routed<RP>(w, false), shared_dn, shared_warps, warp_words));
  return absl::OkStatus();
}

// RP: the routed experts' policy; the shared expert in FP8 (sgu, sdn) or bf16 (a.shared_*).
template <class RP>
absl::Status DecodeFor(const MoeDecodeArgs& a, const QuantExperts& w, const Fp8Matrix* sgu,
                       const Fp8Matrix* sdn, cudaStream_t stream) {
  if (sgu != nullptr) return LaunchDecode<RP, Fp8Weights>(a, w, *sgu, *sdn, true, stream);
  return LaunchDecode<RP, Bf16Weights>(a, w, static_cast<const __nv_bfloat16*>(a.shared_gate_up),
                                       static_cast<const __nv_bfloat16*>(a.shared_down),
                                       a.shared_gate_up != nullptr, stream);
}

}  // namespace

absl::Status MoeExpertsQuant(const ExpertsDims& d, const float* u, const int32_t* idx,
                             const float* weights, const QuantExperts& w, bool exact,
                             void* workspace, float* out, cudaStream_t stream,
                             const MoeKernels& kernels) {
  if (d.tokens == 0) return absl::OkStatus();
  if (w.format == QuantFormat::kMxfp4) {
    RETURN_IF_ERROR(CheckExperts(d, w.fp4_gate_up, w.fp4_down));
    if (d.dim % 32 != 0 || d.inter % 32 != 0 || !Aligned16(w.fp4_gate_up.w) ||
        !Aligned16(w.fp4_down.w)) {
      return absl::InvalidArgumentError(
          "MoeExpertsQuant: MXFP4 experts need D and I multiples of 32 and 16-byte aligned codes");
    }
    return RunQuantExperts<Mxfp4Weights, Mxfp4Rows<false>, Mxfp4Rows<true>>(
        d, u, idx, weights, w.fp4_gate_up, w.fp4_down, exact, kernels.tensor_cores, kernels,
        workspace, out, stream);
  }
  if (w.format == QuantFormat::kFp8Block) {
    RETURN_IF_ERROR(CheckExperts(d, w.fp8_gate_up, w.fp8_down));
    // The FMA kernels read 16 e4m3 bytes a lane, all within one scale block.
    if (d.dim % 16 != 0 || d.inter % 16 != 0 || w.fp8_gate_up.block_cols % 16 != 0 ||
        w.fp8_down.block_cols % 16 != 0 || w.fp8_gate_up.block_rows <= 0 ||
        w.fp8_down.block_rows <= 0 || !Aligned16(w.fp8_gate_up.w) || !Aligned16(w.fp8_down.w)) {
      return absl::UnimplementedError(
          "MoeExpertsQuant: FP8 experts need D, I and the scale block width multiples of 16 and "
          "16-byte aligned bytes");
    }
    const bool mma_ok =
        kernels.tensor_cores && Fp8MmaFits(w.fp8_gate_up) && Fp8MmaFits(w.fp8_down);
    return RunQuantExperts<Fp8Weights, Fp8Rows<false>, Fp8Rows<true>>(
        d, u, idx, weights, w.fp8_gate_up, w.fp8_down, exact, mma_ok, kernels, workspace, out,
        stream);
  }
  return absl::InvalidArgumentError("MoeExpertsQuant: the experts are not MXFP4 or FP8");
}

bool MoeDecodeQuantFits(const MoeDecodeArgs& a, const QuantExperts& w) {
  // One slot is kept for a shared expert in FP8, which this call does not see (a.shared_gate_up
  // is only the bf16 one).
  const bool shared_bf16 = a.shared_gate_up != nullptr;
  const bool routed = w.format == QuantFormat::kMxfp4 ? DecodeRoutedFits<Mxfp4FoldWeights>(a, w)
                      : w.format == QuantFormat::kFp8Block ? DecodeRoutedFits<Fp8Weights>(a, w)
                                                           : false;
  return routed && a.dim > 0 && a.inter > 0 && a.experts >= 1 && a.top_k >= 1 &&
         a.top_k + 1 <= kMoeDecodeMaxSlots && Aligned16(a.u) && Aligned16(a.h) &&
         Aligned16(a.shared_h) && (a.shared_gate_up == nullptr) == (a.shared_down == nullptr) &&
         (!shared_bf16 || (a.dim % kMmaKBlock == 0 && a.inter % kMmaKBlock == 0 &&
                           Aligned16(a.shared_gate_up) && Aligned16(a.shared_down)));
}

absl::Status MoeDecodeQuant(const MoeDecodeArgs& a, const QuantExperts& w,
                            const Fp8Matrix* shared_gate_up_fp8, const Fp8Matrix* shared_down_fp8,
                            cudaStream_t stream) {
  if (!MoeDecodeQuantFits(a, w)) {
    return absl::InvalidArgumentError(
        "MoeDecodeQuant: needs MXFP4/FP8 experts [E * 2I, D] and [E * D, I] the kernels take, "
        "at most 7 routed slots and 16-byte aligned operands (MoeDecodeQuantFits)");
  }
  const bool fp8_shared = shared_gate_up_fp8 != nullptr || shared_down_fp8 != nullptr;
  if (fp8_shared) {
    const Fp8Matrix* gu = shared_gate_up_fp8;
    const Fp8Matrix* dn = shared_down_fp8;
    if (gu == nullptr || dn == nullptr || a.shared_gate_up != nullptr || gu->w == nullptr ||
        gu->scale == nullptr || dn->w == nullptr || dn->scale == nullptr ||
        gu->rows != 2 * a.inter || gu->cols != a.dim || dn->rows != a.dim || dn->cols != a.inter ||
        !Fp8MmaFits(*gu) || !Fp8MmaFits(*dn) || !Aligned16(gu->w) || !Aligned16(dn->w)) {
      return absl::InvalidArgumentError(
          "MoeDecodeQuant: an FP8 shared expert needs both matrices, [2I, D] and [D, I], with "
          "scale blocks a power-of-two multiple of 64 columns wide");
    }
  }
  if (w.format == QuantFormat::kMxfp4) {
    return DecodeFor<Mxfp4FoldWeights>(a, w, shared_gate_up_fp8, shared_down_fp8, stream);
  }
  return DecodeFor<Fp8Weights>(a, w, shared_gate_up_fp8, shared_down_fp8, stream);
}

}  // namespace dsv4::cuda
