#include "kernels/cuda/attention.h"

#include <algorithm>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm_rope.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 16;  // keys staged per iteration
constexpr int64_t kTargetBlocks = 264;  // about two blocks per SM on H200
constexpr int64_t kMaxSplits = 64;

// Key j of token t's key list: window keys first (oldest to newest), then compressed entries.
struct KeyList {
  const float* kv;
  const float* ring;
  const float* entries;
  const int32_t* sel;
  int64_t dim, window, ratio, topk;
  bool dense;
  int32_t seq;
  int64_t pos, start, row0, lo, n_window, n_comp;
  const RaggedBatchView* b;

  __device__ const float* Key(int64_t j) const {
    if (j < n_window) {
      const int64_t p = lo + j;
      if (p >= start) return kv + (row0 + (p - start)) * dim;
      return ring + (static_cast<int64_t>(b->state_slot[seq]) * window + p % window) * dim;
    }
    const int64_t c = j - n_window;
    const int64_t e = dense ? c : sel[c];
    return entries + EntryRow(*b, seq, e, ratio) * dim;
  }
};

// Block: one query token, kHeads heads. Thread layout: head h = tid / (kThreads / kHeads); within
// a head, threads cover (key, dim-slice) pairs for scores and dim slices for the output.
// Split-KV (flash decoding): block z covers keys [z * split_len, (z + 1) * split_len) and, when
// `part` is set, leaves its unnormalised partial (acc[kDim], running max, running sum) there for
// CombineKernel; with one split it finishes the softmax itself.
template <int kHeads, int kDim>
__global__ void __launch_bounds__(kThreads) AttentionKernel(AttentionDims s, RaggedBatchView b,
                                                            const float* q, const float* kv,
                                                            const float* ring, const float* entries,
                                                            const int32_t* selected,
                                                            const float* sinks, float* out,
                                                            int64_t split_len, float* part) {
  PdlTrigger();
  PdlWait();
  // Blocks of 1 or 2 heads (a tensor-parallel rank's share of a few heads) run 32 threads a head.
  constexpr int kNT = kHeads >= 4 ? kThreads : kHeads * 32;
  constexpr int kThreadsPerHead = kNT / kHeads;              // 16 .. 32
  constexpr int kSplit = kThreadsPerHead / kChunk;           // threads per (head, key) score
  constexpr int kDimsPerThread = kDim / kThreadsPerHead;     // output dims per thread
  constexpr int kStride = kDim + 1;                          // padded smem row
  extern __shared__ float smem[];
  float* sq = smem;                          // [kHeads, kDim]
  float* sk = sq + kHeads * kDim;            // [kChunk, kStride]
  float* sp = sk + kChunk * kStride;         // [kHeads, kChunk] probabilities of the chunk
  __shared__ int32_t s_compact[1];
  __shared__ const float* s_key[kChunk];

  const int32_t t = blockIdx.x;
  const int h0 = blockIdx.y * kHeads;
  const int tid = threadIdx.x;
  const int hl = tid / kThreadsPerHead;      // local head
  const int ht = tid % kThreadsPerHead;      // thread within head

  KeyList keys;
  keys.kv = kv;
  keys.ring = ring;
  keys.entries = entries;
  keys.dim = kDim;
  keys.window = s.window;
  keys.ratio = s.ratio;
  keys.topk = s.topk;
  keys.dense = s.dense_compressed;
  keys.b = &b;
  keys.seq = b.token_seq[t];
  keys.pos = b.positions[t];
  keys.start = b.seq_start_pos[keys.seq];
  keys.row0 = b.seq_begin[keys.seq];
  keys.lo = keys.pos - s.window + 1 > 0 ? keys.pos - s.window + 1 : 0;
  keys.n_window = keys.pos - keys.lo + 1;
  keys.sel = nullptr;
  keys.n_comp = 0;
  // Padding rows of a graph step (state slot -1) attend to their own window only.
  if (s.ratio > 0 && b.state_slot[keys.seq] >= 0) {
    const int64_t visible = (keys.pos + 1) / s.ratio;
    if (s.dense_compressed) {
      keys.n_comp = visible;
    } else {
      // Valid selections are a prefix: the selection is ascending and -1 padded; drop picks that
      // are not causally visible.
      const int32_t* sel = selected + t * s.topk;
      if (tid == 0) {
        // Binary search for the end of the valid prefix.
        int32_t lo = 0, hi = static_cast<int32_t>(s.topk);
        while (lo < hi) {
          const int32_t mid = (lo + hi) / 2;
          if (sel[mid] >= 0 && sel[mid] < visible) lo = mid + 1; else hi = mid;
        }
        s_compact[0] = lo;
      }
      __syncthreads();
      keys.sel = sel;
      keys.n_comp = s_compact[0];
    }
  }
  const int64_t total = keys.n_window + keys.n_comp;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * split_len;
  const int64_t k_end = total < k_begin + split_len ? total : k_begin + split_len;

  for (int64_t i = tid; i < kHeads * kDim; i += kNT) {
    sq[i] = q[(static_cast<int64_t>(t) * s.heads + h0) * kDim + i];
  }
  float acc[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) acc[i] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // per head, replicated across the head's threads

  const int kj = ht / kSplit;            // key of this thread's score
  const int ks = ht % kSplit;            // dim slice of that score
  constexpr int kScoreDims = kDim / kSplit;
  for (int64_t base = k_begin; base < k_end; base += kChunk) {
    const int n = k_end - base < kChunk ? static_cast<int>(k_end - base) : kChunk;
    __syncthreads();
    if (tid < n) s_key[tid] = keys.Key(base + tid);
    __syncthreads();
    for (int i = tid; i < n * (kDim / 4); i += kNT) {
      const int j = i / (kDim / 4), d4 = i % (kDim / 4);
      const float4 v = *reinterpret_cast<const float4*>(s_key[j] + d4 * 4);
      float* dst = sk + j * kStride + d4 * 4;
      dst[0] = v.x;
      dst[1] = v.y;
      dst[2] = v.z;
      dst[3] = v.w;
    }
    __syncthreads();
    // Scores of this chunk: thread (hl, kj, ks) sums a dim slice, then the kSplit threads combine.
    float score = 0.0f;
    if (kj < n) {
      const float* qh = sq + hl * kDim + ks * kScoreDims;
      const float* kk = sk + kj * kStride + ks * kScoreDims;
      // Four independent accumulators: the dot product is latency-bound otherwise.
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 4
      for (int d = 0; d < kScoreDims; d += 4) {
        s0 += qh[d] * kk[d];
        s1 += qh[d + 1] * kk[d + 1];
        s2 += qh[d + 2] * kk[d + 2];
        s3 += qh[d + 3] * kk[d + 3];
      }
      score = (s0 + s1) + (s2 + s3);
    }
#pragma unroll
    for (int o = kSplit / 2; o > 0; o >>= 1) score += __shfl_xor_sync(0xffffffffu, score, o);
    score = kj < n ? score * s.scale : -INFINITY;
    // Chunk max over the head's keys (lanes of one head are contiguous: kThreadsPerHead >= 16).
    float cmax = score;
    static_assert(kThreadsPerHead <= 32, "a head's threads must share a warp");
    for (int o = kThreadsPerHead / 2; o >= kSplit; o >>= 1) {
      cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
    }
    const float m_new = fmaxf(m_run, cmax);
    const float p = kj < n ? expf(score - m_new) : 0.0f;
    if (ks == 0 && kj < kChunk) sp[hl * kChunk + kj] = p;
    __syncthreads();
    float psum = 0.0f;
    for (int j = 0; j < n; ++j) psum += sp[hl * kChunk + j];
    const float correction = expf(m_run - m_new);
    l_run = l_run * correction + psum;
    m_run = m_new;
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) acc[i] *= correction;
    for (int j = 0; j < n; ++j) {
      const float pj = sp[hl * kChunk + j];
      const float* kk = sk + j * kStride + ht * kDimsPerThread;
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) acc[i] += pj * kk[i];
    }
  }
  if (part != nullptr) {
    const int64_t slot = (static_cast<int64_t>(t) * s.heads + h0 + hl) * gridDim.z + blockIdx.z;
    float* pp = part + slot * (kDim + 2);
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) pp[ht * kDimsPerThread + i] = acc[i];
    if (ht == 0) {
      pp[kDim] = m_run;
      pp[kDim + 1] = l_run;
    }
    return;
  }
  // The sink joins the softmax without a value.
  const float sink = sinks[h0 + hl];
  const float m_fin = fmaxf(m_run, sink);
  const float denom = l_run * expf(m_run - m_fin) + expf(sink - m_fin);
  const float rescale = expf(m_run - m_fin) / denom;
  float* o = out + (static_cast<int64_t>(t) * s.heads + h0 + hl) * kDim + ht * kDimsPerThread;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) o[i] = total > 0 ? acc[i] * rescale : 0.0f;
}

}  // namespace

