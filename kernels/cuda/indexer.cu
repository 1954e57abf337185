#include "kernels/cuda/indexer.h"

#include <algorithm>

#include <cstdint>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kSelectThreads = 1024;

// Padding rows of a graph step (state slot -1) see no entries.
__device__ __forceinline__ int64_t Visible(const RaggedBatchView& b, int32_t t, int64_t ratio) {
  if (b.state_slot[b.token_seq[t]] < 0) return 0;
  return (static_cast<int64_t>(b.positions[t]) + 1) / ratio;
}

__global__ void SelectAllKernel(IndexerDims s, RaggedBatchView b, int32_t* out) {
  PdlTrigger();
  PdlWait();
  const int32_t t = blockIdx.x;
  const int64_t v = Visible(b, t, s.ratio);
  for (int64_t k = threadIdx.x; k < s.topk; k += blockDim.x) {
    out[t * s.topk + k] = k < v ? static_cast<int32_t>(k) : -1;
  }
}

// Scores: a block covers kScoreEntries (32) consecutive entries, staged in shared memory by the
// whole block; warp g of the block computes the head group [g*kHpt, (g+1)*kHpt) for all 32
// entries (lane = entry), so that small candidate counts still spread over many SMs. Per head,
// the dot product is accumulated exactly as before (4-wide partial sums in ascending d, then
// added), ReLU·score_scale is staged in shared memory and one warp sums the heads in ascending
// order: bitwise the same scores as the one-thread-per-entry kernel.
constexpr int kScoreEntries = 32;
constexpr int64_t kMaxScoreBlocks = 16384;

template <int kHeads>
struct ScoreCfg {
  // Heads per thread: 4 (16 warps a block for 64 heads) keeps the serial dot-product work per
  // thread short; the block count is small at decode (one per 32 candidates).
  static constexpr int kHpt = kHeads < 4 ? kHeads : 4;
  static constexpr int kGroups = kHeads / kHpt;
  static constexpr int kThreads = 32 * kGroups;
};

