#include "worker/model/op_checks.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/backend.h"

namespace dsv4::op_checks {
namespace {

absl::Status Check(bool ok, std::string_view op, std::string_view what = "shape mismatch") {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(AV(op), ": ", AV(what)));
}

bool Is(const Tensor& t, DType dtype, int rank) {
  return !t.empty() && t.dtype == dtype && t.shape.rank == rank;
}

// A GEMM operand or embedding table: f32 or bf16.
bool IsMatrix(const Tensor& t, int rank) {
  const bool dense = t.quant.format == QuantFormat::kNone &&
                     (t.dtype == DType::kF32 || t.dtype == DType::kBF16);
  const bool fp8 = t.quant.format == QuantFormat::kFp8Block && t.dtype == DType::kF8E4M3;
  const bool fp4 = t.quant.format == QuantFormat::kMxfp4 && t.dtype == DType::kI8;
  return !t.empty() && (dense || fp8 || fp4) && t.shape.rank == rank;
}

}  // namespace

absl::Status Embed(const Tensor& table, const Tensor& out, int64_t tokens) {
  return Check(IsMatrix(table, 2) && Is(out, DType::kF32, 2) && out.dim(0) == tokens &&
                   out.dim(1) == table.dim(1),
               "Embed");
}

absl::Status Linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  return Check(Is(x, DType::kF32, 2) && IsMatrix(w, 2) && Is(y, DType::kF32, 2) &&
                   x.dim(1) == w.dim(1) && y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0),
               "Linear",
               absl::StrCat(x.shape.ToString(), " x ", w.shape.ToString(), "ᵀ -> ",
                            y.shape.ToString()));
}

absl::Status GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups, const Tensor& y) {
  return Check(Is(x, DType::kF32, 2) && IsMatrix(w, 2) && Is(y, DType::kF32, 2) && groups > 0 &&
                   x.dim(1) == groups * w.dim(1) && w.dim(0) % groups == 0 &&
                   y.dim(1) == w.dim(0) && y.dim(0) == x.dim(0),
               "GroupedLinear");
}

absl::Status RmsNorm(const Tensor& x, const Tensor& weight, const Tensor& y) {
  const int64_t dim = x.shape.rank > 0 ? x.dim(x.shape.rank - 1) : 0;
  return Check(x.dtype == DType::kF32 && y.dtype == DType::kF32 && dim > 0 &&
                   y.numel() == x.numel() && (weight.empty() || weight.numel() == dim),
               "RmsNorm");
}

absl::Status Rope(const Tensor& x, const RopeParams& p, int64_t tokens) {
  return Check(Is(x, DType::kF32, 3) && x.dim(0) == tokens && p.rope_dims <= x.dim(2) &&
                   p.rope_dims % 2 == 0 && p.inv_freq.numel() == p.rope_dims / 2,
               "Rope");
}

absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& out) {
  return Check(a.numel() == b.numel() && a.numel() == out.numel() && a.dtype == DType::kF32 &&
                   b.dtype == DType::kF32 && out.dtype == DType::kF32,
               "Add");
}

absl::Status GatherLogitRows(const Tensor& x, const Tensor& out, int64_t rows) {
  return Check(Is(x, DType::kF32, 2) && Is(out, DType::kF32, 2) && out.dim(0) == rows &&
                   out.dim(1) == x.dim(1),
               "GatherLogitRows");
}

absl::Status HcExpand(const Tensor& x, const Tensor& hs) {
  return Check(Is(x, DType::kF32, 2) && Is(hs, DType::kF32, 3) && hs.dim(0) == x.dim(0) &&
                   hs.dim(2) == x.dim(1),
               "HcExpand");
}

absl::Status EmbedExpand(const Tensor& table, const Tensor& hs, int64_t tokens) {
  return Check(IsMatrix(table, 2) && Is(hs, DType::kF32, 3) && hs.dim(0) == tokens &&
                   hs.dim(2) == table.dim(1),
               "EmbedExpand");
}

HcShape HcShapeOf(const Tensor& hs, const HcParams& p) {
  HcShape s;
  s.tokens = hs.dim(0);
  s.n = hs.dim(1);
  s.dim = hs.dim(2);
  s.sinkhorn_iters = p.sinkhorn_iters;
  s.hc_eps = p.hc_eps;
  s.norm_eps = p.norm_eps;
  return s;
}

