#include "kernels/cuda/mhc.h"

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kMaxN = 8;
constexpr int kMaxMix = (2 + kMaxN) * kMaxN;  // 80
constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// 1 / RMS of token t's flattened streams f[nd] (every thread gets it).
__device__ float InvRms(const float* f, int64_t nd, float eps, double* dscratch) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < nd; i += blockDim.x) s += static_cast<double>(f[i]) * f[i];
  s = BlockSumD(s, dscratch);
  return 1.0f / sqrtf(static_cast<float>(s / static_cast<double>(nd)) + eps);
}

// out[i] = Σ_j pre[j] · f[j, i]: the streams of one token collapsed with its gates.
__device__ __forceinline__ void Collapse(const float* pre, const float* f, int n, int64_t dim,
                                         float* out) {
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += pre[j] * f[j * dim + i];
    out[i] = acc;
  }
}

// Split-K partial mixes for few tokens: warp (r, c) dots fn row r with every token over K chunk c;
// parts [chunks, T, rows], summed in chunk order by the consumer (deterministic).
constexpr int kMixChunk = 512;
__global__ void MixPartsKernel(const float* hs, int64_t tokens, int64_t nd, const float* fn,
                               int rows, float* parts) {
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t chunks = (nd + kMixChunk - 1) / kMixChunk;
  if (gw >= rows * chunks) return;
  const int r = static_cast<int>(gw % rows);
  const int64_t c = gw / rows;
  float w[kMixChunk / 32];
#pragma unroll
  for (int v = 0; v < kMixChunk / 32; ++v) {
    const int64_t i = c * kMixChunk + v * 32 + lane;
    w[v] = i < nd ? fn[r * nd + i] : 0.0f;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    float acc = 0.0f;
#pragma unroll
    for (int v = 0; v < kMixChunk / 32; ++v) {
      const int64_t i = c * kMixChunk + v * 32 + lane;
      if (i < nd) acc += w[v] * hs[t * nd + i];
    }
    acc = WarpSum(acc);
    if (lane == 0) parts[(c * tokens + t) * rows + r] = acc;
  }
}

__device__ __forceinline__ float MixOf(const float* mix_parts, int64_t parts, int64_t tokens,
                                       int64_t t, int rows, int r) {
  float m = 0.0f;
  for (int64_t c = 0; c < parts; ++c) m += mix_parts[(c * tokens + t) * rows + r];
  return m;
}

// mix_parts [parts, T, rows] (a GEMM's [T, rows] when parts = 1): flatten(hs) · fnᵀ summed over
// parts; the RMS scale is applied here.
// kN = hc_mult at compile time: the Sinkhorn matrix lives in registers (one thread runs it; with
// a runtime n it spilled to local memory and dominated the op).
template <int kN>
__global__ void HcPreKernel(HcDims d, const float* hs, const float* mix_parts, int64_t parts,
                            const float* base, const float* scale, float* collapsed, float* post,
                            float* comb) {
  __shared__ double dscratch[32];
  __shared__ float mix[kMaxMix];
  __shared__ float pre[kMaxN];
  const int64_t t = blockIdx.x;
  constexpr int n = kN;
  const int rows = (2 + n) * n;
  const int64_t nd = d.n * d.dim;
  const float* f = hs + t * nd;
  const float inv = InvRms(f, nd, d.norm_eps, dscratch);
  if (threadIdx.x < rows) {
    mix[threadIdx.x] = MixOf(mix_parts, parts, d.tokens, t, rows, threadIdx.x) * inv;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < n; ++j) {
      pre[j] = Sigmoid(mix[j] * scale[0] + base[j]) + d.hc_eps;
      post[t * n + j] = 2.0f * Sigmoid(mix[n + j] * scale[1] + base[n + j]);
    }
    float c[n * n];
#pragma unroll
    for (int i = 0; i < n * n; ++i) c[i] = mix[2 * n + i] * scale[2] + base[2 * n + i];
#pragma unroll
    for (int j = 0; j < n; ++j) {
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < n; ++k) mx = fmaxf(mx, c[j * n + k]);
      float sum = 0;
#pragma unroll
      for (int k = 0; k < n; ++k) {
        c[j * n + k] = expf(c[j * n + k] - mx);
        sum += c[j * n + k];
      }
#pragma unroll
      for (int k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / sum + d.hc_eps;
    }
    for (int it = 0; it < d.sinkhorn_iters; ++it) {
      if (it > 0) {
#pragma unroll
        for (int j = 0; j < n; ++j) {
          float sum = 0;
#pragma unroll
          for (int k = 0; k < n; ++k) sum += c[j * n + k];
#pragma unroll
          for (int k = 0; k < n; ++k) c[j * n + k] /= (sum + d.hc_eps);
        }
      }
#pragma unroll
      for (int k = 0; k < n; ++k) {
        float sum = 0;
#pragma unroll
        for (int j = 0; j < n; ++j) sum += c[j * n + k];
#pragma unroll
        for (int j = 0; j < n; ++j) c[j * n + k] /= (sum + d.hc_eps);
      }
    }
#pragma unroll
    for (int i = 0; i < n * n; ++i) comb[t * n * n + i] = c[i];
  }
  __syncthreads();
  Collapse(pre, f, n, d.dim, collapsed + t * d.dim);
}