template <int kHeads>
__global__ void __launch_bounds__(ScoreCfg<kHeads>::kThreads)
    ScoreKernel(IndexerDims s, RaggedBatchView b, const float* q, const float* w,
                const float* keys, int64_t max_visible, float* scores) {
  PdlTrigger();
  PdlWait();
  using Cfg = ScoreCfg<kHeads>;
  constexpr int kHpt = Cfg::kHpt;
  extern __shared__ float4 sq4[];  // [kHeads, dim/4], then the chunk's keys [32, dim/4 + 1]
  __shared__ float sw[kHeads];
  __shared__ float spart[kHeads][kScoreEntries];
  const int32_t t = blockIdx.y;
  const int64_t v = Visible(b, t, s.ratio);
  if (static_cast<int64_t>(blockIdx.x) * kScoreEntries >= v) return;  // uniform over the block
  if (v <= s.topk && !b.force_indexer_scoring) return;  // the select takes all: no scores read
  const int dim4 = static_cast<int>(s.dim >> 2);
  const int n4 = kHeads * dim4;
  const float* qt = q + static_cast<int64_t>(t) * kHeads * s.dim;
  if ((reinterpret_cast<uintptr_t>(qt) & 15u) == 0) {
    const float4* q4 = reinterpret_cast<const float4*>(qt);
    for (int base = 0; base < n4; base += 8 * Cfg::kThreads) {
      float4 r[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * Cfg::kThreads + threadIdx.x;
        if (i < n4) r[u] = q4[i];
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * Cfg::kThreads + threadIdx.x;
        if (i < n4) sq4[i] = r[u];
      }
    }
  } else {
    float* sq = reinterpret_cast<float*>(sq4);
    for (int i = threadIdx.x; i < 4 * n4; i += Cfg::kThreads) sq[i] = qt[i];
  }
  if (threadIdx.x < kHeads) sw[threadIdx.x] = w[t * kHeads + threadIdx.x] * s.weight_scale;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int group = threadIdx.x >> 5;
  // Grid-stride over chunks of 32 entries: the grid is capped (a graph's grid is sized by the
  // capacity bound, which can be far above the live context); e0 < v is uniform over the block.
  for (int64_t e0 = static_cast<int64_t>(blockIdx.x) * kScoreEntries; e0 < v;
       e0 += static_cast<int64_t>(gridDim.x) * kScoreEntries) {
  const int64_t e = e0 + lane;
  // The chunk's keys staged in shared memory by the whole block (one round trip instead of a
  // serial chain of loads per lane); rows padded by one float4 so the lanes' reads of one column
  // fall in different banks.
  float4* sk = sq4 + n4;
  const int ld = dim4 + 1;
  __syncthreads();  // the previous chunk's reads of sk are done
  for (int f = threadIdx.x; f < kScoreEntries * dim4; f += Cfg::kThreads) {
    const int j = f / dim4, c = f % dim4;
    if (e0 + j < v) {
      const float4* row = reinterpret_cast<const float4*>(
          keys + EntryRow(b, b.token_seq[t], e0 + j, s.ratio) * s.dim);
      sk[j * ld + c] = row[c];
    }
  }
  __syncthreads();
  if (e < v) {
    const float4* k4 = sk + lane * ld;
    const float4* qg = sq4 + group * kHpt * dim4;
    float dot[kHpt];
#pragma unroll
    for (int h = 0; h < kHpt; ++h) dot[h] = 0.0f;
    int d = 0;
    for (; d + 4 <= dim4; d += 4) {
      float4 kv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = k4[d + j];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int h = 0; h < kHpt; ++h) {
          const float4 qh = qg[h * dim4 + d + j];
          dot[h] += qh.x * kv[j].x + qh.y * kv[j].y + qh.z * kv[j].z + qh.w * kv[j].w;
        }
      }
    }
    for (; d < dim4; ++d) {
      const float4 kv = k4[d];
#pragma unroll
      for (int h = 0; h < kHpt; ++h) {
        const float4 qh = qg[h * dim4 + d];
        dot[h] += qh.x * kv.x + qh.y * kv.y + qh.z * kv.z + qh.w * kv.w;
      }
    }
#pragma unroll
    for (int h = 0; h < kHpt; ++h) spart[group * kHpt + h][lane] = fmaxf(dot[h], 0.0f) * s.score_scale;
  }
  __syncthreads();
  if (group == 0 && e < v) {
    float score = 0;
#pragma unroll
    for (int h = 0; h < kHeads; ++h) score += sw[h] * spart[h][lane];
    scores[t * max_visible + e] = score;
  }
  __syncthreads();  // spart is rewritten by the next chunk
  }
}

// Scores on TF32 tensor cores (IndexerTopK with `tf32`, the bf16 precision mode's): a block
// takes kTok consecutive tokens and chunks of kMmaEntries entries (grid-stride over the chunks,
// like ScoreKernel). Warp (tok, g) holds heads [16 g, 16 g + 16) of its token's q as mma A
// fragments in registers for the whole of K = 128 (rounded to TF32 once) and multiplies them with
// the chunk's keys, staged in shared memory by cp.async two chunks deep (rows padded to 132
// floats: the fragment reads are conflict-free; the tensor cores read the keys' top 19 bits).
// The kTok tokens of one sequence share every staged chunk (the keys' trips from L2 bound the
// one-token form); a group spanning sequences takes one pass per sequence. Each product (head,
// entry) goes through ReLU and is weighted by w[t, h] · weight_scale · score_scale; the warp sums
// its 16 heads with shuffles, then its token's head groups are added in order through shared
// memory: a token's scores do not depend on kTok or on the other tokens of its group.
constexpr int kMmaEntries = 64;
constexpr int kMmaDim = 128;
constexpr int kMmaPitch = kMmaDim + 4;
constexpr int kMmaNt = kMmaEntries / 8;  // n8 tiles a chunk
constexpr int kMmaKs = kMmaDim / 8;      // k8 steps
constexpr int kMmaGroupTokens = 4;       // tokens a block of prefill-sized steps
constexpr int64_t kMmaGroupMinTokens = 512;