absl::Status HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                   const HcParams& p, const Tensor& collapsed, const Tensor& post,
                   const Tensor& comb) {
  return Check(Is(hs, DType::kF32, 3) && hs.dim(1) == p.hc_mult &&
                   fn.numel() == (2 + p.hc_mult) * p.hc_mult * p.hc_mult * hs.dim(2) &&
                   base.numel() == (2 + p.hc_mult) * p.hc_mult && scale.numel() == 3 &&
                   collapsed.numel() == hs.dim(0) * hs.dim(2) &&
                   post.numel() == hs.dim(0) * p.hc_mult &&
                   comb.numel() == hs.dim(0) * p.hc_mult * p.hc_mult,
               "HcPre");
}

absl::Status HcPost(const Tensor& hs, const Tensor& f, const Tensor& post, const Tensor& comb,
                    const Tensor& out) {
  return Check(Is(hs, DType::kF32, 3) && out.numel() == hs.numel() &&
                   f.numel() == hs.dim(0) * hs.dim(2) && out.data != hs.data &&
                   post.numel() == hs.dim(0) * hs.dim(1) &&
                   comb.numel() == hs.dim(0) * hs.dim(1) * hs.dim(1),
               "HcPost");
}

absl::Status HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                    const Tensor& y) {
  return Check(Is(hs, DType::kF32, 3) && fn.numel() == hs.dim(1) * hs.dim(1) * hs.dim(2) &&
                   base.numel() == hs.dim(1) && scale.numel() == 1 &&
                   y.numel() == hs.dim(0) * hs.dim(2),
               "HcHead");
}

absl::Status Compress(const CompressParams& p, const Tensor& a, const Tensor& z,
                      const Tensor& state, const Tensor& entries, int64_t tokens,
                      int64_t block_size) {
  const int64_t cd = p.overlap * p.dim;
  return Check(p.ratio > 0 && (p.overlap == 1 || p.overlap == 2) && Is(a, DType::kF32, 2) &&
                   Is(z, DType::kF32, 2) && a.dim(1) == cd && z.dim(1) == cd &&
                   a.dim(0) == tokens && z.dim(0) == tokens && Is(state, DType::kF32, 2) &&
                   state.dim(1) == CompressStateFloats(p.ratio, p.overlap, p.dim) &&
                   Is(entries, DType::kF32, 3) && entries.dim(2) == p.dim &&
                   entries.dim(1) * p.ratio == block_size &&
                   p.position_bias.numel() == p.ratio * cd && p.norm_weight.numel() == p.dim,
               "Compress");
}

absl::Status IndexerTopK(const IndexerParams& p, const Tensor& q, const Tensor& weights,
                         const Tensor& keys, const Tensor& out, int64_t tokens,
                         int64_t block_size) {
  return Check(p.ratio > 0 && p.topk > 0 && Is(q, DType::kF32, 3) && q.dim(0) == tokens &&
                   Is(weights, DType::kF32, 2) && weights.dim(1) == q.dim(1) &&
                   Is(keys, DType::kF32, 3) && keys.dim(2) == q.dim(2) &&
                   keys.dim(1) * p.ratio == block_size && Is(out, DType::kI32, 2) &&
                   out.dim(0) == tokens && out.dim(1) == p.topk,
               "IndexerTopK");
}

absl::Status Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                       const Tensor& ring, const Tensor& entries, const Tensor& selected,
                       const Tensor& sinks, const Tensor& out, int64_t tokens,
                       int64_t block_size) {
  const bool compressed = p.ratio > 0;
  return Check(Is(q, DType::kF32, 3) && q.dim(0) == tokens && Is(kv, DType::kF32, 2) &&
                   kv.dim(1) == q.dim(2) && Is(ring, DType::kF32, 3) && ring.dim(1) == p.window &&
                   ring.dim(2) == q.dim(2) && sinks.numel() == q.dim(1) &&
                   out.numel() == q.numel() &&
                   (!compressed || (Is(entries, DType::kF32, 3) && entries.dim(2) == q.dim(2) &&
                                    entries.dim(1) * p.ratio == block_size)) &&
                   (!compressed || p.dense_compressed ||
                    (Is(selected, DType::kI32, 2) && selected.dim(0) == tokens)),
               "Attention");
}

