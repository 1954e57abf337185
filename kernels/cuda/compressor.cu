#include "kernels/cuda/compressor.h"

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t StateFloats(const CompressorDims& s) {
  return 2 * s.ratio * s.overlap * s.dim + (s.overlap == 2 ? 2 * s.ratio * s.dim : 0);
}

// One block per token; tokens whose position closes a window build that window's entry. State is
// read as it was at the start of the step (the update kernel runs afterwards).
__global__ void EntryKernel(CompressorDims s, RaggedBatchView b, const float* a, const float* z,
                            const float* bias, const float* norm_w, const float* inv_freq,
                            const float* state, float* entries) {
  PdlTrigger();
  PdlWait();
  extern __shared__ float entry[];  // [d]
  __shared__ double dscratch[32];
  const int32_t t = blockIdx.x;
  const int64_t m = s.ratio, d = s.dim, cd = s.overlap * d;
  const int64_t pos = b.positions[t];
  if ((pos + 1) % m != 0) return;
  const int64_t w = pos / m;
  const int32_t seq = b.token_seq[t];
  if (b.state_slot[seq] < 0) return;  // padding of a graph step: no entry, no state
  const int64_t start = b.seq_start_pos[seq];
  const int64_t row0 = b.seq_begin[seq];
  const int64_t open = start / m;  // window open when the step began
  const float* st = state + static_cast<int64_t>(b.state_slot[seq]) * StateFloats(s);
  const float* open_a = st;
  const float* open_z = st + m * cd;
  const float* prev_a = st + 2 * m * cd;
  const float* prev_zb = prev_a + m * d;
  double sumsq = 0;
  const int64_t slots = s.overlap * m;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    // Slot k's (logit, value): k < m are the previous window's first halves (CSA), the rest this
    // window's own columns. Evaluated twice (max, then the weighted sum) instead of stored.
    auto slot = [&](int64_t k, float* logit, float* value) {
      if (s.overlap == 2 && k < m) {
        const int64_t j = k, tp = (w - 1) * m + j;
        if (w == 0) {
          *logit = -INFINITY;
          *value = 0.0f;
        } else if (tp >= start) {
          const int64_t r = row0 + (tp - start);
          *logit = z[r * cd + i] + bias[j * cd + i];
          *value = a[r * cd + i];
        } else if (w - 1 == open) {
          *logit = open_z[j * cd + i] + bias[j * cd + i];
          *value = open_a[j * cd + i];
        } else {
          *logit = prev_zb[j * d + i];
          *value = prev_a[j * d + i];
        }
        return;
      }
      const int64_t j = s.overlap == 2 ? k - m : k;
      const int64_t col = (s.overlap == 2 ? d : 0) + i;
      const int64_t tp = w * m + j;
      if (tp >= start) {
        const int64_t r = row0 + (tp - start);
        *logit = z[r * cd + col] + bias[j * cd + col];
        *value = a[r * cd + col];
      } else {
        *logit = open_z[j * cd + col] + bias[j * cd + col];
        *value = open_a[j * cd + col];
      }
    };
    float mx = -INFINITY;
    for (int64_t k = 0; k < slots; ++k) {
      float l, v;
      slot(k, &l, &v);
      mx = fmaxf(mx, l);
    }
    float sum = 0;
    for (int64_t k = 0; k < slots; ++k) {
      float l, v;
      slot(k, &l, &v);
      sum += expf(l - mx);
    }
    float acc = 0;
    for (int64_t k = 0; k < slots; ++k) {
      float l, v;
      slot(k, &l, &v);
      acc += (expf(l - mx) / sum) * v;
    }
    entry[i] = acc;
    sumsq += static_cast<double>(acc) * acc;
  }
  sumsq = BlockSumD(sumsq, dscratch);
  const float inv = 1.0f / sqrtf(static_cast<float>(sumsq / static_cast<double>(d)) + s.norm_eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) entry[i] = norm_w[i] * (entry[i] * inv);
  __syncthreads();
  // RoPE at the window's first position.
  const float p = static_cast<float>(w * m);
  float* r = entry + (d - s.rope_dims);
  for (int64_t q = threadIdx.x; q < s.rope_dims / 2; q += blockDim.x) {
    double sd, cdd;
    sincos(static_cast<double>(p * inv_freq[q]), &sd, &cdd);
    const float c = static_cast<float>(cdd), sn = static_cast<float>(sd);
    const float x0 = r[2 * q], x1 = r[2 * q + 1];
    r[2 * q] = x0 * c - x1 * sn;
    r[2 * q + 1] = x1 * c + x0 * sn;
  }
  __syncthreads();
  float* dst = entries + EntryRow(b, seq, w, m) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[i] = entry[i];
}

