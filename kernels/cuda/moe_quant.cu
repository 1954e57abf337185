// STUB: to be implemented (issue #19). The declarations are final; see moe_quant.h.
#include "kernels/cuda/moe_quant.h"

namespace dsv4::cuda {

absl::Status MoeExpertsQuant(const ExpertsDims&, const float*, const int32_t*, const float*,
                             const QuantExperts&, bool, void*, float*, cudaStream_t, bool) {
  return absl::UnimplementedError("MoeExpertsQuant is not implemented yet");
}

bool MoeDecodeQuantFits(const MoeDecodeArgs&, const QuantExperts&) { return false; }

absl::Status MoeDecodeQuant(const MoeDecodeArgs&, const QuantExperts&, const Fp8Matrix*,
                            const Fp8Matrix*, cudaStream_t) {
  return absl::UnimplementedError("MoeDecodeQuant is not implemented yet");
}

}  // namespace dsv4::cuda