int AttentionSplits(const AttentionDims& s, int64_t tokens);

namespace {

// Keys per split: max_keys spread evenly, rounded up to whole chunks.
int64_t SplitLen(const AttentionDims& s, int splits) {
  const int64_t per = (s.max_keys + splits - 1) / splits;
  return (per + kChunk - 1) / kChunk * kChunk;
}

// Merges the splits of (token, head) = (blockIdx.x, blockIdx.y) with the sink, one thread per
// output channel (blockDim = dim); the trailing s.out_rope_dims channels leave rotated
// (RopeRotate at the token's position, the pair's other value from the neighbouring lane). Warp 0
// first computes each split's scale exp(m_z - m) and the denominator once (shared memory); each
// thread then loads its channel of 8 splits at a time before adding them, in split order: the
// products and sums of the per-element loop this replaced (which recomputed the exps and
// serialised its loads: 22 us for a CSA head group at 20 splits, 11 us at 4-5), same bits.
__global__ void __launch_bounds__(512) CombineKernel(AttentionDims s, const int32_t* positions,
                                                     int splits, const float* part,
                                                     const float* sinks, float* out) {
  PdlTrigger();
  PdlWait();
  __shared__ float scale[kMaxSplits], lsum[kMaxSplits];
  __shared__ bool valid[kMaxSplits];
  __shared__ float s_denom;
  const int64_t t = blockIdx.x, h = blockIdx.y, heads = s.heads, dim = s.dim;
  const int64_t stride = dim + 2;
  const float* pp = part + (t * heads + h) * splits * stride;
  if (threadIdx.x < 32) {
    // The running max over the sink and the splits (fmaxf: any order gives the same bits), each
    // split's scale and softmax sum, then the denominator in split order on lane 0.
    const int lane = threadIdx.x;
    const float sink = sinks[h];
    float m = -INFINITY;
    for (int z = lane; z < splits; z += 32) m = fmaxf(m, pp[z * stride + dim]);
    m = fmaxf(sink, WarpMax(m));
    for (int z = lane; z < splits; z += 32) {
      const float mz = pp[z * stride + dim];
      valid[z] = mz > -INFINITY;
      scale[z] = valid[z] ? expf(mz - m) : 0.0f;
      lsum[z] = valid[z] ? pp[z * stride + dim + 1] : 0.0f;
    }
    __syncwarp();
    if (lane == 0) {
      float denom = expf(sink - m);
      for (int z = 0; z < splits; ++z) {
        if (valid[z]) denom += lsum[z] * scale[z];
      }
      s_denom = denom;
    }
  }
  __syncthreads();
  const int64_t i = threadIdx.x;
  float acc = 0.0f;
  if (i < dim) {
    int z = 0;
    for (; z + 8 <= splits; z += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = pp[(z + u) * stride + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (valid[z + u]) acc += v[u] * scale[z + u];
      }
    }
    for (; z < splits; ++z) {
      if (valid[z]) acc += pp[z * stride + i] * scale[z];
    }
  }
  float val = acc / s_denom;
  if (s.out_rope_dims > 0) {
    // Every lane takes part in the exchange (blockDim is a multiple of 32, no thread has left).
    const float other = __shfl_xor_sync(0xffffffffu, val, 1);
    const int64_t first = dim - s.out_rope_dims;
    if (i >= first && i < dim) {
      const bool even = ((i - first) & 1) == 0;
      const float2 y = RopeRotate(even ? val : other, even ? other : val,
                                  static_cast<float>(positions[t]),
                                  s.out_rope_freq[(i - first) / 2], s.out_rope_inverse);
      val = even ? y.x : y.y;
    }
  }
  if (i < dim) out[(t * heads + h) * dim + i] = val;
}

// After the main kernel: the combine of the splits (with the output RoPE), or the RoPE alone.
absl::Status Finish(const AttentionDims& s, const RaggedBatchView& b, int splits,
                    const float* workspace, const float* sinks, float* out, cudaStream_t stream) {
  if (splits > 1) {
    if (s.dim > 512) {  // one combine thread per channel (__launch_bounds__(512))
      return absl::UnimplementedError("attention combine: head_dim above 512");
    }
    const unsigned threads = static_cast<unsigned>((s.dim + 31) / 32 * 32);
    CUDA_RETURN_IF_ERROR(LaunchPdl(
        CombineKernel, dim3(static_cast<unsigned>(b.num_tokens), static_cast<unsigned>(s.heads)),
        dim3(threads), 0, stream, s, b.positions, splits, workspace, sinks, out));
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  if (s.out_rope_dims == 0) return absl::OkStatus();
  return Rope(out, b.num_tokens, s.heads, s.dim, s.out_rope_dims, s.out_rope_freq, b.positions,
              s.out_rope_inverse, stream);
}

template <int kHeads, int kDim>
absl::Status Launch(const AttentionDims& s, const RaggedBatchView& b, const float* q,
                    const float* kv, const float* ring, const float* entries,
                    const int32_t* selected, const float* sinks, float* out, float* workspace,
                    cudaStream_t stream) {
  const size_t smem =
      sizeof(float) * (kHeads * kDim + kChunk * (kDim + 1) + kHeads * kChunk);
  auto kernel = AttentionKernel<kHeads, kDim>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  const int splits = AttentionSplits(s, b.num_tokens);
  const int64_t split_len = splits > 1 ? SplitLen(s, splits) : (int64_t{1} << 40);
  const dim3 grid(static_cast<unsigned>(b.num_tokens), static_cast<unsigned>(s.heads / kHeads),
                  static_cast<unsigned>(splits));
  constexpr int kNT = kHeads >= 4 ? kThreads : kHeads * 32;  // as in the kernel
  CUDA_RETURN_IF_ERROR(LaunchPdl(kernel, grid, dim3(kNT), smem, stream, s, b, q, kv, ring,
                                 entries, selected, sinks, out, split_len,
                                 splits > 1 ? workspace : nullptr));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return Finish(s, b, splits, workspace, sinks, out, stream);
}

// ---- Tensor-core path (bf16 precision) ----------------------------------------------------------
//
// Block: one query token x kTcHeads heads x one key split; 8 warps. The heads are the M dimension
// of both products, so each key row is staged once per block for all its heads (MQA):
//   S[kTcHeads, kTcN] = Q[kTcHeads, D] . K[kTcN, D]^T     (M = heads, N = keys, K = D)
//   O[kTcHeads, D]   += P[kTcHeads, kTcN] . V[kTcN, D]    (M = heads, N = D, K = keys; V = K)
// q is rounded to bf16 into shared memory once; each chunk of kTcN keys is gathered from its rows
// (window from kv / ring, then compressed entries, as KeyList) and rounded to bf16 into shared
// memory (rows past the chunk's key count are zero). Per chunk:
//   1. S: warp w = (ngrp, kgrp), kgrp = w % 4, ngrp = w / 4, computes S over dims
//      [kgrp*D/4, (kgrp+1)*D/4) for keys [ngrp*16, ngrp*16+16) and all heads; the 4 partial
//      sums (one per kgrp) go to sS and are added in fixed order (deterministic, no atomics).
//   2. Softmax (fp32): kTcThreads/kTcHeads threads per head row; running max / sum in registers
//      of the row's threads; P rounded to bf16 into sP; the row's rescale factor into sCorr.
//   3. PV: warp w owns output dims [w*D/8, (w+1)*D/8) for all heads: fp32 accumulators
//      (kTcHeads/16) x (D/64) tiles x 4 floats per lane (64 registers at 32 heads x 512).
// Splits leave (acc[D], running max, running sum) per (token, head, split) for CombineKernel,
// exactly as AttentionKernel does; one split finishes the softmax with the sink in place.
//
// Fragment layouts relied on (PTX ISA, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32;
// lane = 0..31, g = lane / 4, c = lane % 4; each .b32 register holds two bf16, the lower column /
// row index in the low 16 bits):
//   A (16x16, row-major): a0 = A[g][2c, 2c+1]    a1 = A[g+8][2c, 2c+1]
//                         a2 = A[g][2c+8, 2c+9]  a3 = A[g+8][2c+8, 2c+9]
//   B (16x8, "col": element (k, n)): b0 = B[2c, 2c+1][g]  b1 = B[2c+8, 2c+9][g]
//   C/D (16x8 fp32): c0 = C[g][2c]  c1 = C[g][2c+1]  c2 = C[g+8][2c]  c3 = C[g+8][2c+1]
// For S, A = Q (sQ[head][dim]) and B(k = dim, n = key) = sK[key][dim]: both fragments are two
// consecutive bf16 of one shared row, read as one 32-bit load. For PV, A = P (sP[head][key]) the
// same way; B(k = key, n = dim) = sK[key][dim] has k along rows, so it is read with
// ldmatrix.m8n8.x4.trans: lanes 8i..8i+7 address the 8 rows (16 bytes each) of 8x8 matrix i and,
// with .trans, lane l receives in register i the elements (rows 2c, 2c+1; column g) of matrix i,
// which is exactly a b0 / b1 fragment. Matrices: 0 = keys k0..k0+7 x dims n0..n0+7 (b0 of n-tile
// n0), 1 = keys k0+8..15 x dims n0.. (b1 of n0), 2 = keys k0..7 x dims n0+8.. (b0 of n0+8),
// 3 = keys k0+8..15 x dims n0+8.. (b1 of n0+8); lane l addresses row k0 + (l & 15), column
// n0 + (l >> 4) * 8.
// Shared rows are padded by 8 bf16 (row stride = 4 banks mod 32), so the 32-bit fragment loads
// (8 rows x 4 words) and the ldmatrix phases (8 rows x 16 bytes) are conflict-free.

// Row addressing of one token's keys (AttentionKernel's KeyList, resolved for the token): key j
// is window position lo + j (this step's kv rows from `start` on, the ring before) for
// j < n_window, then compressed entry sel[j - n_window] (CSA) or j - n_window (HCA).
struct TcKeyRows {
  const float* kv;        // the sequence's first kv row of this step
  const float* ring;
  const float* entries;
  const int32_t* sel;     // CSA selection of the token; null for HCA
  const int32_t* table;   // the sequence's block_table row
  int64_t ring_row0;      // state_slot * window
  int64_t lo, start, n_window, window, ratio, block_size;

  __device__ const float* Key(int64_t j, int64_t dim) const {
    if (j < n_window) {
      const int64_t p = lo + j;
      if (p >= start) return kv + (p - start) * dim;
      return ring + (ring_row0 + p % window) * dim;
    }
    const int64_t c = j - n_window;
    const int64_t e = sel != nullptr ? sel[c] : c;
    // EntryRow (kernels/ragged_batch.h) on the sequence's table row.
    const int64_t epos = e * ratio;
    const int64_t block = table[epos / block_size];
    return entries + (block * (block_size / ratio) + (epos % block_size) / ratio) * dim;
  }
};

constexpr int kTcThreads = 256;          // 8 warps
constexpr int kTcWarps = kTcThreads / 32;
constexpr int kTcHeads = 32;             // heads per block (or 16: TcHeadsPerBlock)
constexpr int kTcN = 32;                 // keys per chunk
constexpr int kTcPad = 8;                // bf16 padding of each sQ / sK / sP row
constexpr int kTcKSplit = 4;             // S: warps split the head dim 4 ways ...
constexpr int kTcNSplit = kTcWarps / kTcKSplit;  // ... and the chunk's keys 2 ways
constexpr int kTcSStride = kTcN + 8;     // fp32 row of a partial S (conflict-free float2 stores)
constexpr int kTcPStride = kTcN + kTcPad;  // bf16 row of P
constexpr int64_t kTcTargetBlocks = 264;  // two blocks per SM on H200 (132 SMs)

template <int kHeads, int kDim>
constexpr size_t TcSmemBytes() {
  return sizeof(__nv_bfloat16) * (kHeads + kTcN) * (kDim + kTcPad) +   // sQ, sK
         sizeof(float) * kTcKSplit * kHeads * kTcSStride +             // sS
         sizeof(__nv_bfloat16) * kHeads * kTcPStride +                 // sP
         sizeof(float) * 3 * kHeads;                                   // sCorr, sM, sL
}

__device__ __forceinline__ uint32_t Ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// D = A.B + D, m16n8k16, bf16 inputs, fp32 accumulators (layouts above).
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four transposed 8x8 bf16 matrices; this lane addresses one 16-byte row (layouts above).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Four floats rounded to bf16 (round to nearest even) and stored as 8 bytes.
__device__ __forceinline__ void StoreBf16x4(__nv_bfloat16* dst, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);  // .x (low half) = v.x
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&lo);
  u.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = u;
}

