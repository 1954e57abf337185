#include "worker/model/backend.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/model/op_checks.h"

namespace dsv4 {

absl::Status Backend::SupportsTensorParallel(const ParallelLayout& layout) const {
  return absl::UnimplementedError(absl::StrCat(
      "the ", AV(name()), " backend does not run tensor parallelism yet (tensor_parallel_size ",
      layout.world_size, "); use tensor_parallel_size 1 or the cpu device"));
}

absl::Status Backend::AllReduceSum(Tensor x) {
  return absl::FailedPreconditionError(absl::StrCat("AllReduceSum on the ", AV(name()),
                                                    " backend, which has no communicator"));
}

absl::StatusOr<Tensor> Backend::CreateStoredWeight(const StoredWeight& src, WeightUse use) {
  if (src.format == WeightFormat::kDense) return CreateWeight(src.dense, use);
  ASSIGN_OR_RETURN(HostTensor values, Dequantize(src));
  return CreateWeight(values, use);
}

absl::Status AddSharedExpert(Backend& be, const Tensor& u, const MoeWeights& w,
                             float swiglu_limit, Tensor out) {
  if (w.shared_gate_up.empty()) return absl::OkStatus();
  const int64_t T = u.dim(0), I = w.shared_down.dim(1), D = w.shared_down.dim(0);
  Tensor h = w.shared_h;
  if (h.empty()) {
    ASSIGN_OR_RETURN(h, be.Scratch(DType::kF32, Shape{T, I}));
    RETURN_IF_ERROR(be.SharedExpertUp(u, w, swiglu_limit, h));
  }
  ASSIGN_OR_RETURN(Tensor shared, be.Scratch(DType::kF32, Shape{T, D}));
  RETURN_IF_ERROR(be.Linear(h, w.shared_down, shared));
  return be.Add(out, shared, out);
}

absl::Status Backend::SharedExpertUp(const Tensor& u, const MoeWeights& w, float swiglu_limit,
                                     Tensor h) {
  RETURN_IF_ERROR(op_checks::SharedExpertUp(u, w, h));
  ASSIGN_OR_RETURN(Tensor gu, Scratch(DType::kF32, Shape{u.dim(0), 2 * w.shared_down.dim(1)}));
  RETURN_IF_ERROR(Linear(u, w.shared_gate_up, gu));
  return SwiGlu(gu, swiglu_limit, h);
}

absl::Status Backend::EmbedExpand(const Tensor& table, Tensor hs) {
  // (Embed checks the row count against the step's tokens.)
  RETURN_IF_ERROR(op_checks::EmbedExpand(table, hs, hs.shape.rank == 3 ? hs.dim(0) : 0));
  ASSIGN_OR_RETURN(Tensor x, Scratch(DType::kF32, Shape{hs.dim(0), hs.dim(2)}));
  RETURN_IF_ERROR(Embed(table, x));
  return HcExpand(x, hs);
}

absl::Status Backend::RmsNormRope(Tensor x, const Tensor& weight, const RmsNormParams& norm,
                                  const RopeParams& rope) {
  RETURN_IF_ERROR(RmsNorm(x, weight, norm, x));
  return Rope(x, rope);
}

absl::Status Backend::HcPreNorm(const Tensor& hs, const HcGateNorm& g, Tensor normed, Tensor post,
                                Tensor comb) {
  // normed doubles as the collapsed row (RmsNorm may run in place).
  RETURN_IF_ERROR(HcPre(hs, g.fn, g.base, g.scale, g.hc, normed, post, comb));
  return RmsNorm(normed, g.norm_weight, g.norm, normed);
}

absl::Status Backend::HcPostPreNorm(const Tensor& hs, const Tensor& f, const Tensor& post,
                                    const Tensor& comb, Tensor hs_out, const HcGateNorm& g,
                                    Tensor normed, Tensor post_out, Tensor comb_out) {
  RETURN_IF_ERROR(HcPost(hs, f, post, comb, hs_out));
  return HcPreNorm(hs_out, g, normed, post_out, comb_out);
}

absl::Status Backend::HcHeadNorm(const Tensor& hs, const HcGateNorm& g, Tensor y) {
  RETURN_IF_ERROR(HcHead(hs, g.fn, g.base, g.scale, g.hc, y));
  return RmsNorm(y, g.norm_weight, g.norm, y);
}

}  // namespace dsv4
