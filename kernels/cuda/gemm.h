// GEMMs through cuBLASLt for the row-major y = x · wᵀ of every DSV4 projection: bf16 or fp32
// operands, fp32 accumulate (CUBLAS_COMPUTE_32F, no TF32) and fp32 output. Strided batches give
// the grouped output projection (o_a_proj) and any per-group product. Plans (descriptors and the
// heuristic's algorithm) are cached per shape, so a steady decode loop only calls cublasLtMatmul.
// RAII owner of the cuBLASLt handle and the workspace. Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace dsv4::cuda {

struct GemmShape {
  int64_t m = 0;           // rows of x and y (tokens)
  int64_t n = 0;           // rows of w, columns of y
  int64_t k = 0;           // reduction
  DType dtype = DType::kBF16;  // of x and w: kBF16 or kF32
  int64_t batch = 1;
  int64_t ldx = 0;         // row stride of x in elements (0 = k)
  int64_t ldy = 0;         // row stride of y in elements (0 = n)
  int64_t stride_x = 0;    // batch strides in elements
  int64_t stride_w = 0;
  int64_t stride_y = 0;
};

class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(size_t workspace_bytes = 32u << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[b][M, N] = x[b][M, K] · w[b][N, K]ᵀ for b < batch.
  absl::Status Run(const GemmShape& s, const void* x, const void* w, float* y, cudaStream_t stream);

  // The same product on FP8 tensor cores with DeepSeek's scales (batch 1; s.dtype unused): x8
  // e4m3 [M, K] (row stride s.ldx) with fp32 scales [K / 128, M] per 1 x 128 group (M
  // contiguous: QuantizeFp8Groups), w8 e4m3 [N, K] with fp32 scales [N / 128, K / 128] per
  // 128 x 128 block (row-major, partial blocks rounded up), y fp32. cuBLASLt's
  // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F modes (cuBLAS >= 12.9, sm_90).
  // K % 16 == 0. Unimplemented when cuBLASLt does not support the shape or offers no algorithm
  // (nothing is written then); other cuBLAS statuses are errors.
  absl::Status RunFp8Blocks(const GemmShape& s, const uint8_t* x8, const float* x_scale,
                            const uint8_t* w8, const float* w_scale, float* y,
                            cudaStream_t stream);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t>;
  Gemm() = default;
  // fp8: the block-scaled FP8 plan, with the scale pointers of its first call (cuBLASLt's
  // heuristic refuses block scale modes without them).
  absl::StatusOr<Plan*> GetPlan(const GemmShape& s, bool fp8 = false,
                                const float* w_scale = nullptr, const float* x_scale = nullptr);

  void* handle_ = nullptr;      // cublasLtHandle_t
  void* workspace_ = nullptr;   // device
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace dsv4::cuda
