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

// mix_raw [T, rows] = flatten(hs) · fnᵀ comes from a GEMM; the RMS scale is applied here.
__global__ void HcPreKernel(HcDims d, const float* hs, const float* mix_raw, const float* base,
                            const float* scale, float* collapsed, float* post, float* comb) {
  __shared__ double dscratch[32];
  __shared__ float mix[kMaxMix];
  __shared__ float pre[kMaxN];
  const int64_t t = blockIdx.x;
  const int n = static_cast<int>(d.n);
  const int rows = (2 + n) * n;
  const int64_t nd = d.n * d.dim;
  const float* f = hs + t * nd;
  const float inv = InvRms(f, nd, d.norm_eps, dscratch);
  if (threadIdx.x < rows) mix[threadIdx.x] = mix_raw[t * rows + threadIdx.x] * inv;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 0; j < n; ++j) {
      pre[j] = Sigmoid(mix[j] * scale[0] + base[j]) + d.hc_eps;
      post[t * n + j] = 2.0f * Sigmoid(mix[n + j] * scale[1] + base[n + j]);
    }
    float c[kMaxN * kMaxN];
    for (int i = 0; i < n * n; ++i) c[i] = mix[2 * n + i] * scale[2] + base[2 * n + i];
    for (int j = 0; j < n; ++j) {
      float mx = -INFINITY;
      for (int k = 0; k < n; ++k) mx = fmaxf(mx, c[j * n + k]);
      float sum = 0;
      for (int k = 0; k < n; ++k) {
        c[j * n + k] = expf(c[j * n + k] - mx);
        sum += c[j * n + k];
      }
      for (int k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / sum + d.hc_eps;
    }
    for (int it = 0; it < d.sinkhorn_iters; ++it) {
      if (it > 0) {
        for (int j = 0; j < n; ++j) {
          float sum = 0;
          for (int k = 0; k < n; ++k) sum += c[j * n + k];
          for (int k = 0; k < n; ++k) c[j * n + k] /= (sum + d.hc_eps);
        }
      }
      for (int k = 0; k < n; ++k) {
        float sum = 0;
        for (int j = 0; j < n; ++j) sum += c[j * n + k];
        for (int j = 0; j < n; ++j) c[j * n + k] /= (sum + d.hc_eps);
      }
    }
    for (int i = 0; i < n * n; ++i) comb[t * n * n + i] = c[i];
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < d.dim; i += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += pre[j] * f[j * d.dim + i];
    collapsed[t * d.dim + i] = acc;
  }
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

__global__ void HcHeadKernel(HcDims d, const float* hs, const float* mix_raw, const float* base,
                             const float* scale, float* y) {
  __shared__ double dscratch[32];
  __shared__ float pre[kMaxN];
  const int64_t t = blockIdx.x;
  const int n = static_cast<int>(d.n);
  const float* f = hs + t * n * d.dim;
  const float inv = InvRms(f, n * d.dim, d.norm_eps, dscratch);
  if (threadIdx.x < n) {
    pre[threadIdx.x] = Sigmoid(mix_raw[t * n + threadIdx.x] * inv * scale[0] + base[threadIdx.x]) + d.hc_eps;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < d.dim; i += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += pre[j] * f[j * d.dim + i];
    y[t * d.dim + i] = acc;
  }
}

}  // namespace

absl::Status HcPre(const HcDims& d, const float* hs, const float* mix_raw, const float* base,
                   const float* scale, float* collapsed, float* post, float* comb,
                   cudaStream_t stream) {
  if (d.n < 1 || d.n > kMaxN) return absl::UnimplementedError("hc_mult must be in [1, 8]");
  if (d.tokens == 0) return absl::OkStatus();
  HcPreKernel<<<static_cast<unsigned>(d.tokens), kThreads, 0, stream>>>(d, hs, mix_raw, base,
                                                                         scale, collapsed, post, comb);
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

absl::Status HcHead(const HcDims& d, const float* hs, const float* mix_raw, const float* base,
                    const float* scale, float* y, cudaStream_t stream) {
  if (d.n < 1 || d.n > kMaxN) return absl::UnimplementedError("hc_mult must be in [1, 8]");
  if (d.tokens == 0) return absl::OkStatus();
  HcHeadKernel<<<static_cast<unsigned>(d.tokens), kThreads, 0, stream>>>(d, hs, mix_raw, base, scale,
                                                                          y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
