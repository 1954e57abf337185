#include "kernels/cuda/indexer.h"

#include <cub/block/block_scan.cuh>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kScoreThreads = 128;
constexpr int kSelectThreads = 1024;

// Padding rows of a graph step (state slot -1) see no entries.
__device__ __forceinline__ int64_t Visible(const RaggedBatchView& b, int32_t t, int64_t ratio) {
  if (b.state_slot[b.token_seq[t]] < 0) return 0;
  return (static_cast<int64_t>(b.positions[t]) + 1) / ratio;
}

__global__ void SelectAllKernel(IndexerDims s, RaggedBatchView b, int32_t* out) {
  const int32_t t = blockIdx.x;
  const int64_t v = Visible(b, t, s.ratio);
  for (int64_t k = threadIdx.x; k < s.topk; k += blockDim.x) {
    out[t * s.topk + k] = k < v ? static_cast<int32_t>(k) : -1;
  }
}

template <int kHeads>
__global__ void ScoreKernel(IndexerDims s, RaggedBatchView b, const float* q, const float* w,
                            const float* keys, int64_t max_visible, float* scores) {
  extern __shared__ float sq[];  // [kHeads, dim]
  __shared__ float sw[kHeads];
  const int32_t t = blockIdx.y;
  const int64_t v = Visible(b, t, s.ratio);
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (static_cast<int64_t>(blockIdx.x) * blockDim.x >= v) return;
  const int64_t dim = s.dim;
  for (int64_t i = threadIdx.x; i < kHeads * dim; i += blockDim.x) sq[i] = q[t * kHeads * dim + i];
  if (threadIdx.x < kHeads) sw[threadIdx.x] = w[t * kHeads + threadIdx.x] * s.weight_scale;
  __syncthreads();
  if (e >= v) return;
  const float* k = keys + EntryRow(b, b.token_seq[t], e, s.ratio) * dim;
  float dot[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) dot[h] = 0.0f;
  for (int64_t d0 = 0; d0 < dim; d0 += 4) {
    const float4 kv = *reinterpret_cast<const float4*>(k + d0);
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float* qh = sq + h * dim + d0;
      dot[h] += qh[0] * kv.x + qh[1] * kv.y + qh[2] * kv.z + qh[3] * kv.w;
    }
  }
  float score = 0;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) score += sw[h] * (fmaxf(dot[h], 0.0f) * s.score_scale);
  scores[t * max_visible + e] = score;
}

__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void SelectKernel(IndexerDims s, RaggedBatchView b, const float* scores,
                             int64_t max_visible, int32_t* out) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining;
  __shared__ int s_base, s_ties;
  const int32_t t = blockIdx.x;
  const int64_t v = Visible(b, t, s.ratio);
  int32_t* o = out + t * s.topk;
  const int64_t k = v < s.topk ? v : s.topk;
  for (int64_t i = threadIdx.x; i < s.topk; i += blockDim.x) o[i] = i < (v <= s.topk && !b.force_indexer_scoring ? v : 0) ? static_cast<int32_t>(i) : -1;
  if (v <= s.topk && !b.force_indexer_scoring) return;
  __syncthreads();
  const float* sc = scores + t * max_visible;
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = static_cast<int>(k);
  }
  __syncthreads();
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      const uint32_t key = OrderKey(sc[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0;
      int bin = 255;
      for (; bin > 0; --bin) {
        if (cum + hist[bin] >= s_remaining) break;
        cum += hist[bin];
      }
      s_remaining -= cum;
      s_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
      s_mask = mask | (0xffu << shift);
    }
    __syncthreads();
  }
  // Threshold key; take every entry above it and the `need` lowest-index ties, in index order.
  const uint32_t threshold = s_prefix;
  const int need = s_remaining;
  if (threadIdx.x == 0) {
    s_base = 0;
    s_ties = 0;
  }
  __syncthreads();
  for (int64_t c = 0; c < v; c += blockDim.x) {
    const int64_t i = c + threadIdx.x;
    const uint32_t key = i < v ? OrderKey(sc[i]) : 0;
    const int tie = (i < v && key == threshold) ? 1 : 0;
    int tie_rank, ties_in_chunk;
    Scan(scan).ExclusiveSum(tie, tie_rank, ties_in_chunk);
    __syncthreads();
    const int take = (i < v && (key > threshold || (tie && s_ties + tie_rank < need))) ? 1 : 0;
    int rank, taken;
    Scan(scan).ExclusiveSum(take, rank, taken);
    if (take) o[s_base + rank] = static_cast<int32_t>(i);
    __syncthreads();
    if (threadIdx.x == 0) {
      s_base += taken;
      s_ties += ties_in_chunk;
    }
    __syncthreads();
  }
}

}  // namespace

absl::Status IndexerSelectAll(const IndexerDims& s, const RaggedBatchView& b, int32_t* out,
                              cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  SelectAllKernel<<<b.num_tokens, 256, 0, stream>>>(s, b, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status IndexerTopK(const IndexerDims& s, const RaggedBatchView& b, const float* q,
                         const float* w, const float* keys, int64_t max_visible, float* scores,
                         int32_t* out, cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  if (s.dim % 4 != 0) return absl::UnimplementedError("index_head_dim must be a multiple of 4");
  if (max_visible > 0) {
    const dim3 grid(static_cast<unsigned>((max_visible + kScoreThreads - 1) / kScoreThreads),
                    static_cast<unsigned>(b.num_tokens));
    const size_t smem = sizeof(float) * static_cast<size_t>(s.heads * s.dim);
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
    kernel<<<grid, kScoreThreads, smem, stream>>>(s, b, q, w, keys, max_visible, scores);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  SelectKernel<<<b.num_tokens, kSelectThreads, 0, stream>>>(s, b, scores, max_visible, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