__device__ __forceinline__ uint32_t Tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// kHg head groups of 16 (heads = 16 kHg), kTok tokens: 32 kHg kTok threads.
template <int kHg, int kTok>
__global__ void __launch_bounds__(32 * kHg * kTok)
    ScoreMmaKernel(IndexerDims s, RaggedBatchView b, const float* q, const float* w,
                   const float* keys, int64_t max_visible, float* scores) {
  PdlTrigger();
  PdlWait();
  constexpr int kThreads = 32 * kHg * kTok;
  extern __shared__ float4 smem4[];
  float* const sk = reinterpret_cast<float*>(smem4);  // [2][kMmaEntries][kMmaPitch]
  __shared__ float red[kTok][kHg][kMmaEntries];
  __shared__ int32_t s_seq[kTok];
  __shared__ int64_t s_v[kTok];  // visible entries, 0 when the token needs no scores
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tok = warp / kHg, g = warp % kHg;
  const int r = lane >> 2, c = lane & 3;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  if (threadIdx.x < kTok) {
    const int64_t t = t0 + threadIdx.x;
    int64_t v = 0;
    int32_t seq = -1;
    if (t < b.num_tokens) {
      seq = b.token_seq[t];
      v = Visible(b, static_cast<int32_t>(t), s.ratio);
      if (v <= s.topk && !b.force_indexer_scoring) v = 0;  // the select takes all
    }
    s_seq[threadIdx.x] = seq;
    s_v[threadIdx.x] = v;
  }
  __syncthreads();
  const int64_t t = t0 + tok;
  const int64_t my_v = s_v[tok];
  const int32_t my_seq = s_seq[tok];
  // The warp's q fragments (heads 16 g + r, + 8; k = 8 ks + c, + 4) and head weights.
  uint32_t a[kMmaKs][4];
  float wa = 0.0f, wb = 0.0f;
  if (my_v > 0) {
    const float* qh = q + (t * s.heads + 16 * g + r) * kMmaDim;
#pragma unroll
    for (int ks = 0; ks < kMmaKs; ++ks) {
      a[ks][0] = Tf32(qh[8 * ks + c]);
      a[ks][1] = Tf32(qh[8 * kMmaDim + 8 * ks + c]);
      a[ks][2] = Tf32(qh[8 * ks + c + 4]);
      a[ks][3] = Tf32(qh[8 * kMmaDim + 8 * ks + c + 4]);
    }
    const float hs = s.weight_scale * s.score_scale;
    wa = w[t * s.heads + 16 * g + r] * hs;
    wb = w[t * s.heads + 16 * g + r + 8] * hs;
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * kMmaEntries;
  // One pass per distinct sequence among the group's scored tokens (one in a prefill).
  for (int lead = 0; lead < kTok; ++lead) {
    const int32_t seq = s_seq[lead];
    bool first = s_v[lead] > 0;
    int64_t v = 0;  // the pass's bound: the most entries any of its tokens sees
    for (int u = 0; u < kTok; ++u) {
      if (s_v[u] > 0 && s_seq[u] == seq) {
        if (u < lead) first = false;
        v = max(v, s_v[u]);
      }
    }
    if (!first) continue;  // no scored token, or a pass already covered this sequence
    const bool active = my_v > 0 && my_seq == seq;
    auto stage = [&](int64_t e0, int buf) {
      float* dst = sk + buf * kMmaEntries * kMmaPitch;
      for (int f = threadIdx.x; f < kMmaEntries * kMmaDim / 4; f += kThreads) {
        const int j = f / (kMmaDim / 4), cc = f % (kMmaDim / 4);
        const bool ok = e0 + j < v;
        const float* row = ok ? keys + EntryRow(b, seq, e0 + j, s.ratio) * kMmaDim : keys;
        CpAsync16(dst + j * kMmaPitch + 4 * cc, row + 4 * cc, ok);
      }
      CpAsyncCommit();
    };
    int64_t e0 = static_cast<int64_t>(blockIdx.x) * kMmaEntries;
    if (e0 >= v) continue;  // uniform over the block
    __syncthreads();  // the previous pass is done with both buffers and red
    stage(e0, 0);
    for (int buf = 0; e0 < v; e0 += step, buf ^= 1) {
      if (e0 + step < v) {
        stage(e0 + step, buf ^ 1);
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      __syncthreads();  // the chunk's keys are in; red is free (the previous chunk was summed)
      if (active && e0 < my_v) {  // uniform over the warp
        const float* kb = sk + buf * kMmaEntries * kMmaPitch;
        float acc[kMmaNt][4];
#pragma unroll
        for (int j = 0; j < kMmaNt; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kMmaKs; ++ks) {
#pragma unroll
          for (int j = 0; j < kMmaNt; ++j) {
            const float* kr = kb + (8 * j + r) * kMmaPitch + 8 * ks + c;
            MmaTf32(acc[j], a[ks], __float_as_uint(kr[0]), __float_as_uint(kr[4]));
          }
        }
#pragma unroll
        for (int j = 0; j < kMmaNt; ++j) {
          float v0 = fmaxf(acc[j][0], 0.0f) * wa + fmaxf(acc[j][2], 0.0f) * wb;
          float v1 = fmaxf(acc[j][1], 0.0f) * wa + fmaxf(acc[j][3], 0.0f) * wb;
#pragma unroll
          for (int o = 4; o < 32; o <<= 1) {
            v0 += __shfl_xor_sync(0xffffffffu, v0, o);
            v1 += __shfl_xor_sync(0xffffffffu, v1, o);
          }
          if (r == 0) {
            red[tok][g][8 * j + 2 * c] = v0;
            red[tok][g][8 * j + 2 * c + 1] = v1;
          }
        }
      }
      __syncthreads();  // red complete; every warp is done with this buffer
      for (int i = threadIdx.x; i < kTok * kMmaEntries; i += kThreads) {
        const int u = i / kMmaEntries, e = i % kMmaEntries;
        if (s_v[u] > 0 && s_seq[u] == seq && e0 + e < s_v[u]) {
          float score = red[u][0][e];
#pragma unroll
          for (int h = 1; h < kHg; ++h) score += red[u][h][e];
          scores[(t0 + u) * max_visible + e0 + e] = score;
        }
      }
      // The next iteration's barrier orders these reads of red before its rewrite; the buffer
      // refilled next (stage) was read before the barrier above.
    }
  }
}

__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Select: one 1024-thread block per token. The order keys are kept in shared memory when the host
// bound max_visible fits (kSmemKeys), else re-read from the scores each pass. Four 8-bit radix
// passes with warp-aggregated shared histograms (double-buffered, two barriers a pass) and a
// one-warp suffix scan to pick the bin; then one counting walk and one writing walk in which warp w
// owns a contiguous index segment (ballots give in-order ranks): every entry above the threshold
// key plus the `need` lowest-index ties, ascending. Same sets and order as the reference.
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int64_t kSmemKeys = 48 * 1024;  // 192 KB of keys
constexpr int kUnroll = 8;

__device__ __forceinline__ void HistAdd(int* hist, uint32_t bin, bool active) {
  const unsigned act = __ballot_sync(0xffffffffu, active);
  if (active) {
    const unsigned peers = __match_any_sync(act, bin);
    if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
  }
}

__global__ void __launch_bounds__(kSelectThreads, 1)
    SelectKernel(IndexerDims s, RaggedBatchView b, const float* scores, int64_t max_visible,
                 int64_t smem_keys, int32_t* out) {
  PdlTrigger();
  PdlWait();
  extern __shared__ uint32_t skeys[];
  __shared__ int hist[2][256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining;
  __shared__ int s_gt[kSelectWarps], s_tie[kSelectWarps];
  const int32_t t = blockIdx.x;
  const int64_t v64 = Visible(b, t, s.ratio);
  int32_t* o = out + t * s.topk;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (v64 <= s.topk) {
    // Everything visible is selected (also under forced scoring: top-v of v is all of them).
    for (int64_t i = tid; i < s.topk; i += kSelectThreads) o[i] = i < v64 ? static_cast<int32_t>(i) : -1;
    return;
  }
  const int v = static_cast<int>(v64);
  const int k = static_cast<int>(s.topk);
  // k < v here: every slot is written by the selection.
  const float* sc = scores + t * max_visible;
  const bool use_smem = v64 <= smem_keys;
  hist[0][tid & 255] = 0;  // 1024 threads cover 256 bins
  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = k;
  }
  __syncthreads();
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    int* cur = hist[pass & 1];
    const uint32_t prefix = s_prefix, mask = s_mask;
    for (int base = 0; base < v; base += kUnroll * kSelectThreads) {
      uint32_t key[kUnroll];
      if (pass == 0 || !use_smem) {
        float f[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = base + u * kSelectThreads + tid;
          f[u] = i < v ? sc[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          key[u] = OrderKey(f[u]);
          const int i = base + u * kSelectThreads + tid;
          if (pass == 0 && use_smem && i < v) skeys[i] = key[u];
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = base + u * kSelectThreads + tid;
          key[u] = i < v ? skeys[i] : 0u;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kSelectThreads + tid;
        HistAdd(cur, (key[u] >> shift) & 0xffu, i < v && (key[u] & mask) == prefix);
      }
    }
    hist[(pass + 1) & 1][tid & 255] = 0;
    __syncthreads();
    if (warp == 0) {
      // Lane l owns bins 255-8l down to 248-8l; find the highest bin where the count of matching
      // keys at or above it reaches `remaining` (bin 0 if none before it), as a serial scan would.
      int c[8];
      int sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = cur[255 - lane * 8 - j];
        sum += c[j];
      }
      int incl = sum;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += n;
      }
      const int rem = s_remaining;
      const unsigned ball = __ballot_sync(0xffffffffu, incl >= rem);
      const int owner = ball != 0 ? __ffs(ball) - 1 : 31;
      __syncwarp();  // every lane has read s_remaining before the owner rewrites it
      if (lane == owner) {
        int cum = incl - sum;
        int bin = 0;
        bool found = false;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (!found) {
            bin = 255 - lane * 8 - j;
            if (cum + c[j] >= rem || bin == 0) {
              found = true;
            } else {
              cum += c[j];
            }
          }
        }
        s_remaining = rem - cum;
        s_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
        s_mask = mask | (0xffu << shift);
      }
    }
    __syncthreads();
  }
  const uint32_t threshold = s_prefix;
  const int need = s_remaining;
  // Warp w owns [w*seg, min(v, (w+1)*seg)), seg a multiple of 32.
  const int seg = ((v + kSelectWarps - 1) / kSelectWarps + 31) / 32 * 32;
  const int lo = warp * seg;
  const int hi = min(v, lo + seg);
  const unsigned lt = (1u << lane) - 1u;
  auto load_keys = [&](int base, uint32_t* key) {
    if (use_smem) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * 32 + lane;
        key[u] = i < hi ? skeys[i] : 0u;
      }
    } else {
      float f[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * 32 + lane;
        f[u] = i < hi ? sc[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) key[u] = OrderKey(f[u]);
    }
  };
  int gt = 0, ties = 0;
  for (int base = lo; base < hi; base += kUnroll * 32) {
    uint32_t key[kUnroll];
    load_keys(base, key);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool in = base + u * 32 + lane < hi;
      gt += __popc(__ballot_sync(0xffffffffu, in && key[u] > threshold));
      ties += __popc(__ballot_sync(0xffffffffu, in && key[u] == threshold));
    }
  }
  if (lane == 0) {
    s_gt[warp] = gt;
    s_tie[warp] = ties;
  }
  __syncthreads();
  // Exclusive prefix over the warps (in index order).
  int g_incl = s_gt[lane], t_incl = s_tie[lane];
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int ng = __shfl_up_sync(0xffffffffu, g_incl, off);
    const int nt = __shfl_up_sync(0xffffffffu, t_incl, off);
    if (lane >= off) {
      g_incl += ng;
      t_incl += nt;
    }
  }
  const int g_excl = __shfl_sync(0xffffffffu, g_incl - s_gt[lane], warp);
  int tie_before = __shfl_sync(0xffffffffu, t_incl - s_tie[lane], warp);
  int pos = g_excl + min(tie_before, need);
  for (int base = lo; base < hi; base += kUnroll * 32) {
    uint32_t key[kUnroll];
    load_keys(base, key);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      const bool in = i < hi;
      const bool tie = in && key[u] == threshold;
      const unsigned tb = __ballot_sync(0xffffffffu, tie);
      const bool take = (in && key[u] > threshold) || (tie && tie_before + __popc(tb & lt) < need);
      const unsigned kb = __ballot_sync(0xffffffffu, take);
      if (take) o[pos + __popc(kb & lt)] = i;
      pos += __popc(kb);
      tie_before += __popc(tb);
    }
  }
}

}  // namespace

