// Shape and dtype checks of every Backend op, shared by the CPU and CUDA backends so that both
// reject exactly the same misuse with the same InvalidArgument message ("<Op>: ..."). Matrix
// weights may be f32 or bf16; activations are f32. `tokens` and `block_size` are the step's.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "kernels/mhc_ref.h"
#include "worker/model/backend.h"

namespace dsv4::op_checks {

absl::Status Embed(const Tensor& table, const Tensor& out, int64_t tokens);
absl::Status Linear(const Tensor& x, const Tensor& w, const Tensor& y);
absl::Status GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups, const Tensor& y);
absl::Status RmsNorm(const Tensor& x, const Tensor& weight, const Tensor& y);
absl::Status Rope(const Tensor& x, const RopeParams& p, int64_t tokens);
absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& out);
absl::Status GatherLogitRows(const Tensor& x, const Tensor& out, int64_t rows);
absl::Status HcExpand(const Tensor& x, const Tensor& hs);
absl::Status EmbedExpand(const Tensor& table, const Tensor& hs, int64_t tokens);
// The mHC kernels' shape for streams hs [T, n, D].
HcShape HcShapeOf(const Tensor& hs, const HcParams& p);
absl::Status HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                   const HcParams& p, const Tensor& collapsed, const Tensor& post,
                   const Tensor& comb);
absl::Status HcPost(const Tensor& hs, const Tensor& f, const Tensor& post, const Tensor& comb,
                    const Tensor& out);
absl::Status HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                    const Tensor& y);
absl::Status Compress(const CompressParams& p, const Tensor& a, const Tensor& z,
                      const Tensor& state, const Tensor& entries, int64_t tokens,
                      int64_t block_size);
absl::Status IndexerTopK(const IndexerParams& p, const Tensor& q, const Tensor& weights,
                         const Tensor& keys, const Tensor& out, int64_t tokens, int64_t block_size);
absl::Status Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                       const Tensor& ring, const Tensor& entries, const Tensor& selected,
                       const Tensor& sinks, const Tensor& out, int64_t tokens, int64_t block_size);
absl::Status RingWrite(const Tensor& kv, const Tensor& ring, int64_t tokens);
absl::Status CompressSnapshot(const CompressParams& p, const Tensor& a, const Tensor& z,
                              const Tensor& state, int64_t tokens);
// f32 pool with rows on dim 0; every row index of `copies` inside it.
absl::Status CopyStateRows(const Tensor& pool, std::span<const std::pair<int32_t, int32_t>> copies);
absl::Status Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                   const Tensor& tid2eid, const Tensor& idx, const Tensor& weights, int64_t tokens);
absl::Status MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                        const MoeWeights& w, const Tensor& out);
absl::Status SharedExpertUp(const Tensor& u, const MoeWeights& w, const Tensor& h);
absl::Status SwiGlu(const Tensor& gate_up, const Tensor& h);

}  // namespace dsv4::op_checks
