#include "kernels/cuda/norm_rope.h"

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

// One block per row; sum of squares in double (as the CPU reference does).
__global__ void RmsNormKernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  __shared__ double scratch[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  double s = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += static_cast<double>(xr[i]) * xr[i];
  s = BlockSumD(s, scratch);
  const float mean = static_cast<float>(s / static_cast<double>(dim));
  const float inv = 1.0f / sqrtf(mean + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] * inv;
    yr[i] = w != nullptr ? w[i] * v : v;
  }
}

__global__ void RopeKernel(float* x, int64_t heads, int64_t dim, int64_t rope_dims,
                           const float* inv_freq, const int32_t* positions, bool inverse) {
  const int64_t row = blockIdx.x;  // t * heads + h
  const int64_t t = row / heads;
  float* r = x + row * dim + (dim - rope_dims);
  const float pos = static_cast<float>(positions[t]);
  for (int64_t p = threadIdx.x; p < rope_dims / 2; p += blockDim.x) {
    const float angle = pos * inv_freq[p];
    double sd, cd;
    sincos(static_cast<double>(angle), &sd, &cd);
    const float c = static_cast<float>(cd);
    float s = static_cast<float>(sd);
    if (inverse) s = -s;
    const float x0 = r[2 * p], x1 = r[2 * p + 1];
    r[2 * p] = x0 * c - x1 * s;
    r[2 * p + 1] = x1 * c + x0 * s;
  }
}

}  // namespace

absl::Status RmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int threads = dim >= 1024 ? 512 : dim >= 256 ? 256 : 128;
  RmsNormKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, w, dim, eps, y);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Rope(float* x, int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dims,
                  const float* inv_freq, const int32_t* positions, bool inverse,
                  cudaStream_t stream) {
  if (tokens * heads == 0) return absl::OkStatus();
  RopeKernel<<<static_cast<unsigned>(tokens * heads), 32, 0, stream>>>(x, heads, dim, rope_dims,
                                                                      inv_freq, positions, inverse);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
