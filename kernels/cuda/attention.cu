#include "kernels/cuda/attention.h"

#include <algorithm>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

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
  constexpr int kThreadsPerHead = kThreads / kHeads;         // 16 .. 128
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
  if (s.ratio > 0) {
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

  for (int64_t i = tid; i < kHeads * kDim; i += kThreads) {
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
    for (int i = tid; i < n * (kDim / 4); i += kThreads) {
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

// Merges the splits of (token, head) = (blockIdx.x, blockIdx.y) with the sink.
__global__ void CombineKernel(int64_t heads, int64_t dim, int splits, const float* part,
                              const float* sinks, float* out) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float* pp = part + (t * heads + h) * splits * (dim + 2);
  const float sink = sinks[h];
  float m = sink;
  for (int z = 0; z < splits; ++z) m = fmaxf(m, pp[z * (dim + 2) + dim]);
  float denom = expf(sink - m);
  for (int z = 0; z < splits; ++z) {
    const float mz = pp[z * (dim + 2) + dim];
    if (mz > -INFINITY) denom += pp[z * (dim + 2) + dim + 1] * expf(mz - m);
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int z = 0; z < splits; ++z) {
      const float mz = pp[z * (dim + 2) + dim];
      if (mz > -INFINITY) acc += pp[z * (dim + 2) + i] * expf(mz - m);
    }
    out[(t * heads + h) * dim + i] = acc / denom;
  }
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
  kernel<<<grid, kThreads, smem, stream>>>(s, b, q, kv, ring, entries, selected, sinks, out,
                                           split_len, splits > 1 ? workspace : nullptr);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  if (splits > 1) {
    CombineKernel<<<dim3(static_cast<unsigned>(b.num_tokens), static_cast<unsigned>(s.heads)), 128, 0,
                    stream>>>(s.heads, kDim, splits, workspace, sinks, out);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  return absl::OkStatus();
}

}  // namespace

int AttentionSplits(const AttentionDims& s, int64_t tokens) {
  const int heads_per_block = s.heads % 8 == 0 ? 8 : 4;
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
  const int heads_per_block = s.heads % 8 == 0 ? 8 : s.heads % 4 == 0 ? 4 : 0;
  if (heads_per_block == 0) {
    return absl::UnimplementedError(
        absl::StrCat("attention: num_attention_heads = ", s.heads, " must be a multiple of 4"));
  }
#define DSV4_ATTN_DIM(D)                                                                          \
  if (s.dim == D) {                                                                               \
    return heads_per_block == 8                                                                   \
               ? Launch<8, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace, stream)          \
               : Launch<4, D>(s, b, q, kv, ring, entries, selected, sinks, out, workspace, stream);         \
  }
  DSV4_ATTN_DIM(64)
  DSV4_ATTN_DIM(128)
  DSV4_ATTN_DIM(256)
  DSV4_ATTN_DIM(512)
#undef DSV4_ATTN_DIM
  return absl::UnimplementedError(
      absl::StrCat("attention: head_dim = ", s.dim, " is not compiled (64, 128, 256, 512)"));
}

}  // namespace dsv4::cuda
