#include "kernels/cuda/sampling.h"

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 1024;

// The top entries past the requested count get id -1 and log-probability 0, so every byte of a
// result is written (the whole record is copied back to the host).
__device__ __forceinline__ void ClearUnusedTops(SampleOut* o, int from) {
  for (int n = from < 0 ? 0 : from; n < kMaxLogprobs; ++n) {
    o->top_ids[n] = -1;
    o->top_logprobs[n] = 0.0f;
  }
}

// Whether a row's logits were broken (NaN or Inf), from what sampling already has: the chosen
// token's raw logit (+Inf wins every draw; a row of NaN leaves no candidate and token 0) and,
// when log-probabilities were computed, the row's log-sum-exp (NaN if any logit is NaN). O(1)
// per row: a full scan of the row cost 0.7 % of a batch-256 step.
__device__ __forceinline__ int32_t NonFinite(float chosen, double lse) {
  return isfinite(chosen) && isfinite(lse) ? 0 : 1;
}

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

// Single-block sampling of one row into its working row `l`: penalties, the min-tokens mask,
// then greedy or top-k / min-p / top-p with Gumbel-max draws. Returns the token to every thread.
// The single-block kernel below uses it for every row, the split path for rows with filters.
__device__ int32_t GeneralToken(const SampleRow& p, const float* raw, int64_t vocab,
                                const int32_t* mask_ids, const int32_t* seen,
                                const int32_t* output, float* l, double* sv, int32_t* si,
                                double* sd, float* sf) {
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
  return token;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* logits, int64_t vocab, const SampleRow* params,
                 const int32_t* mask_ids, const int32_t* seen, const int32_t* output, float* work,
                 SampleOut* out, int32_t* slot_tokens) {
  PdlTrigger();
  PdlWait();
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
  const int32_t token = GeneralToken(p, raw, vocab, mask_ids, seen, output, l, sv, si, sd, sf);
  if (threadIdx.x == 0) {
    o->token = token;
    o->logprob = p.logprobs > 0 ? static_cast<float>(raw[token] - lse) : 0.0f;
    o->nonfinite = NonFinite(raw[token], p.logprobs > 0 ? lse : 0.0);
    ClearUnusedTops(o, p.logprobs);
    if (slot_tokens != nullptr && p.slot >= 0) slot_tokens[p.slot] = token;
  }
}

// ---------------------------------------------------------------------------------------------
// Split path: kPartThreads-thread CTAs, each owning a kSlice-wide vocab slice of one row, write a
// Part record (token candidate, max / sum-exp of the raw row, sorted top-n of the raw row) into
// the row's `work` area; FinishKernel (one block per row) combines them in a fixed order. Every
// argmax here uses the total order (value desc, index asc) over non-NaN values, which is
// associative and commutative, so the split gives exactly the single-block answer.
// Rows whose sampling needs top-k / min-p / top-p run the single-block code in FinishKernel.
// ---------------------------------------------------------------------------------------------
constexpr int kPartThreads = 256;
constexpr int kPerThread = 16;
constexpr int kSlice = kPartThreads * kPerThread;  // 4096
constexpr int kPartWarps = kPartThreads / 32;
constexpr int kMaxSlices = 64;                     // FinishKernel: <= 2 slices per lane
constexpr int kSlicesPerLane = kMaxSlices / 32;

struct alignas(16) Part {
  double tok_v;   // best token score of the slice (greedy: the working value; else s + Gumbel)
  double sum;     // sum over the slice of exp(raw - mx)
  float mx;       // max of the slice's raw values
  int32_t tok_i;  // its id (INT32_MAX: none)
  int32_t pad[2];
  float top_v[kMaxLogprobs];    // slice top-n of raw, sorted (value desc, index asc)
  int32_t top_i[kMaxLogprobs];  // INT32_MAX pads
};

__device__ __forceinline__ bool Better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}
__device__ __forceinline__ bool BetterD(double v, int32_t i, double bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ Part* RowParts(float* work, int64_t row, int64_t vocab) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(work + row * vocab);
  return reinterpret_cast<Part*>((b + 15) & ~uintptr_t{15});
}

__device__ __forceinline__ bool IsGreedy(const SampleRow& p) {
  return p.temperature <= 0.0f || p.top_k == 1;
}
// Temperature sampling with no candidate filter: floor_key stays 0 in the single-block code.
__device__ __forceinline__ bool IsPlainTemp(const SampleRow& p, int64_t vocab) {
  return !IsGreedy(p) && !(p.top_k > 0 && p.top_k < vocab) && !(p.min_p > 0.0f) &&
         !(p.top_p < 1.0f);
}
__device__ __forceinline__ bool Penalize(const SampleRow& p) {
  return p.counts_row >= 0 && (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
                               p.frequency_penalty != 0.0f);
}

