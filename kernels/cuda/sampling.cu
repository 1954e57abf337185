#include "kernels/cuda/sampling.h"

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ double Gumbel(uint64_t seed, uint64_t step, int64_t i) {
  return -log(-log(CounterUniform(seed, SamplingCounter(step, i))));
}

__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct ArgMax {
  double v;
  int32_t i;
};

// Block-wide argmax (ties to the lower index).
__device__ ArgMax BlockArgMax(ArgMax a, double* sv, int32_t* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(0xffffffffu, a.v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, a.i, o);
    if (ov > a.v || (ov == a.v && oi < a.i)) a = {ov, oi};
  }
  __syncthreads();
  if (lane == 0) {
    sv[warp] = a.v;
    si[warp] = a.i;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    a = lane < warps ? ArgMax{sv[lane], si[lane]} : ArgMax{-INFINITY, INT32_MAX};
    for (int o = 16; o > 0; o >>= 1) {
      const double ov = __shfl_xor_sync(0xffffffffu, a.v, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, a.i, o);
      if (ov > a.v || (ov == a.v && oi < a.i)) a = {ov, oi};
    }
    if (lane == 0) {
      sv[0] = a.v;
      si[0] = a.i;
    }
  }
  __syncthreads();
  ArgMax r{sv[0], si[0]};
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(const float* logits, int64_t vocab,
                                                         const SampleRow* params,
                                                         const int32_t* mask_ids,
                                                         const int32_t* seen,
                                                         const int32_t* output, float* work,
                                                         SampleOut* out) {
  __shared__ double sv[32];
  __shared__ int32_t si[32];
  __shared__ double sd[32];
  __shared__ float sf[32];
  const int64_t row = blockIdx.x;
  const SampleRow p = params[row];
  const float* raw = logits + row * vocab;
  float* l = work + row * vocab;
  SampleOut* o = out + row;

  // Raw log-probabilities first (before penalties change the row).
  double lse = 0;
  if (p.logprobs > 0) {
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, raw[i]);
    mx = BlockMax(mx, sf);
    double sum = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += exp(static_cast<double>(raw[i]) - mx);
    sum = BlockSumD(sum, sd);
    lse = mx + log(sum);
    // Top-n by repeated argmax, excluding earlier picks.
    for (int n = 0; n < p.logprobs && n < kMaxLogprobs; ++n) {
      ArgMax a{-INFINITY, INT32_MAX};
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        bool taken = false;
        for (int k = 0; k < n; ++k) taken |= o->top_ids[k] == i;
        if (!taken && (raw[i] > a.v || (raw[i] == a.v && i < a.i))) a = {raw[i], static_cast<int32_t>(i)};
      }
      a = BlockArgMax(a, sv, si);
      if (threadIdx.x == 0) {
        o->top_ids[n] = a.i;
        o->top_logprobs[n] = static_cast<float>(raw[a.i] - lse);
      }
      __syncthreads();
    }
  }
  // The working row: penalties, then the min-tokens mask.
  const bool penalize = p.counts_row >= 0 && (p.repetition_penalty != 1.0f ||
                                              p.presence_penalty != 0.0f ||
                                              p.frequency_penalty != 0.0f);
  const int32_t* sr = penalize ? seen + static_cast<int64_t>(p.counts_row) * vocab : nullptr;
  const int32_t* orow = penalize ? output + static_cast<int64_t>(p.counts_row) * vocab : nullptr;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = raw[i];
    if (penalize) {
      if (p.repetition_penalty != 1.0f && sr[i] > 0) {
        v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
      }
      const int32_t c = orow[i];
      if (c > 0) v -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    }
    l[i] = v;
  }
  __syncthreads();
  if (p.output_index < p.min_tokens) {
    for (int k = threadIdx.x; k < p.mask_count; k += blockDim.x) {
      const int32_t id = mask_ids[p.mask_offset + k];
      if (id >= 0 && id < vocab) l[id] = -INFINITY;
    }
    __syncthreads();
  }
  int32_t token;
  if (p.temperature <= 0.0f || p.top_k == 1) {
    ArgMax a{-INFINITY, INT32_MAX};
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (l[i] > a.v || (l[i] == a.v && i < a.i)) a = {l[i], static_cast<int32_t>(i)};
    }
    token = BlockArgMax(a, sv, si).i;
    if (token == INT32_MAX) token = 0;  // an all-NaN row: still a valid id
  } else {
    const float inv_t = p.temperature;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, l[i] / inv_t);
    mx = BlockMax(mx, sf);
    // Candidate floor as an order key: top-k (k-th largest), then min-p, then top-p.
    uint32_t floor_key = 0;
    if (p.top_k > 0 && p.top_k < vocab) {
      // Largest key K with count(key >= K) >= k: bisect the 32 key bits from the top.
      uint32_t key = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = key | (1u << bit);
        float cnt = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) cnt += OrderKey(l[i] / inv_t) >= cand ? 1.0f : 0.0f;
        cnt = BlockSum(cnt, sf);
        if (cnt >= static_cast<float>(p.top_k)) key = cand;
      }
      floor_key = key;
    }
    if (p.min_p > 0.0f) {
      const uint32_t k = OrderKey(mx + logf(p.min_p));
      floor_key = max(floor_key, k);
    }
    if (p.top_p < 1.0f) {
      // Mass over the candidates above floor_key, then the largest key whose top set reaches top_p.
      double z = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float s = l[i] / inv_t;
        if (s > -INFINITY && OrderKey(s) >= floor_key) z += exp(static_cast<double>(s) - mx);
      }
      z = BlockSumD(z, sd);
      // Largest key K whose candidates {key >= max(K, floor)} hold at least top_p of the mass
      // (mass is non-increasing in K): that is the key of the smallest value of the top set.
      uint32_t key = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = key | (1u << bit);
        const uint32_t lo = max(cand, floor_key);
        double mass = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
          const float s = l[i] / inv_t;
          if (s > -INFINITY && OrderKey(s) >= lo) mass += exp(static_cast<double>(s) - mx);
        }
        mass = BlockSumD(mass, sd);
        if (mass / z >= p.top_p) key = cand;
      }
      floor_key = max(floor_key, key);
    }
    ArgMax a{-INFINITY, INT32_MAX};
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float s = l[i] / inv_t;
      if (!(s > -INFINITY) || OrderKey(s) < floor_key) continue;
      const double score = static_cast<double>(s) + Gumbel(p.seed, static_cast<uint64_t>(p.output_index), i);
      if (score > a.v || (score == a.v && i < a.i)) a = {score, static_cast<int32_t>(i)};
    }
    a = BlockArgMax(a, sv, si);
    token = a.i == INT32_MAX ? 0 : a.i;
  }
  if (threadIdx.x == 0) {
    o->token = token;
    o->logprob = p.logprobs > 0 ? static_cast<float>(raw[token] - lse) : 0.0f;
  }
}