template <int kHeads, int kDim>
__global__ void __launch_bounds__(kTcThreads, kHeads <= 32 ? 2 : 1)
    AttentionTcKernel(AttentionDims s, RaggedBatchView b, const float* q, const float* kv,
                      const float* ring, const float* entries, const int32_t* selected,
                      const float* sinks, float* out, int64_t split_len, float* part) {
  PdlTrigger();
  PdlWait();
  constexpr int kLd = kDim + kTcPad;               // bf16 row stride of sQ and sK
  constexpr int kMT = kHeads / 16;                 // m-tiles (16 heads each)
  constexpr int kSNT = kTcN / 8 / kTcNSplit;       // S: n-tiles (8 keys) per warp
  constexpr int kSKS = kDim / 16 / kTcKSplit;      // S: k-steps (16 dims) per warp
  constexpr int kODims = kDim / kTcWarps;          // PV: output dims per warp
  constexpr int kONT = kODims / 8;                 // PV: n-tiles (8 dims) per warp
  constexpr int kTPR = kTcThreads / kHeads;        // softmax: threads per head row
  constexpr int kKPT = kTcN / kTPR;                // softmax: keys per thread
  constexpr int kTPK = kTcThreads / kTcN;          // staging: threads per key
  constexpr int kF4 = kDim / 4 / kTPK;             // staging: float4 per thread
  constexpr int kBatch = kF4 < 8 ? kF4 : 8;        // staging: loads in flight per thread
  static_assert(kHeads % 16 == 0 && kTPR >= 1 && kTPR <= 32 && kKPT >= 1, "head tiling");
  static_assert(kSNT >= 1 && kSKS >= 1 && kONT % 2 == 0, "dim tiling");
  static_assert(kTcThreads % kTcN == 0 && kF4 % kBatch == 0 && kTcN % 16 == 0, "chunk tiling");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kHeads][kLd]
  __nv_bfloat16* sK = sQ + kHeads * kLd;                              // [kTcN][kLd]
  float* sS = reinterpret_cast<float*>(sK + kTcN * kLd);  // [kTcKSplit][kHeads][kTcSStride]
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(sS + kTcKSplit * kHeads * kTcSStride);
  float* sCorr = reinterpret_cast<float*>(sP + kHeads * kTcPStride);  // [kHeads]
  float* sM = sCorr + kHeads;                                          // [kHeads]
  float* sL = sM + kHeads;                                             // [kHeads]
  __shared__ int32_t s_compact[1];

  const int groups = static_cast<int>(s.heads / kHeads);
  const int32_t t = static_cast<int32_t>(blockIdx.x / groups);
  const int h0 = static_cast<int>(blockIdx.x % groups) * kHeads;
  const int z = blockIdx.y;
  const int splits = gridDim.y;
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;

  // Token t's keys, as AttentionKernel's KeyList; the row addressing lives in shared memory so
  // that the chunk loop keeps no per-token registers (the 128 of a thread are mostly O).
  __shared__ TcKeyRows s_rows;
  const int32_t seq = b.token_seq[t];
  const int64_t pos = b.positions[t];
  const int64_t start = b.seq_start_pos[seq];
  const int64_t lo = pos - s.window + 1 > 0 ? pos - s.window + 1 : 0;
  const int64_t n_window = pos - lo + 1;
  const int32_t* sel = nullptr;
  int64_t n_comp = 0;
  // Padding rows of a graph step (state slot -1) attend to their own window only.
  if (s.ratio > 0 && b.state_slot[seq] >= 0) {
    const int64_t visible = (pos + 1) / s.ratio;
    if (s.dense_compressed) {
      n_comp = visible;
    } else {
      // The valid selections are a prefix (ascending, -1 padded); drop picks not causally visible.
      const int32_t* tsel = selected + static_cast<int64_t>(t) * s.topk;
      if (tid == 0) {
        int32_t first = 0, last = static_cast<int32_t>(s.topk);  // binary search, as AttentionKernel
        while (first < last) {
          const int32_t mid = (first + last) / 2;
          if (tsel[mid] >= 0 && tsel[mid] < visible) first = mid + 1; else last = mid;
        }
        s_compact[0] = first;
      }
      __syncthreads();
      sel = tsel;
      n_comp = s_compact[0];
    }
  }
  if (tid == 0) {
    s_rows.kv = kv + static_cast<int64_t>(b.seq_begin[seq]) * kDim;
    s_rows.ring = ring;
    s_rows.entries = entries;
    s_rows.sel = sel;
    s_rows.table = b.block_table + static_cast<int64_t>(seq) * b.block_stride;
    s_rows.ring_row0 = static_cast<int64_t>(b.state_slot[seq]) * s.window;
    s_rows.lo = lo;
    s_rows.start = start;
    s_rows.n_window = n_window;
    s_rows.window = s.window;
    s_rows.ratio = s.ratio;
    s_rows.block_size = b.block_size;
  }  // read after the chunk loop's first __syncthreads
  const int64_t total = n_window + n_comp;
  const int64_t k_begin = static_cast<int64_t>(z) * split_len;
  const int64_t k_end = total < k_begin + split_len ? total : k_begin + split_len;

  // q -> bf16 (only when this split has keys; the loop below synchronises before any read).
  if (k_begin < k_end) {
    const float4* qg =
        reinterpret_cast<const float4*>(q + (static_cast<int64_t>(t) * s.heads + h0) * kDim);
    constexpr int kQF4 = kHeads * kDim / 4 / kTcThreads;  // float4 of q per thread
    constexpr int kQBatch = kQF4 < 8 ? kQF4 : 8;
    static_assert(kQF4 * kTcThreads * 4 == kHeads * kDim && kQF4 % kQBatch == 0, "q tiling");
#pragma unroll
    for (int r0 = 0; r0 < kQF4; r0 += kQBatch) {
      float4 v[kQBatch];  // all loads of a batch in flight before the stores
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) v[u] = __ldg(qg + tid + (r0 + u) * kTcThreads);
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int i = tid + (r0 + u) * kTcThreads;
        StoreBf16x4(sQ + (i / (kDim / 4)) * kLd + (i % (kDim / 4)) * 4, v[u]);
      }
    }
  }

  float oacc[kMT][kONT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kONT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) oacc[mt][nt][i] = 0.0f;
    }
  }
  // Softmax ownership: row srow, keys [sj0, sj0 + kKPT) of each chunk.
  const int srow = tid / kTPR;
  const int sj0 = (tid % kTPR) * kKPT;
  float m_run = -INFINITY, l_run = 0.0f;  // replicated over the row's kTPR threads

  const int kgrp = warp % kTcKSplit, ngrp = warp / kTcKSplit;
  for (int64_t base = k_begin; base < k_end; base += kTcN) {
    const int n = k_end - base < kTcN ? static_cast<int>(k_end - base) : kTcN;
    __syncthreads();  // the previous chunk's readers of sK, sS, sP, sCorr are done
    // Stage the chunk as bf16: kTcThreads / kTcN threads per key, each converting every
    // (kTcThreads / kTcN)-th float4 of the row (a warp reads 4 rows, 128 contiguous bytes each per
    // load). Missing keys become zero rows: finite, and their P is 0.
    {
      const int j = tid / kTPK;
      const float4* src =
          j < n ? reinterpret_cast<const float4*>(s_rows.Key(base + j, kDim)) : nullptr;
      __nv_bfloat16* dst = sK + j * kLd + (tid % kTPK) * 4;
#pragma unroll
      for (int r0 = 0; r0 < kF4; r0 += kBatch) {
        float4 v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          v[u] = src != nullptr ? __ldg(src + (tid % kTPK) + (r0 + u) * kTPK)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) StoreBf16x4(dst + (r0 + u) * kTPK * 4, v[u]);
      }
    }
    __syncthreads();

    // 1. Partial S of this warp: keys [ngrp*kSNT*8, +kSNT*8), dims [kgrp*kSKS*16, +kSKS*16).
    {
      float sacc[kMT][kSNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kSNT; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) sacc[mt][nt][i] = 0.0f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kSKS; ++ks) {
        const int k0 = (kgrp * kSKS + ks) * 16;
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const __nv_bfloat16* qa = sQ + (mt * 16 + g) * kLd + k0 + 2 * c;
          a[mt][0] = Ld32(qa);
          a[mt][1] = Ld32(qa + 8 * kLd);
          a[mt][2] = Ld32(qa + 8);
          a[mt][3] = Ld32(qa + 8 * kLd + 8);
        }