// One block per sequence: the previous-window first halves (CSA), then the raw rows.
__global__ void StateKernel(CompressorDims s, RaggedBatchView b, const float* a, const float* z,
                            const float* bias, float* state) {
  PdlTrigger();
  PdlWait();
  const int32_t seq = blockIdx.x;
  if (b.state_slot[seq] < 0) return;  // padding of a graph step
  const int64_t m = s.ratio, d = s.dim, cd = s.overlap * d;
  const int64_t start = b.seq_start_pos[seq];
  const int64_t n = b.seq_begin[seq + 1] - b.seq_begin[seq];
  const int64_t end = start + n;
  const int64_t row0 = b.seq_begin[seq];
  const int64_t open = start / m, open_end = end / m;
  float* st = state + static_cast<int64_t>(b.state_slot[seq]) * StateFloats(s);
  float* open_a = st;
  float* open_z = st + m * cd;
  float* prev_a = st + 2 * m * cd;
  float* prev_zb = prev_a + m * d;
  if (s.overlap == 2 && open_end > open) {
    const int64_t w = open_end - 1;  // the last window closed in this step
    for (int64_t idx = threadIdx.x; idx < m * d; idx += blockDim.x) {
      const int64_t j = idx / d, i = idx % d;
      const int64_t tp = w * m + j;
      float av, zv;
      if (tp >= start) {
        const int64_t r = row0 + (tp - start);
        av = a[r * cd + i];
        zv = z[r * cd + i];
      } else {
        av = open_a[j * cd + i];
        zv = open_z[j * cd + i];
      }
      prev_a[j * d + i] = av;
      prev_zb[j * d + i] = zv + bias[j * cd + i];
    }
  }
  __syncthreads();
  // Raw rows of the last m tokens (rows pos % m are distinct among them): the open window's, plus
  // the rows of the closed window that the reference, writing in order, also leaves behind.
  const int64_t first = max(end - m, start);
  for (int64_t idx = threadIdx.x; idx < (end - first) * cd; idx += blockDim.x) {
    const int64_t tp = first + idx / cd, col = idx % cd;
    const int64_t r = row0 + (tp - start);
    const int64_t j = tp % m;
    open_a[j * cd + col] = a[r * cd + col];
    open_z[j * cd + col] = z[r * cd + col];
  }
}

}  // namespace

absl::Status Compress(const CompressorDims& s, const RaggedBatchView& b, const float* a,
                      const float* z, const float* bias, const float* norm_w, const float* inv_freq,
                      float* state, float* entries, cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  const size_t smem = sizeof(float) * static_cast<size_t>(s.dim);
  CUDA_RETURN_IF_ERROR(LaunchPdl(EntryKernel, dim3(static_cast<unsigned>(b.num_tokens)),
                                 dim3(kThreads), smem, stream, s, b, a, z, bias, norm_w, inv_freq,
                                 state, entries));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  CUDA_RETURN_IF_ERROR(LaunchPdl(StateKernel, dim3(static_cast<unsigned>(b.num_seqs)),
                                 dim3(kThreads), 0, stream, s, b, a, z, bias, state));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