__global__ void HcPostKernel(HcDims d, const float* hs, const float* f, const float* post,
                             const float* comb, float* out) {
  const int64_t t = blockIdx.y;
  const int n = static_cast<int>(d.n);
  const float* h = hs + t * n * d.dim;
  const float* c = comb + t * n * n;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n * d.dim;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int k = static_cast<int>(idx / d.dim);
    const int64_t i = idx % d.dim;
    float acc = post[t * n + k] * f[t * d.dim + i];
    for (int j = 0; j < n; ++j) acc += c[j * n + k] * h[j * d.dim + i];
    out[t * n * d.dim + idx] = acc;
  }
}

__global__ void HcHeadKernel(HcDims d, const float* hs, const float* mix_parts, int64_t parts,
                             const float* base, const float* scale, float* y) {
  __shared__ double dscratch[32];
  __shared__ float pre[kMaxN];
  const int64_t t = blockIdx.x;
  const int n = static_cast<int>(d.n);
  const float* f = hs + t * n * d.dim;
  const float inv = InvRms(f, n * d.dim, d.norm_eps, dscratch);
  if (threadIdx.x < n) {
    const float mix = MixOf(mix_parts, parts, d.tokens, t, n, threadIdx.x) * inv;
    pre[threadIdx.x] = Sigmoid(mix * scale[0] + base[threadIdx.x]) + d.hc_eps;
  }
  __syncthreads();
  Collapse(pre, f, n, d.dim, y + t * d.dim);
}

}  // namespace

int64_t HcMixParts(int64_t tokens, int64_t nd) {
  return tokens <= kHcMixMaxTokens ? (nd + kMixChunk - 1) / kMixChunk : 1;
}

absl::Status HcMix(const float* hs, int64_t tokens, int64_t nd, const float* fn, int64_t rows,
                   float* parts, cudaStream_t stream) {
  if (tokens == 0) return absl::OkStatus();
  if (tokens > kHcMixMaxTokens) return absl::InvalidArgumentError("HcMix: too many tokens");
  const int64_t warps = rows * ((nd + kMixChunk - 1) / kMixChunk);
  MixPartsKernel<<<static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads), kThreads, 0,
                   stream>>>(hs, tokens, nd, fn, static_cast<int>(rows), parts);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcPre(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                   const float* base,
                   const float* scale, float* collapsed, float* post, float* comb,
                   cudaStream_t stream) {
  if (d.n < 1 || d.n > kMaxN) return absl::UnimplementedError("hc_mult must be in [1, 8]");
  if (d.tokens == 0) return absl::OkStatus();
  switch (d.n) {
#define DSV4_HC_PRE(N)                                                                \
  case N:                                                                             \
    HcPreKernel<N><<<static_cast<unsigned>(d.tokens), kThreads, 0, stream>>>(         \
        d, hs, mix_parts, parts, base, scale, collapsed, post, comb);                 \
    break;
    DSV4_HC_PRE(1)
    DSV4_HC_PRE(2)
    DSV4_HC_PRE(3)
    DSV4_HC_PRE(4)
    DSV4_HC_PRE(5)
    DSV4_HC_PRE(6)
    DSV4_HC_PRE(7)
    DSV4_HC_PRE(8)
#undef DSV4_HC_PRE
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcPost(const HcDims& d, const float* hs, const float* f, const float* post,
                    const float* comb, float* out, cudaStream_t stream) {
  if (d.tokens == 0) return absl::OkStatus();
  const int64_t per_token = d.n * d.dim;
  const unsigned bx = static_cast<unsigned>(std::min<int64_t>((per_token + kThreads - 1) / kThreads, 64));
  HcPostKernel<<<dim3(bx, static_cast<unsigned>(d.tokens)), kThreads, 0, stream>>>(d, hs, f, post,
                                                                                   comb, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcHead(const HcDims& d, const float* hs, const float* mix_parts, int64_t parts,
                    const float* base,
                    const float* scale, float* y, cudaStream_t stream) {
  if (d.n < 1 || d.n > kMaxN) return absl::UnimplementedError("hc_mult must be in [1, 8]");
  if (d.tokens == 0) return absl::OkStatus();
  HcHeadKernel<<<static_cast<unsigned>(d.tokens), kThreads, 0, stream>>>(d, hs, mix_parts, parts,
                                                                          base, scale, y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