#pragma unroll
        for (int nt = 0; nt < kSNT; ++nt) {
          const __nv_bfloat16* kb = sK + ((ngrp * kSNT + nt) * 8 + g) * kLd + k0 + 2 * c;
          const uint32_t b0 = Ld32(kb), b1 = Ld32(kb + 8);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) MmaBf16(sacc[mt][nt], a[mt], b0, b1);
        }
      }
      float* ss = sS + kgrp * kHeads * kTcSStride;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kSNT; ++nt) {
          const int row = mt * 16 + g, col = (ngrp * kSNT + nt) * 8 + 2 * c;
          *reinterpret_cast<float2*>(ss + row * kTcSStride + col) =
              make_float2(sacc[mt][nt][0], sacc[mt][nt][1]);
          *reinterpret_cast<float2*>(ss + (row + 8) * kTcSStride + col) =
              make_float2(sacc[mt][nt][2], sacc[mt][nt][3]);
        }
      }
    }
    __syncthreads();

    // 2. Online softmax of the chunk in fp32 (keys past n masked to -inf, P = 0).
    {
      float sc[kKPT];
#pragma unroll
      for (int u = 0; u < kKPT; ++u) sc[u] = 0.0f;
#pragma unroll
      for (int kg = 0; kg < kTcKSplit; ++kg) {  // fixed order: deterministic
        const float* ss = sS + (kg * kHeads + srow) * kTcSStride + sj0;
#pragma unroll
        for (int u = 0; u < kKPT; ++u) sc[u] += ss[u];
      }
      float cmax = -INFINITY;
#pragma unroll
      for (int u = 0; u < kKPT; ++u) {
        sc[u] = sj0 + u < n ? sc[u] * s.scale : -INFINITY;
        cmax = fmaxf(cmax, sc[u]);
      }
#pragma unroll
      for (int o = kTPR / 2; o > 0; o >>= 1) {
        cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
      }
      const float m_new = fmaxf(m_run, cmax);  // finite: the chunk has n >= 1 keys
      float psum = 0.0f;
      __nv_bfloat16* pr = sP + srow * kTcPStride + sj0;
#pragma unroll
      for (int u = 0; u < kKPT; ++u) {
        const __nv_bfloat16 p = __float2bfloat16_rn(sj0 + u < n ? expf(sc[u] - m_new) : 0.0f);
        pr[u] = p;
        psum += __bfloat162float(p);  // the denominator sums the P the product uses
      }
#pragma unroll
      for (int o = kTPR / 2; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      const float corr = expf(m_run - m_new);  // 0 on the first chunk (m_run = -inf)
      l_run = l_run * corr + psum;
      m_run = m_new;
      if (tid % kTPR == 0) sCorr[srow] = corr;
    }
    __syncthreads();

    // 3. O = O * corr + P . V over this warp's output dims.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const float c_lo = sCorr[mt * 16 + g], c_hi = sCorr[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < kONT; ++nt) {
        oacc[mt][nt][0] *= c_lo;
        oacc[mt][nt][1] *= c_lo;
        oacc[mt][nt][2] *= c_hi;
        oacc[mt][nt][3] *= c_hi;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kTcN / 16; ++ks) {
      const int k0 = ks * 16;
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const __nv_bfloat16* pa = sP + (mt * 16 + g) * kTcPStride + k0 + 2 * c;
        a[mt][0] = Ld32(pa);
        a[mt][1] = Ld32(pa + 8 * kTcPStride);
        a[mt][2] = Ld32(pa + 8);
        a[mt][3] = Ld32(pa + 8 * kTcPStride + 8);
      }
