// FP8 activation groups (fp8_activations.h): one warp per (row, 128 columns); each lane holds 4
// values (one float4), the group's amax comes from a warp reduction, and the power-of-two scale
// from its exponent bits, so x / s is exact before the one rounding to e4m3.
#include "kernels/cuda/fp8_activations.h"

#include <cuda_fp8.h>

#include "common/status.h"
#include "kernels/common/cuda_check.h"

namespace dsv4::cuda {
namespace {

constexpr int kGroup = 128;
constexpr int kWarpsPerBlock = 8;

// The smallest power of two s with a / s <= 448 (a finite, > 0): 448 = 1.75 x 2^8.
__device__ __forceinline__ float Pow2Scale(float a) {
  if (!(a > 0.0f) || !isfinite(a)) return 1.0f;
  int e;
  const float f = frexpf(a / 448.0f, &e);  // a / 448 = f x 2^e, f in [0.5, 1)
  // f x 2^e <= 2^e; when f == 0.5 the value is exactly 2^(e-1).
  const int p = f == 0.5f ? e - 1 : e;
  return ldexpf(1.0f, max(p, -126));  // a normal scale: 1 / s stays finite for tiny groups
}

__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    QuantizeKernel(const float* x, int64_t m, int64_t k, int64_t ldx, uint8_t* x8, float* scales,
                   int64_t scales_ld) {
  const int64_t groups = (k + kGroup - 1) / kGroup;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= m * groups) return;
  const int64_t row = w / groups, g = w % groups;
  const int lane = threadIdx.x & 31;
  const int64_t c = g * kGroup + 4 * lane;
  const bool in = c < k;  // k % 4 == 0: a lane's 4 columns are all in or all out
  const float4 v = in ? *reinterpret_cast<const float4*>(x + row * ldx + c)
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float s = Pow2Scale(a), inv = 1.0f / s;  // exact: s is a power of two
  if (in) {
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(v.x * inv, v.y * inv), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(v.z * inv, v.w * inv), __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(x8 + row * k + c) =
        static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  if (lane == 0) scales[g * scales_ld + row] = s;
}

}  // namespace

absl::Status QuantizeFp8Groups(const float* x, int64_t m, int64_t k, int64_t ldx, uint8_t* x8,
                               float* scales, cudaStream_t stream, int64_t scales_ld) {
  if (m == 0) return absl::OkStatus();
  if (scales_ld == 0) scales_ld = m;
  if (m < 0 || k <= 0 || k % 4 != 0 || ldx < k || ldx % 4 != 0 || scales_ld < m ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(x8) % 4 != 0) {
    return absl::InvalidArgumentError(
        "QuantizeFp8Groups: needs k a positive multiple of 4, ldx >= k a multiple of 4, "
        "scales_ld >= m and aligned x (16 bytes) and x8 (4 bytes)");
  }
  const int64_t warps = m * ((k + kGroup - 1) / kGroup);
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("QuantizeFp8Groups: too many rows");
  QuantizeKernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      x, m, k, ldx, x8, scales, scales_ld);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
