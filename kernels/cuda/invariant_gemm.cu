#include "kernels/cuda/invariant_gemm.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_check.h"

namespace dsv4::cuda {
namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 16;
constexpr int kThreads = 256;  // 16 x 16, each 4 x 4 outputs strided by 16
constexpr int kPer = 4;
static_assert(kTileM == kTileN, "the staging loop stages an x row and a w row per index");
static_assert(kThreads == 16 * 16 && kTileM == 16 * kPer, "16 x 16 threads, 4 x 4 outputs each");
static_assert(kTileM * kTileK % kThreads == 0, "whole staging passes");

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }

struct Dims {
  int64_t m, n, k, ldx, ldy, stride_x, stride_w, stride_y;
};

// Block (n tile, m tile, batch). Out-of-range rows and columns stage as zeros and are never
// stored; the k loop stops at K, so each sum is exactly the fmas of k = 0..K-1 in order.
template <typename T>
__global__ void __launch_bounds__(kThreads) InvariantGemmKernel(Dims d, const T* x, const T* w,
                                                                float* y) {
  __shared__ float xs[kTileK][kTileM + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const int64_t b = blockIdx.z;
  const T* xb = x + b * d.stride_x;
  const T* wb = w + b * d.stride_w;
  float* yb = y + b * d.stride_y;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[kPer][kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc[i][j] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < d.k; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTileM * kTileK; i += kThreads) {
      const int r = i / kTileK, c = i % kTileK;  // consecutive threads walk k: coalesced rows
      const int64_t k = k0 + c;
      const int64_t m = m0 + r, n = n0 + r;
      xs[c][r] = m < d.m && k < d.k ? Load(xb + m * d.ldx + k) : 0.0f;
      ws[c][r] = n < d.n && k < d.k ? Load(wb + n * d.k + k) : 0.0f;
    }
    __syncthreads();
    const int kc = d.k - k0 < kTileK ? static_cast<int>(d.k - k0) : kTileK;
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      if (kk >= kc) break;
      float a[kPer], v[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kPer; ++j) v[j] = ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) acc[i][j] = __fmaf_rn(a[i], v[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= d.m) continue;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < d.n) yb[m * d.ldy + n] = acc[i][j];
    }
  }
}

}  // namespace

absl::Status InvariantGemm(const GemmShape& s, const void* x, const void* w, float* y,
                           cudaStream_t stream) {
  if (s.m == 0 || s.n == 0) return absl::OkStatus();  // as cuda::Gemm
  if (s.m < 0 || s.n < 0 || s.k < 1 || s.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("invariant gemm: bad shape m=", s.m, " n=", s.n,
                                                   " k=", s.k, " batch=", s.batch));
  }
  if (s.dtype != DType::kBF16 && s.dtype != DType::kF32) {
    return absl::InvalidArgumentError("invariant gemm: operands must be bf16 or f32");
  }
  const int64_t tiles_m = (s.m + kTileM - 1) / kTileM;
  if (tiles_m > 65535 || s.batch > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("invariant gemm: m=", s.m, " batch=", s.batch, " exceed the grid"));
  }
  Dims d{s.m, s.n, s.k, s.ldx > 0 ? s.ldx : s.k, s.ldy > 0 ? s.ldy : s.n,
         s.stride_x, s.stride_w, s.stride_y};
  const dim3 grid(static_cast<unsigned>((s.n + kTileN - 1) / kTileN),
                  static_cast<unsigned>(tiles_m), static_cast<unsigned>(s.batch));
  if (s.dtype == DType::kF32) {
    InvariantGemmKernel<float><<<grid, kThreads, 0, stream>>>(
        d, static_cast<const float*>(x), static_cast<const float*>(w), y);
  } else {
    InvariantGemmKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
        d, static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w), y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
