#include "kernels/cuda/norm_rope.h"

#include <cstdint>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

// One block per row; sum of squares in double (as the CPU reference does).
__global__ void RmsNormKernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  PdlTrigger();  // the projection that usually follows may start streaming its weights
  PdlWait();
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

// Thread i's float4 of row `row` of x (zeros past the row), RMS-normalised with w (unweighted
// when null) by RmsNormalize4: the shared start of the one-block-per-row kernels below.
__device__ __forceinline__ float4 NormalizedRow4(const float* x, const float* w, int64_t row,
                                                 int dim, float eps, double* scratch) {
  const int n4 = dim >> 2;
  const int i = threadIdx.x;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 wv = make_float4(1.f, 1.f, 1.f, 1.f);
  if (i < n4) {
    a = reinterpret_cast<const float4*>(x + row * dim)[i];
    if (w != nullptr) wv = reinterpret_cast<const float4*>(w)[i];
  }
  return RmsNormalize4(a, wv, w != nullptr, dim, eps, scratch);
}

// One block per row, the whole row in registers (one float4 per thread, blockDim = dim/4 rounded
// up to a warp): one read, one write. Sum of squares in double like the generic kernel.
__global__ void __launch_bounds__(1024) RmsNormRegKernel(const float* x, const float* w, int dim,
                                                         float eps, float* y) {
  PdlTrigger();
  PdlWait();
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const int i = threadIdx.x;
  const float4 o = NormalizedRow4(x, w, row, dim, eps, scratch);
  if (i < (dim >> 2)) reinterpret_cast<float4*>(y + row * dim)[i] = o;
}

__global__ void RopeKernel(float* x, int64_t heads, int64_t dim, int64_t rope_dims,
                           const float* inv_freq, const int32_t* positions, bool inverse) {
  PdlTrigger();
  PdlWait();
  const int64_t row = blockIdx.x;  // t * heads + h
  const int64_t t = row / heads;
  float* r = x + row * dim + (dim - rope_dims);
  const float pos = static_cast<float>(positions[t]);
  for (int64_t p = threadIdx.x; p < rope_dims / 2; p += blockDim.x) {
    const float2 y = RopeRotate(r[2 * p], r[2 * p + 1], pos, inv_freq[p], inverse);
    r[2 * p] = y.x;
    r[2 * p + 1] = y.y;
  }
}

// RmsNormRegKernel's row normalisation, then RopeKernel's rotation of the trailing rope_dims on
// the normalised values still in registers: thread i holds elements 4i .. 4i + 3, i.e. the
// pairs 2i and 2i + 1 (rope_dims % 4 == 0 keeps the rope region float4-aligned).
__global__ void __launch_bounds__(1024) RmsNormRopeKernel(float* x, const float* w, int dim,
                                                          float eps, int64_t heads, int rope_dims,
                                                          const float* inv_freq,
                                                          const int32_t* positions, bool inverse) {
  PdlTrigger();
  PdlWait();
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;  // t * heads + h
  const int n4 = dim >> 2;
  const int i = threadIdx.x;
  float4* xr = reinterpret_cast<float4*>(x + row * dim);
  const float4 n = NormalizedRow4(x, w, row, dim, eps, scratch);
  if (i >= n4) return;
  float o[4] = {n.x, n.y, n.z, n.w};
  const int first = (dim - rope_dims) >> 2;  // the first float4 of the rope region
  if (i >= first) {
    const float pos = static_cast<float>(positions[row / heads]);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int p = 2 * (i - first) + q;
      const float2 y = RopeRotate(o[2 * q], o[2 * q + 1], pos, inv_freq[p], inverse);
      o[2 * q] = y.x;
      o[2 * q + 1] = y.y;
    }
  }
  xr[i] = make_float4(o[0], o[1], o[2], o[3]);
}

}  // namespace

bool RmsNormRopeFits(int64_t dim, int64_t rope_dims, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return dim % 4 == 0 && dim <= 4096 && rope_dims % 4 == 0 && rope_dims <= dim && aligned(x) &&
         (w == nullptr || aligned(w));
}

absl::Status RmsNormRope(float* x, const float* w, int64_t tokens, int64_t heads, int64_t dim,
                         float eps, int64_t rope_dims, const float* inv_freq,
                         const int32_t* positions, bool inverse, cudaStream_t stream) {
  if (tokens * heads == 0) return absl::OkStatus();
  if (!RmsNormRopeFits(dim, rope_dims, x, w)) {
    return absl::InvalidArgumentError("RmsNormRope: needs dim % 4 == 0, dim <= 4096, "
                                      "rope_dims % 4 == 0 and 16-byte aligned x, w");
  }
  const int threads = static_cast<int>(((dim / 4) + 31) / 32 * 32);
  CUDA_RETURN_IF_ERROR(LaunchPdl(RmsNormRopeKernel, dim3(static_cast<unsigned>(tokens * heads)),
                                 dim3(threads), 0, stream, x, w, static_cast<int>(dim), eps, heads,
                                 static_cast<int>(rope_dims), inv_freq, positions, inverse));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status RmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (dim % 4 == 0 && dim <= 4096 && aligned(x) && aligned(y) && (w == nullptr || aligned(w))) {
    const int threads = static_cast<int>(((dim / 4) + 31) / 32 * 32);
    CUDA_RETURN_IF_ERROR(LaunchPdl(RmsNormRegKernel, dim3(static_cast<unsigned>(rows)),
                                   dim3(threads), 0, stream, x, w, static_cast<int>(dim), eps, y));
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  const int threads = dim >= 1024 ? 512 : dim >= 256 ? 256 : 128;
  CUDA_RETURN_IF_ERROR(LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads),
                                 0, stream, x, w, dim, eps, y));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Rope(float* x, int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dims,
                  const float* inv_freq, const int32_t* positions, bool inverse,
                  cudaStream_t stream) {
  if (tokens * heads == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(LaunchPdl(RopeKernel, dim3(static_cast<unsigned>(tokens * heads)), dim3(32),
                                 0, stream, x, heads, dim, rope_dims, inv_freq, positions,
                                 inverse));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