// Warp argmax over (double value, index); every lane gets the result.
__device__ __forceinline__ void WarpArgMaxD(double& v, int32_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (BetterD(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}
__device__ __forceinline__ void WarpArgMaxF(float& v, int32_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (Better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__global__ void __launch_bounds__(kPartThreads) SamplePartialKernel(
    const float* logits, int64_t vocab, const SampleRow* params, const int32_t* mask_ids,
    const int32_t* seen, const int32_t* output, float* work) {
  PdlTrigger();
  PdlWait();
  __shared__ uint32_t smask[kSlice / 32];
  __shared__ float sf[kPartWarps];
  __shared__ double sd[kPartWarps];
  __shared__ int32_t si[kPartWarps];
  __shared__ float stv[kPartWarps][kMaxLogprobs];
  __shared__ int32_t sti[kPartWarps][kMaxLogprobs];
  const int64_t row = blockIdx.y;
  const int slice = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const SampleRow p = params[row];
  const float* raw = logits + row * vocab;
  const int64_t lo = static_cast<int64_t>(slice) * kSlice;
  const int n = static_cast<int>(vocab - lo < kSlice ? vocab - lo : int64_t{kSlice});
  Part* part = RowParts(work, row, vocab) + slice;

  float x[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int off = tid + k * kPartThreads;
    x[k] = off < n ? raw[lo + off] : NAN;  // NaN: never a candidate, skipped by fmaxf
  }

  const int nlp = min(p.logprobs, kMaxLogprobs);
  if (nlp > 0) {
    // Slice max / sum of exp of the raw row.
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) mx = fmaxf(mx, x[k]);
    mx = WarpMax(mx);
    if (lane == 0) sf[warp] = mx;
    __syncthreads();
    mx = sf[0];
#pragma unroll
    for (int w = 1; w < kPartWarps; ++w) mx = fmaxf(mx, sf[w]);
    double sum = 0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int off = tid + k * kPartThreads;
      // -inf adds 0 (also when the slice max is -inf); a NaN in the row makes the sum NaN.
      if (off < n && x[k] != -INFINITY) sum += exp(static_cast<double>(x[k]) - mx);
    }
    sum = WarpSumD(sum);
    if (lane == 0) sd[warp] = sum;
    __syncthreads();
    if (tid == 0) {
      double t = 0;
#pragma unroll
      for (int w = 0; w < kPartWarps; ++w) t += sd[w];
      part->sum = t;
      part->mx = mx;
    }
    // Per warp: sorted top-nlp of its elements by repeated extraction.
    uint32_t taken = 0;
    for (int r = 0; r < nlp; ++r) {
      float bv = -INFINITY;
      int32_t bi = INT32_MAX;
      int bk = -1;
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int32_t i = static_cast<int32_t>(lo + tid + k * kPartThreads);
        if (!((taken >> k) & 1u) && Better(x[k], i, bv, bi)) {
          bv = x[k];
          bi = i;
          bk = k;
        }
      }
      float wv = bv;
      int32_t wi = bi;
      WarpArgMaxF(wv, wi);
      if (bk >= 0 && bi == wi) taken |= 1u << bk;  // ids are unique: exactly one owner
      if (lane == 0) {
        stv[warp][r] = wv;
        sti[warp][r] = wi;
      }
    }
    __syncthreads();
    // Warp 0 merges the kPartWarps sorted lists: lane w < kPartWarps holds list w's head.
    if (warp == 0) {
      int head = 0;
      for (int r = 0; r < nlp; ++r) {
        float v = -INFINITY;
        int32_t i = INT32_MAX;
        if (lane < kPartWarps && head < nlp) {
          v = stv[lane][head];
          i = sti[lane][head];
        }
        float wv = v;
        int32_t wi = i;
        WarpArgMaxF(wv, wi);
        if (lane < kPartWarps && head < nlp && i == wi && wi != INT32_MAX) ++head;
        if (lane == 0) {
          part->top_v[r] = wv;
          part->top_i[r] = wi;
        }
      }
    }
  }

  const bool greedy = IsGreedy(p);
  if (!greedy && !IsPlainTemp(p, vocab)) return;  // FinishKernel samples this row

  // Working value: penalties, then the min-tokens mask (as the single-block code).
  const bool masked = p.output_index < p.min_tokens && p.mask_count > 0;
  if (masked) {
    for (int w = tid; w < kSlice / 32; w += kPartThreads) smask[w] = 0;
    __syncthreads();
    for (int k = tid; k < p.mask_count; k += kPartThreads) {
      const int32_t id = mask_ids[p.mask_offset + k];
      if (id >= lo && id < lo + n) {
        const int off = static_cast<int>(id - lo);
        atomicOr(&smask[off >> 5], 1u << (off & 31));
      }
    }
    __syncthreads();
  }
  const bool penalize = Penalize(p);
  if (penalize) {
    const int32_t* sr = seen + static_cast<int64_t>(p.counts_row) * vocab + lo;
    const int32_t* orow = output + static_cast<int64_t>(p.counts_row) * vocab + lo;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int off = tid + k * kPartThreads;
      if (off < n) {
        float v = x[k];
        if (p.repetition_penalty != 1.0f && sr[off] > 0) {
          v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
        }
        const int32_t c = orow[off];
        if (c > 0) v -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
        x[k] = v;
      }
    }
  }
  if (masked) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int off = tid + k * kPartThreads;
      if (off < n && ((smask[off >> 5] >> (off & 31)) & 1u)) x[k] = -INFINITY;
    }
  }
  double bv = -INFINITY;
  int32_t bi = INT32_MAX;
  if (greedy) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int32_t i = static_cast<int32_t>(lo + tid + k * kPartThreads);
      const double v = x[k];  // NaN (also the padding past n) never wins
      if (BetterD(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
  } else {
    const float t = p.temperature;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int off = tid + k * kPartThreads;
      const float s = x[k] / t;
      if (off >= n || !(s > -INFINITY)) continue;
      const int64_t i = lo + off;
      const double score =
          static_cast<double>(s) + Gumbel(p.seed, static_cast<uint64_t>(p.output_index), i);
      if (BetterD(score, static_cast<int32_t>(i), bv, bi)) {
        bv = score;
        bi = static_cast<int32_t>(i);
      }
    }
  }
  WarpArgMaxD(bv, bi);
  if (lane == 0) {
    sd[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    double v = sd[0];
    int32_t i = si[0];
#pragma unroll
    for (int w = 1; w < kPartWarps; ++w) {
      if (BetterD(sd[w], si[w], v, i)) {
        v = sd[w];
        i = si[w];
      }
    }
    part->tok_v = v;
    part->tok_i = i;
  }
}