absl::Status IndexerSelectAll(const IndexerDims& s, const RaggedBatchView& b, int32_t* out,
                              cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(LaunchPdl(SelectAllKernel, dim3(static_cast<unsigned>(b.num_tokens)),
                                 dim3(256), 0, stream, s, b, out));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool IndexerTf32Fits(const IndexerDims& s) {
  return s.dim == kMmaDim && (s.heads == 16 || s.heads == 32 || s.heads == 64);
}

namespace {

template <int kHg, int kTok>
absl::Status LaunchScoreMmaFor(const IndexerDims& s, const RaggedBatchView& b, const float* q,
                               const float* w, const float* keys, int64_t max_visible,
                               float* scores, cudaStream_t stream) {
  const int64_t chunks = (max_visible + kMmaEntries - 1) / kMmaEntries;
  const int64_t groups = (b.num_tokens + kTok - 1) / kTok;
  // About 16k blocks in all at most (each keeps its q fragments over its chunks).
  const int64_t per_group = std::max<int64_t>(1, kMaxScoreBlocks / groups);
  const dim3 grid(static_cast<unsigned>(std::min(chunks, per_group)),
                  static_cast<unsigned>(groups));
  const size_t smem = sizeof(float) * 2 * kMmaEntries * kMmaPitch;
  auto kernel = ScoreMmaKernel<kHg, kTok>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  CUDA_RETURN_IF_ERROR(LaunchPdl(kernel, grid, dim3(32 * kHg * kTok), smem, stream, s, b, q, w,
                                 keys, max_visible, scores));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

// Groups of kMmaGroupTokens tokens from kMmaGroupMinTokens tokens a step (prefill: they share
// the staged keys), else one token a block (decode: more blocks). A shape-only choice; a token's
// scores are the same bits either way.
template <int kHg>
absl::Status LaunchScoreMmaHeads(const IndexerDims& s, const RaggedBatchView& b, const float* q,
                                 const float* w, const float* keys, int64_t max_visible,
                                 float* scores, cudaStream_t stream) {
  if (b.num_tokens >= kMmaGroupMinTokens && kHg * kMmaGroupTokens <= 16) {
    return LaunchScoreMmaFor<kHg, (kHg * kMmaGroupTokens <= 16 ? kMmaGroupTokens : 1)>(
        s, b, q, w, keys, max_visible, scores, stream);
  }
  return LaunchScoreMmaFor<kHg, 1>(s, b, q, w, keys, max_visible, scores, stream);
}

absl::Status LaunchScoreMma(const IndexerDims& s, const RaggedBatchView& b, const float* q,
                            const float* w, const float* keys, int64_t max_visible, float* scores,
                            cudaStream_t stream) {
  switch (s.heads) {
    case 16: return LaunchScoreMmaHeads<1>(s, b, q, w, keys, max_visible, scores, stream);
    case 32: return LaunchScoreMmaHeads<2>(s, b, q, w, keys, max_visible, scores, stream);
    default: return LaunchScoreMmaHeads<4>(s, b, q, w, keys, max_visible, scores, stream);
  }
}

}  // namespace

absl::Status IndexerTopK(const IndexerDims& s, const RaggedBatchView& b, const float* q,
                         const float* w, const float* keys, int64_t max_visible, bool tf32,
                         float* scores, int32_t* out, cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  if (s.dim % 4 != 0) return absl::UnimplementedError("index_head_dim must be a multiple of 4");
  if (tf32 && !IndexerTf32Fits(s)) {
    return absl::InvalidArgumentError("IndexerTopK: TF32 scoring needs dim 128 and 16, 32 or 64 heads");
  }
  if (max_visible > 0 && tf32) {
    RETURN_IF_ERROR(LaunchScoreMma(s, b, q, w, keys, max_visible, scores, stream));
  } else if (max_visible > 0) {
    // About 16k blocks in all at most; larger candidate counts loop inside the blocks.
    const int64_t chunks = (max_visible + kScoreEntries - 1) / kScoreEntries;
    const int64_t per_token = std::max<int64_t>(1, kMaxScoreBlocks / b.num_tokens);
    const dim3 grid(static_cast<unsigned>(std::min(chunks, per_token)),
                    static_cast<unsigned>(b.num_tokens));
    const size_t smem = sizeof(float) * static_cast<size_t>(s.heads * s.dim) +
                        sizeof(float4) * static_cast<size_t>(kScoreEntries * (s.dim / 4 + 1));
    decltype(&ScoreKernel<4>) kernel = nullptr;
    switch (s.heads) {
      case 4: kernel = ScoreKernel<4>; break;
      case 8: kernel = ScoreKernel<8>; break;
      case 16: kernel = ScoreKernel<16>; break;
      case 32: kernel = ScoreKernel<32>; break;
      case 64: kernel = ScoreKernel<64>; break;
      default:
        return absl::UnimplementedError(absl::StrCat("index_n_heads = ", s.heads,
                                                     " is not compiled (4, 8, 16, 32, 64)"));
    }
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    int threads = 0;
    switch (s.heads) {
      case 4: threads = ScoreCfg<4>::kThreads; break;
      case 8: threads = ScoreCfg<8>::kThreads; break;
      case 16: threads = ScoreCfg<16>::kThreads; break;
      case 32: threads = ScoreCfg<32>::kThreads; break;
      default: threads = ScoreCfg<64>::kThreads; break;
    }
    CUDA_RETURN_IF_ERROR(LaunchPdl(kernel, grid, dim3(static_cast<unsigned>(threads)), smem, stream,
                                   s, b, q, w, keys, max_visible, scores));
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  const int64_t smem_keys = max_visible <= kSmemKeys ? max_visible : 0;
  const size_t select_smem = sizeof(uint32_t) * static_cast<size_t>(smem_keys);
  // The attribute only ever grows: a graph captured with a larger size must still launch after an
  // eager step asked for less.
  static size_t select_smem_set = 0;
  if (select_smem > 0) {
    select_smem_set = std::max(select_smem_set, select_smem);
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(SelectKernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(select_smem_set)));
  }
  CUDA_RETURN_IF_ERROR(LaunchPdl(SelectKernel, dim3(static_cast<unsigned>(b.num_tokens)),
                                 dim3(kSelectThreads), select_smem, stream, s, b, scores,
                                 max_visible, smem_keys, out));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
