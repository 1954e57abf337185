#include "worker/model/backend.h"

#include "common/status.h"

namespace dsv4 {

absl::Status AddSharedExpert(Backend& be, const Tensor& u, const MoeWeights& w,
                             float swiglu_limit, Tensor out) {
  if (w.shared_gate_up.empty()) return absl::OkStatus();
  const int64_t T = u.dim(0), I = w.shared_down.dim(1), D = w.shared_down.dim(0);
  ASSIGN_OR_RETURN(Tensor gu, be.Scratch(DType::kF32, Shape{T, 2 * I}));
  RETURN_IF_ERROR(be.Linear(u, w.shared_gate_up, gu));
  ASSIGN_OR_RETURN(Tensor h, be.Scratch(DType::kF32, Shape{T, I}));
  RETURN_IF_ERROR(be.SwiGlu(gu, swiglu_limit, h));
  ASSIGN_OR_RETURN(Tensor shared, be.Scratch(DType::kF32, Shape{T, D}));
  RETURN_IF_ERROR(be.Linear(h, w.shared_down, shared));
  return be.Add(out, shared, out);
}

absl::Status Backend::RmsNormRope(Tensor x, const Tensor& weight, const RmsNormParams& norm,
                                  const RopeParams& rope) {
  RETURN_IF_ERROR(RmsNorm(x, weight, norm, x));
  return Rope(x, rope);
}

}  // namespace dsv4