__global__ void __launch_bounds__(kThreads)
    SampleFinishKernel(const float* logits, int64_t vocab, int num_slices, const SampleRow* params,
                       const int32_t* mask_ids, const int32_t* seen, const int32_t* output,
                       float* work, SampleOut* out, int32_t* slot_tokens) {
  PdlTrigger();
  PdlWait();
  __shared__ double sv[32];
  __shared__ int32_t si[32];
  __shared__ double sd[32];
  __shared__ float sf[32];
  __shared__ double slse;
  __shared__ int32_t stoken;
  const int64_t row = blockIdx.x;
  const SampleRow p = params[row];
  const float* raw = logits + row * vocab;
  SampleOut* o = out + row;
  const Part* parts = RowParts(work, row, vocab);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nlp = min(p.logprobs, kMaxLogprobs);
  const bool split_token = IsGreedy(p) || IsPlainTemp(p, vocab);

  if (warp == 0 && nlp > 0) {
    // lse: max of the slice maxima, then the rescaled slice sums in a fixed order.
    float m = -INFINITY;
    for (int s = lane; s < num_slices; s += 32) m = fmaxf(m, parts[s].mx);
    m = WarpMax(m);
    double sum = 0;
    for (int s = lane; s < num_slices; s += 32) {
      const Part& q = parts[s];
      const double qs = q.sum;
      if (qs != 0.0 || qs != qs) sum += qs * exp(static_cast<double>(q.mx) - m);
    }
    sum = WarpSumD(sum);
    const double lse = m + log(sum);
    // Top-n: merge the sorted slice lists; lane holds the heads of slices lane, lane + 32.
    int head[kSlicesPerLane];
#pragma unroll
    for (int j = 0; j < kSlicesPerLane; ++j) head[j] = 0;
    for (int r = 0; r < nlp; ++r) {
      float bv = -INFINITY;
      int32_t bi = INT32_MAX;
      int bj = -1;
#pragma unroll
      for (int j = 0; j < kSlicesPerLane; ++j) {
        const int s = lane + 32 * j;
        if (s < num_slices && head[j] < nlp) {
          const float v = parts[s].top_v[head[j]];
          const int32_t i = parts[s].top_i[head[j]];
          if (Better(v, i, bv, bi)) {
            bv = v;
            bi = i;
            bj = j;
          }
        }
      }
      float wv = bv;
      int32_t wi = bi;
      WarpArgMaxF(wv, wi);
      if (bj >= 0 && bi == wi && wi != INT32_MAX) ++head[bj];
      if (lane == 0) {
        o->top_ids[r] = wi;
        o->top_logprobs[r] = static_cast<float>(wv - lse);
      }
    }
    if (lane == 0) slse = lse;
  }
  if (split_token && warp == 1) {
    double bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int s = lane; s < num_slices; s += 32) {
      const double v = parts[s].tok_v;
      const int32_t i = parts[s].tok_i;
      if (BetterD(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    WarpArgMaxD(bv, bi);
    if (lane == 0) stoken = bi == INT32_MAX ? 0 : bi;  // no candidate: still a valid id
  }
  __syncthreads();  // the Part records are consumed: the general path may reuse the row
  int32_t token;
  if (split_token) {
    token = stoken;
  } else {
    token = GeneralToken(p, raw, vocab, mask_ids, seen, output, work + row * vocab, sv, si, sd,
                         sf);
  }
  if (threadIdx.x == 0) {
    o->token = token;
    o->logprob = nlp > 0 ? static_cast<float>(raw[token] - slse) : 0.0f;
    o->nonfinite = NonFinite(raw[token], nlp > 0 ? slse : 0.0);
    ClearUnusedTops(o, nlp);
    if (slot_tokens != nullptr && p.slot >= 0) slot_tokens[p.slot] = token;
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

__global__ void AddCountsKernel(const int32_t* rows, const int32_t* tokens,
                                const uint8_t* is_output, int64_t n, int64_t vocab,
                                const int32_t* slot_tokens, int32_t* seen, int32_t* output) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int32_t r = rows[t];
    if (r < 0) continue;
    // A deferred token (< 0): the one last sampled into the row's slot.
    const int32_t tok = tokens[t] >= 0 ? tokens[t] : slot_tokens != nullptr ? slot_tokens[r] : -1;
    if (tok < 0 || tok >= vocab) continue;
    atomicAdd(&seen[static_cast<int64_t>(r) * vocab + tok], 1);
    if (is_output[t]) atomicAdd(&output[static_cast<int64_t>(r) * vocab + tok], 1);
  }
}

}  // namespace

absl::Status Sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params,
                    const int32_t* mask_ids, const int32_t* seen_counts,
                    const int32_t* output_counts, float* work, SampleOut* out, int32_t* slot_tokens,
                    cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int64_t slices = (vocab + kSlice - 1) / kSlice;
  const bool split = slices <= kMaxSlices && vocab <= INT32_MAX &&
                     slices * static_cast<int64_t>(sizeof(Part)) + 16 <=
                         vocab * static_cast<int64_t>(sizeof(float)) &&
                     rows <= 65535;
  if (!split) {
    CUDA_RETURN_IF_ERROR(LaunchPdl(SampleKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
                                   0, stream, logits, vocab, params, mask_ids, seen_counts,
                                   output_counts, work, out, slot_tokens));
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(LaunchPdl(SamplePartialKernel,
                                 dim3(static_cast<unsigned>(slices), static_cast<unsigned>(rows)),
                                 dim3(kPartThreads), 0, stream, logits, vocab, params, mask_ids,
                                 seen_counts, output_counts, work));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  CUDA_RETURN_IF_ERROR(LaunchPdl(SampleFinishKernel, dim3(static_cast<unsigned>(rows)),
                                 dim3(kThreads), 0, stream, logits, vocab, static_cast<int>(slices),
                                 params, mask_ids, seen_counts, output_counts, work, out,
                                 slot_tokens));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status UpdateCounts(const int32_t* reset_rows, int64_t n_reset, const int32_t* rows,
                          const int32_t* tokens, const uint8_t* is_output, int64_t n_tokens,
                          int64_t vocab, const int32_t* slot_tokens, int32_t* seen_counts,
                          int32_t* output_counts, cudaStream_t stream) {
  if (n_reset > 0) {
    ResetCountsKernel<<<dim3(static_cast<unsigned>(std::min<int64_t>((vocab + 255) / 256, 512)),
                             static_cast<unsigned>(n_reset)),
                        256, 0, stream>>>(reset_rows, vocab, seen_counts, output_counts);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  if (n_tokens > 0) {
    AddCountsKernel<<<static_cast<unsigned>((n_tokens + 255) / 256), 256, 0, stream>>>(
        rows, tokens, is_output, n_tokens, vocab, slot_tokens, seen_counts, output_counts);
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