#pragma unroll
      for (int np = 0; np < kONT / 2; ++np) {
        const int n0 = warp * kODims + np * 16;
        uint32_t bv[4];
        LdMatrixX4Trans(bv, sK + (k0 + (lane & 15)) * kLd + n0 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          MmaBf16(oacc[mt][2 * np], a[mt], bv[0], bv[1]);
          MmaBf16(oacc[mt][2 * np + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // Row statistics to the output owners.
  if (tid % kTPR == 0) {
    sM[srow] = m_run;
    sL[srow] = l_run;
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * 16 + g + 8 * half;
      const int64_t th = static_cast<int64_t>(t) * s.heads + h0 + row;
      if (part != nullptr) {
        float* pp = part + (th * splits + z) * (kDim + 2);
#pragma unroll
        for (int nt = 0; nt < kONT; ++nt) {
          *reinterpret_cast<float2*>(pp + warp * kODims + nt * 8 + 2 * c) =
              make_float2(oacc[mt][nt][2 * half], oacc[mt][nt][2 * half + 1]);
        }
        if (warp == 0 && c == 0) {
          pp[kDim] = sM[row];
          pp[kDim + 1] = sL[row];
        }
      } else {
        // The sink joins the softmax without a value.
        const float m = sM[row];
        const float sink = sinks[h0 + row];
        const float m_fin = fmaxf(m, sink);
        const float denom = sL[row] * expf(m - m_fin) + expf(sink - m_fin);
        const float rescale = total > 0 ? expf(m - m_fin) / denom : 0.0f;
        float* o = out + th * kDim + warp * kODims + 2 * c;
#pragma unroll
        for (int nt = 0; nt < kONT; ++nt) {
          *reinterpret_cast<float2*>(o + nt * 8) =
              make_float2(oacc[mt][nt][2 * half] * rescale, oacc[mt][nt][2 * half + 1] * rescale);
        }
      }
    }
  }
}

// Heads per block: 32 (K staged once for more heads) unless heads % 32 != 0 or the 32-head grid
// would cover fewer than a quarter of the SMs (small decode batches): then 16, twice the blocks
// (always 16 in batch-invariant mode).
// On the H200 at batch 1 (bench/results/h200-2026-11-30e/round4) 16 heads per block took the
// sliding-window attention from 10.8 to 7.1 us, CSA's from 12.5 to 9.7 and HCA's from 9.2 to
// 7.0, the slice3 FULL step from 0.918 to 0.901 ms; batch 8 measured level (2.414 / 2.407 ms).
constexpr int64_t kTcFewBlocks = 32;
int TcHeadsPerBlock(const AttentionDims& s, int64_t tokens) {
  if (s.heads % kTcHeads != 0 || s.batch_invariant) return 16;
  return tokens * (s.heads / kTcHeads) < kTcFewBlocks ? 16 : kTcHeads;
}

// Keys per split: max_keys spread evenly, rounded up to whole chunks.
int64_t TcSplitLen(const AttentionDims& s, int splits) {
  const int64_t per = (s.max_keys + splits - 1) / splits;
  return (per + kTcN - 1) / kTcN * kTcN;
}

int TcSplits(const AttentionDims& s, int64_t tokens) {
  const int64_t blocks = tokens * (s.heads / TcHeadsPerBlock(s, tokens));
  const int64_t chunks = (s.max_keys + kTcN - 1) / kTcN;
  if (blocks <= 0 || chunks <= 1 || blocks >= kTcTargetBlocks) return 1;
  // At most one wave of blocks, at least one chunk per split.
  const int64_t want = std::min<int64_t>({std::max<int64_t>(kTcTargetBlocks / blocks, 1), chunks,
                                          kMaxSplits});
  // Whole chunks per split: drop the splits that would be empty at max_keys.
  const int64_t len = TcSplitLen(s, static_cast<int>(want));
  return static_cast<int>((s.max_keys + len - 1) / len);
}

template <int kHeads, int kDim>
absl::Status LaunchTc(const AttentionDims& s, const RaggedBatchView& b, const float* q,
                      const float* kv, const float* ring, const float* entries,
                      const int32_t* selected, const float* sinks, float* out, float* workspace,
                      cudaStream_t stream) {
  constexpr size_t smem = TcSmemBytes<kHeads, kDim>();
  static_assert(smem <= 227 * 1024, "shared memory");
  auto kernel = AttentionTcKernel<kHeads, kDim>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  const int splits = AttentionSplits(s, b.num_tokens);
  const int64_t split_len = splits > 1 ? TcSplitLen(s, splits) : (int64_t{1} << 40);
  const dim3 grid(static_cast<unsigned>(b.num_tokens * (s.heads / kHeads)),
                  static_cast<unsigned>(splits));
  CUDA_RETURN_IF_ERROR(LaunchPdl(kernel, grid, dim3(kTcThreads), smem, stream, s, b, q, kv, ring,
                                 entries, selected, sinks, out, split_len,
                                 splits > 1 ? workspace : nullptr));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return Finish(s, b, splits, workspace, sinks, out, stream);
}

}  // namespace

// Heads a SIMT block takes: 8 or 4 (128 threads), else 2 or 1 (32 threads a head).
int HeadsPerBlock(int64_t heads) {
  return heads % 8 == 0 ? 8 : heads % 4 == 0 ? 4 : heads % 2 == 0 ? 2 : 1;
}

bool AttentionUsesTensorCores(const AttentionDims& s) {
  return s.bf16_tensor_cores && s.heads % 16 == 0 && (s.dim == 128 || s.dim == 256 || s.dim == 512);
}

int AttentionSplits(const AttentionDims& s, int64_t tokens) {
  if (s.batch_invariant) return 1;
  if (AttentionUsesTensorCores(s)) return TcSplits(s, tokens);
  const int heads_per_block = HeadsPerBlock(s.heads);
  const int64_t blocks = tokens * (s.heads / heads_per_block);
  if (s.max_keys <= 2 * kChunk || blocks >= kTargetBlocks) return 1;
  const int64_t by_blocks = (kTargetBlocks + blocks - 1) / blocks;
  const int64_t by_keys = (s.max_keys + 2 * kChunk - 1) / (2 * kChunk);  // >= 2 chunks a split
  return static_cast<int>(std::min<int64_t>({by_blocks, by_keys, kMaxSplits}));
}

int64_t AttentionWorkspaceFloats(const AttentionDims& s, int64_t tokens) {
  const int splits = AttentionSplits(s, tokens);
  return splits > 1 ? tokens * s.heads * splits * (s.dim + 2) : 0;
}

absl::Status Attention(const AttentionDims& s, const RaggedBatchView& b, const float* q,
                       const float* kv, const float* ring, const float* entries,
                       const int32_t* selected, const float* sinks, float* out, float* workspace,
                       cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  if (AttentionSplits(s, b.num_tokens) > 1 && workspace == nullptr) {
    return absl::InvalidArgumentError("attention: split-KV needs a workspace");
  }
  const int heads_per_block = HeadsPerBlock(s.heads);
  if (s.heads < 1) return absl::InvalidArgumentError("attention: no heads");
  if (AttentionUsesTensorCores(s)) {
#define DSV4_ATTN_TC(D)                                                                           \
  if (s.dim == D) {                                                                               \
    return TcHeadsPerBlock(s, b.num_tokens) == kTcHeads                                           \
               ? LaunchTc<kTcHeads, D>(s, b, q, kv, ring, entries, selected, sinks, out,          \
                                       workspace, stream)                                         \
               : LaunchTc<16, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace,     \
                                 stream);                                                         \
  }
    DSV4_ATTN_TC(128)
    DSV4_ATTN_TC(256)
    DSV4_ATTN_TC(512)
#undef DSV4_ATTN_TC
  }
#define DSV4_ATTN_DIM(D)                                                                          \
  if (s.dim == D) {                                                                               \
    switch (heads_per_block) {                                                                    \
      case 8: return Launch<8, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace, stream); \
      case 4: return Launch<4, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace, stream); \
      case 2: return Launch<2, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace, stream); \
      default: return Launch<1, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace, stream); \
    }                                                                                             \
  }
  DSV4_ATTN_DIM(32)
  DSV4_ATTN_DIM(64)
  DSV4_ATTN_DIM(128)
  DSV4_ATTN_DIM(256)
  DSV4_ATTN_DIM(512)
#undef DSV4_ATTN_DIM
  return absl::UnimplementedError(
      absl::StrCat("attention: head_dim = ", s.dim, " is not compiled (32, 64, 128, 256, 512)"));
}

}  // namespace dsv4::cuda
