#include "kernels/cuda/gemv.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/row_stream.cuh"

namespace dsv4::cuda {
namespace {

// y[n] = w[n] . x[n / group_rows]: one row per warp.
struct GemvOp {
  const float* x;
  const __nv_bfloat16* w;
  int64_t k, rows, group_rows;
  float* y;
  __device__ __forceinline__ void Rows(int64_t n, const __nv_bfloat16* (&wr)[1],
                                       const float* (&xr)[1]) const {
    wr[0] = w + n * k;
    xr[0] = x + n / group_rows * k;
  }
  __device__ __forceinline__ void Finish(int64_t n, const float (&acc)[1]) const {
    if ((threadIdx.x & 31) == 0) y[n] = acc[0];
  }
};

}  // namespace

absl::Status RowGemvBf16(const float* x, int64_t k, const void* w, int64_t rows,
                         int64_t group_rows, float* y, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (k <= 0 || k % 8 != 0 || group_rows <= 0 || !Aligned16(x) || !Aligned16(w)) {
    return absl::InvalidArgumentError(
        "RowGemvBf16: needs k a positive multiple of 8, group_rows > 0 and 16-byte aligned x, w");
  }
  const GemvOp op{x, static_cast<const __nv_bfloat16*>(w), k, rows, group_rows, y};
  return LaunchStream<1, 2, true, true>(op, rows, k, stream);
}

}  // namespace dsv4::cuda