absl::Status RingWrite(const Tensor& kv, const Tensor& ring, int64_t tokens) {
  return Check(Is(kv, DType::kF32, 2) && Is(ring, DType::kF32, 3) && kv.dim(1) == ring.dim(2) &&
                   kv.dim(0) == tokens,
               "RingWrite");
}

absl::Status CompressSnapshot(const CompressParams& p, const Tensor& a, const Tensor& z,
                              const Tensor& state, int64_t tokens) {
  const int64_t cd = p.overlap * p.dim;
  return Check(Is(a, DType::kF32, 2) && Is(z, DType::kF32, 2) && a.dim(0) == tokens &&
                   z.dim(0) == tokens && a.dim(1) == cd && z.dim(1) == cd &&
                   Is(state, DType::kF32, 2) &&
                   state.dim(1) == CompressStateFloats(p.ratio, p.overlap, p.dim),
               "CompressSnapshot");
}

absl::Status CopyStateRows(const Tensor& pool, std::span<const std::pair<int32_t, int32_t>> copies) {
  bool ok = pool.dtype == DType::kF32 && pool.shape.rank >= 1 && pool.dim(0) > 0;
  for (auto [src, dst] : copies) {
    ok = ok && src >= 0 && dst >= 0 && src < pool.dim(0) && dst < pool.dim(0) && src != dst;
  }
  return Check(ok, "CopyStateRows");
}

absl::Status Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                   const Tensor& tid2eid, const Tensor& idx, const Tensor& weights,
                   int64_t tokens) {
  return Check(Is(logits, DType::kF32, 2) && logits.dim(0) == tokens && Is(idx, DType::kI32, 2) &&
                   idx.dim(1) == p.top_k && p.top_k <= logits.dim(1) &&
                   weights.numel() == idx.numel() &&
                   (!p.hash || (Is(tid2eid, DType::kI32, 2) && tid2eid.dim(1) == p.top_k)) &&
                   (bias.empty() || bias.numel() == logits.dim(1)),
               "Route");
}

absl::Status MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                        const MoeWeights& w, const Tensor& out) {
  const Tensor &gate_up = w.gate_up, &down = w.down;
  const bool shared_ok =
      w.shared_gate_up.empty()
          ? w.shared_down.empty()
          : IsMatrix(w.shared_gate_up, 2) && IsMatrix(w.shared_down, 2) &&
                w.shared_gate_up.dtype == w.shared_down.dtype &&
                w.shared_gate_up.dim(1) == u.dim(1) && w.shared_down.dim(0) == u.dim(1) &&
                w.shared_gate_up.dim(0) == 2 * w.shared_down.dim(1) &&
                (w.shared_h.empty() || (Is(w.shared_h, DType::kF32, 2) &&
                                        w.shared_h.dim(0) == u.dim(0) &&
                                        w.shared_h.dim(1) == w.shared_down.dim(1)));
  return Check(Is(u, DType::kF32, 2) && Is(idx, DType::kI32, 2) && IsMatrix(gate_up, 3) &&
                   IsMatrix(down, 3) && gate_up.dtype == down.dtype &&
                   gate_up.dim(2) == u.dim(1) && down.dim(1) == u.dim(1) &&
                   gate_up.dim(1) == 2 * down.dim(2) && gate_up.dim(0) == down.dim(0) &&
                   out.numel() == u.numel() && idx.dim(0) == u.dim(0) &&
                   weights.numel() == idx.numel() && shared_ok,
               "MoeExperts");
}

absl::Status SharedExpertUp(const Tensor& u, const MoeWeights& w, const Tensor& h) {
  return Check(Is(u, DType::kF32, 2) && IsMatrix(w.shared_gate_up, 2) &&
                   IsMatrix(w.shared_down, 2) && w.shared_gate_up.dim(1) == u.dim(1) &&
                   w.shared_gate_up.dim(0) == 2 * w.shared_down.dim(1) &&
                   Is(h, DType::kF32, 2) && h.dim(0) == u.dim(0) &&
                   h.dim(1) == w.shared_down.dim(1),
               "SharedExpertUp");
}

absl::Status SwiGlu(const Tensor& gate_up, const Tensor& h) {
  return Check(Is(gate_up, DType::kF32, 2) && Is(h, DType::kF32, 2) &&
                   gate_up.dim(1) == 2 * h.dim(1) && gate_up.dim(0) == h.dim(0),
               "SwiGlu");
}

}  // namespace dsv4::op_checks
