#include "kernels/cuda/attention.h"

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 16;  // keys staged per iteration

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
template <int kHeads, int kDim>
__global__ void __launch_bounds__(kThreads) AttentionKernel(AttentionDims s, RaggedBatchView b,
                                                            const float* q, const float* kv,
                                                            const float* ring, const float* entries,
                                                            const int32_t* selected,
                                                            const float* sinks, float* out) {
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
        int32_t n = 0;
        while (n < s.topk && sel[n] >= 0 && sel[n] < visible) ++n;
        s_compact[0] = n;
      }
      __syncthreads();
      keys.sel = sel;
      keys.n_comp = s_compact[0];
    }
  }
  const int64_t total = keys.n_window + keys.n_comp;

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
  for (int64_t base = 0; base < total; base += kChunk) {
    const int n = total - base < kChunk ? static_cast<int>(total - base) : kChunk;
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
#pragma unroll 8
      for (int d = 0; d < kScoreDims; ++d) score += qh[d] * kk[d];
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
  // The sink joins the softmax without a value.
  const float sink = sinks[h0 + hl];
  const float m_fin = fmaxf(m_run, sink);
  const float denom = l_run * expf(m_run - m_fin) + expf(sink - m_fin);
  const float rescale = expf(m_run - m_fin) / denom;
  float* o = out + (static_cast<int64_t>(t) * s.heads + h0 + hl) * kDim + ht * kDimsPerThread;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) o[i] = total > 0 ? acc[i] * rescale : 0.0f;
}

template <int kHeads, int kDim>
absl::Status Launch(const AttentionDims& s, const RaggedBatchView& b, const float* q,
                    const float* kv, const float* ring, const float* entries,
                    const int32_t* selected, const float* sinks, float* out, cudaStream_t stream) {
  const size_t smem =
      sizeof(float) * (kHeads * kDim + kChunk * (kDim + 1) + kHeads * kChunk);
  auto kernel = AttentionKernel<kHeads, kDim>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(b.num_tokens), static_cast<unsigned>(s.heads / kHeads));
  kernel<<<grid, kThreads, smem, stream>>>(s, b, q, kv, ring, entries, selected, sinks, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status Attention(const AttentionDims& s, const RaggedBatchView& b, const float* q,
                       const float* kv, const float* ring, const float* entries,
                       const int32_t* selected, const float* sinks, float* out,
                       cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  const int heads_per_block = s.heads % 8 == 0 ? 8 : s.heads % 4 == 0 ? 4 : 0;
  if (heads_per_block == 0) {
    return absl::UnimplementedError(
        absl::StrCat("attention: num_attention_heads = ", s.heads, " must be a multiple of 4"));
  }
#define DSV4_ATTN_DIM(D)                                                                          \
  if (s.dim == D) {                                                                               \
    return heads_per_block == 8                                                                   \
               ? Launch<8, D>(s, b, q, kv, ring, entries, selected, sinks, out, stream)          \
               : Launch<4, D>(s, b, q, kv, ring, entries, selected, sinks, out, stream);         \
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
