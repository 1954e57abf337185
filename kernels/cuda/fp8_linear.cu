// STUB: to be implemented (issue #19). The declarations are final; see fp8_linear.h.
#include "kernels/cuda/fp8_linear.h"

namespace dsv4::cuda {

bool Fp8GemvFits(const float*, int64_t, const Fp8Matrix&, int64_t) { return false; }

absl::Status Fp8Gemv(const float*, int64_t, const Fp8Matrix&, int64_t, bool, float*,
                     cudaStream_t) {
  return absl::UnimplementedError("Fp8Gemv is not implemented yet");
}

absl::Status Fp8Dequantize(const Fp8Matrix&, bool, void*, cudaStream_t) {
  return absl::UnimplementedError("Fp8Dequantize is not implemented yet");
}

}  // namespace dsv4::cuda