__global__ void ResetCountsKernel(const int32_t* rows, int64_t vocab, int32_t* seen, int32_t* output) {
  const int32_t r = rows[blockIdx.y];
  if (r < 0) return;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < vocab;
       i += int64_t{gridDim.x} * blockDim.x) {
    seen[static_cast<int64_t>(r) * vocab + i] = 0;
    output[static_cast<int64_t>(r) * vocab + i] = 0;
  }
}

__global__ void AddCountsKernel(const int32_t* rows, const int32_t* tokens, const uint8_t* is_output,
                                int64_t n, int64_t vocab, int32_t* seen, int32_t* output) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int32_t r = rows[t];
    if (r < 0) continue;
    atomicAdd(&seen[static_cast<int64_t>(r) * vocab + tokens[t]], 1);
    if (is_output[t]) atomicAdd(&output[static_cast<int64_t>(r) * vocab + tokens[t]], 1);
  }
}

}  // namespace

absl::Status Sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params,
                    const int32_t* mask_ids, const int32_t* seen_counts,
                    const int32_t* output_counts, float* work, SampleOut* out,
                    cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  SampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, vocab, params, mask_ids, seen_counts, output_counts, work, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status UpdateCounts(const int32_t* reset_rows, int64_t n_reset, const int32_t* rows,
                          const int32_t* tokens, const uint8_t* is_output, int64_t n_tokens,
                          int64_t vocab, int32_t* seen_counts, int32_t* output_counts,
                          cudaStream_t stream) {
  if (n_reset > 0) {
    ResetCountsKernel<<<dim3(static_cast<unsigned>(std::min<int64_t>((vocab + 255) / 256, 512)),
                             static_cast<unsigned>(n_reset)),
                        256, 0, stream>>>(reset_rows, vocab, seen_counts, output_counts);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  if (n_tokens > 0) {
    AddCountsKernel<<<static_cast<unsigned>((n_tokens + 255) / 256), 256, 0, stream>>>(
        rows, tokens, is_output, n_tokens, vocab, seen_counts, output_counts);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
