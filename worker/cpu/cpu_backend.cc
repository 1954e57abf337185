#include "worker/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/attention_ref.h"
#include "kernels/compressor_ref.h"
#include "kernels/counter_rng.h"
#include "kernels/cpu_gemm.h"
#include "kernels/indexer_ref.h"
#include "kernels/mhc_ref.h"
#include "kernels/moe_ref.h"
#include "kernels/rms_norm_ref.h"
#include "kernels/rope_ref.h"
#include "kernels/state_snapshot_ref.h"
#include "parallel/communicator.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/model/op_checks.h"

namespace dsv4 {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kScratchBlockBytes = 64ull << 20;

absl::Status Check(bool ok, std::string_view op, std::string_view what) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cpu backend ", AV(op), ": ", AV(what)));
}

// The reference keeps every weight in fp32 (CreateWeight never stores bf16).
absl::Status F32Weight(const Tensor& w, std::string_view op) {
  return Check(w.dtype == DType::kF32, op, "cpu weights are f32");
}

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

CpuBackend::CpuBackend(Communicator* comm) : comm_(comm) {}
CpuBackend::~CpuBackend() = default;

absl::StatusOr<Tensor> CpuBackend::Allocate(std::vector<Block>* owner, DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  for (int i = 0; i < shape.rank; ++i) {
    if (shape[i] < 0) return absl::InvalidArgumentError("negative dimension");
  }
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  Block block;
  block.data.reset(new (std::nothrow) uint8_t[bytes + kAlign]);
  if (block.data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  block.size = bytes + kAlign;
  auto addr = reinterpret_cast<uintptr_t>(block.data.get());
  t.data = reinterpret_cast<void*>((addr + kAlign - 1) / kAlign * kAlign);
  std::memset(t.data, 0, bytes);
  owner->push_back(std::move(block));
  return t;
}

absl::StatusOr<Tensor> CpuBackend::CreateWeight(const HostTensor& src, WeightUse /*use*/) {
  if (src.dtype != DType::kF32 && src.dtype != DType::kI32) {
    return absl::InvalidArgumentError("cpu backend weights are f32 or i32");
  }
  ASSIGN_OR_RETURN(Tensor t, Allocate(&persistent_, src.dtype, src.shape));
  const size_t have = src.dtype == DType::kI32 ? src.i32.size() : src.f32.size();
  if (have != static_cast<size_t>(t.numel())) {
    return absl::InvalidArgumentError(absl::StrCat("weight data has ", have, " values for shape ",
                                                   src.shape.ToString()));
  }
  std::memcpy(t.data, src.data(), t.nbytes());
  persistent_bytes_ += t.nbytes();
  return t;
}

absl::StatusOr<Tensor> CpuBackend::CreateSyntheticWeight(const SyntheticSpec& spec,
                                                         WeightUse /*use*/) {
  if (spec.dtype != DType::kF32 && spec.dtype != DType::kI32) {
    return absl::InvalidArgumentError("cpu backend weights are f32 or i32");
  }
  if (spec.dtype == DType::kI32 && spec.modulus < 1) {
    return absl::InvalidArgumentError("synthetic index table needs modulus >= 1");
  }
  if (spec.format != QuantFormat::kNone) {
    // The released format's bytes, dequantised: the values the CUDA backend computes with.
    const StoredWeight stored = SyntheticStoredWeight(spec.format, spec.shape, spec.seed, spec.lo,
                                                      spec.hi, spec.block_rows, spec.block_cols,
                                                      spec.part_rows);
    return CreateStoredWeight(stored, WeightUse::kMatrix);
  }
  ASSIGN_OR_RETURN(Tensor t, Allocate(&persistent_, spec.dtype, spec.shape));
  // Counter-based values: any split of the range gives the same tensor, so big ones fill in
  // parallel.
  const int64_t n = t.numel();
  const int64_t parts = std::clamp<int64_t>(n >> 22, 1, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int64_t p = 0; p < parts; ++p) {
    threads.emplace_back([&, p] {
      const int64_t lo = n * p / parts, hi = n * (p + 1) / parts;
      for (int64_t i = lo; i < hi; ++i) {
        if (spec.dtype == DType::kI32) {
          t.ptr<int32_t>()[i] = SyntheticIndex(spec.seed, i, spec.modulus);
        } else {
          t.ptr<float>()[i] = SyntheticUniform(spec.seed, i, spec.lo, spec.hi);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  persistent_bytes_ += t.nbytes();
  return t;
}

absl::StatusOr<Tensor> CpuBackend::CreatePool(DType dtype, Shape shape) {
  ASSIGN_OR_RETURN(Tensor t, Allocate(&persistent_, dtype, shape));
  persistent_bytes_ += t.nbytes();
  return t;
}

absl::StatusOr<Tensor> CpuBackend::Scratch(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  const size_t bytes = AlignUp(std::max<size_t>(t.nbytes(), 1));
  while (scratch_block_ < scratch_.size() &&
         scratch_offset_ + bytes > scratch_[scratch_block_].size - kAlign) {
    ++scratch_block_;
    scratch_offset_ = 0;
  }
  if (scratch_block_ == scratch_.size()) {
    Block block;
    block.size = std::max(kScratchBlockBytes, bytes) + kAlign;
    block.data.reset(new (std::nothrow) uint8_t[block.size]);
    if (block.data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate scratch of ", bytes));
    }
    scratch_.push_back(std::move(block));
    scratch_offset_ = 0;
  }
  auto base = reinterpret_cast<uintptr_t>(scratch_[scratch_block_].data.get());
  base = (base + kAlign - 1) / kAlign * kAlign;
  t.data = reinterpret_cast<void*>(base + scratch_offset_);
  scratch_offset_ += bytes;
  return t;
}

absl::Status CpuBackend::BeginStep(const StepMeta& meta) {
  scratch_block_ = 0;
  scratch_offset_ = 0;
  meta_ = &meta;
  view_ = HostView(meta);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(const Tensor& src, void* dst) {
  std::memcpy(dst, src.data, src.nbytes());
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyFromHost(const void* src, Tensor dst) {
  std::memcpy(dst.data, src, dst.nbytes());
  return absl::OkStatus();
}

absl::Status CpuBackend::Embed(const Tensor& table, Tensor out) {
  RETURN_IF_ERROR(op_checks::Embed(table, out, view_.num_tokens));
  RETURN_IF_ERROR(F32Weight(table, "Embed"));
  const int64_t d = table.dim(1);
  for (int32_t t = 0; t < view_.num_tokens; ++t) {
    const int32_t id = view_.token_ids[t];
    RETURN_IF_ERROR(Check(id >= 0 && id < table.dim(0), "Embed", "token id out of range"));
    std::memcpy(out.ptr<float>() + t * d, table.ptr<float>() + id * d, sizeof(float) * d);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Linear(const Tensor& x, const Tensor& w, Tensor y) {
  RETURN_IF_ERROR(op_checks::Linear(x, w, y));
  RETURN_IF_ERROR(F32Weight(w, "Linear"));
  SgemmNT(x.dim(0), w.dim(0), x.dim(1), x.ptr<float>(), x.dim(1), w.ptr<float>(), w.dim(1),
          y.ptr<float>(), y.dim(1));
  return absl::OkStatus();
}

absl::Status CpuBackend::GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups, Tensor y) {
  RETURN_IF_ERROR(op_checks::GroupedLinear(x, w, groups, y));
  RETURN_IF_ERROR(F32Weight(w, "GroupedLinear"));
  const int64_t k = w.dim(1);
  const int64_t n = w.dim(0) / groups;
  for (int64_t g = 0; g < groups; ++g) {
    SgemmNT(x.dim(0), n, k, x.ptr<float>() + g * k, x.dim(1), w.ptr<float>() + g * n * k, k,
            y.ptr<float>() + g * n, y.dim(1));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(const Tensor& x, const Tensor& weight, const RmsNormParams& p,
                                 Tensor y) {
  const int64_t dim = x.dim(x.shape.rank - 1);
  RETURN_IF_ERROR(op_checks::RmsNorm(x, weight, y));
  RmsNormRef(x.ptr<float>(), weight.empty() ? nullptr : weight.ptr<float>(), x.numel() / dim, dim,
             p.eps, y.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::Rope(Tensor x, const RopeParams& p) {
  RETURN_IF_ERROR(op_checks::Rope(x, p, view_.num_tokens));
  RopeRef(x.ptr<float>(), x.dim(0), x.dim(1), x.dim(2), p.rope_dims, p.inv_freq.ptr<float>(),
          view_.positions, p.inverse);
  return absl::OkStatus();
}

absl::Status CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  RETURN_IF_ERROR(op_checks::Add(a, b, out));
  const float* pa = a.ptr<float>();
  const float* pb = b.ptr<float>();
  float* po = out.ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
  return absl::OkStatus();
}

absl::Status CpuBackend::GatherLogitRows(const Tensor& x, Tensor out) {
  const auto& rows = meta_->logit_rows;
  RETURN_IF_ERROR(op_checks::GatherLogitRows(x, out, static_cast<int64_t>(rows.size())));
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(out.ptr<float>() + r * x.dim(1), x.ptr<float>() + rows[r] * x.dim(1),
                sizeof(float) * x.dim(1));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::HcExpand(const Tensor& x, Tensor hs) {
  RETURN_IF_ERROR(op_checks::HcExpand(x, hs));
  const int64_t n = hs.dim(1);
  const int64_t d = x.dim(1);
  for (int64_t t = 0; t < x.dim(0); ++t) {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(hs.ptr<float>() + (t * n + j) * d, x.ptr<float>() + t * d, sizeof(float) * d);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, const HcParams& p, Tensor collapsed,
                               Tensor post, Tensor comb) {
  RETURN_IF_ERROR(op_checks::HcPre(hs, fn, base, scale, p, collapsed, post, comb));
  HcPreRef(op_checks::HcShapeOf(hs, p), hs.ptr<float>(), fn.ptr<float>(), base.ptr<float>(),
           scale.ptr<float>(), collapsed.ptr<float>(), post.ptr<float>(), comb.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::HcPost(const Tensor& hs, const Tensor& f, const Tensor& post,
                                const Tensor& comb, Tensor out) {
  RETURN_IF_ERROR(op_checks::HcPost(hs, f, post, comb, out));
  HcParams p;
  p.hc_mult = hs.dim(1);
  HcPostRef(op_checks::HcShapeOf(hs, p), hs.ptr<float>(), f.ptr<float>(), post.ptr<float>(),
            comb.ptr<float>(), out.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base,
                                const Tensor& scale, const HcParams& p, Tensor y) {
  RETURN_IF_ERROR(op_checks::HcHead(hs, fn, base, scale, y));
  HcHeadRef(op_checks::HcShapeOf(hs, p), hs.ptr<float>(), fn.ptr<float>(), base.ptr<float>(),
            scale.ptr<float>(), y.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::Compress(const CompressParams& p, const Tensor& a, const Tensor& z,
                                  Tensor state, Tensor entries) {
  CompressorShape s;
  s.ratio = p.ratio;
  s.overlap = p.overlap;
  s.dim = p.dim;
  s.rope_dims = p.rope.rope_dims;
  s.norm_eps = p.norm_eps;
  RETURN_IF_ERROR(op_checks::Compress(p, a, z, state, entries, view_.num_tokens, view_.block_size));
  CompressRef(s, view_, a.ptr<float>(), z.ptr<float>(), p.position_bias.ptr<float>(),
              p.norm_weight.ptr<float>(), p.rope.inv_freq.ptr<float>(), state.ptr<float>(),
              entries.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::IndexerTopK(const IndexerParams& p, const Tensor& q, const Tensor& weights,
                                     const Tensor& keys, Tensor out) {
  RETURN_IF_ERROR(op_checks::IndexerTopK(p, q, weights, keys, out, view_.num_tokens, view_.block_size));
  IndexerShape s;
  s.heads = q.dim(1);
  s.dim = q.dim(2);
  s.ratio = p.ratio;
  s.topk = p.topk;
  s.weight_scale = p.weight_scale;
  s.score_scale = p.score_scale;
  IndexerTopKRef(s, view_, q.ptr<float>(), weights.ptr<float>(), keys.ptr<float>(),
                 out.ptr<int32_t>());
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                                   const Tensor& ring, const Tensor& entries,
                                   const Tensor& selected, const Tensor& sinks, Tensor out) {
  const bool compressed = p.ratio > 0;
  RETURN_IF_ERROR(op_checks::Attention(p, q, kv, ring, entries, selected, sinks, out, view_.num_tokens,
                                         view_.block_size));
  if (p.out_rope.rope_dims > 0) RETURN_IF_ERROR(op_checks::Rope(out, p.out_rope, view_.num_tokens));
  AttentionShape s;
  s.heads = q.dim(1);
  s.dim = q.dim(2);
  s.window = p.window;
  s.ratio = p.ratio;
  s.topk = selected.empty() ? 0 : selected.dim(1);
  s.dense_compressed = p.dense_compressed;
  s.scale = p.scale;
  AttentionRef(s, view_, q.ptr<float>(), kv.ptr<float>(), ring.ptr<float>(),
               compressed ? entries.ptr<float>() : nullptr,
               selected.empty() ? nullptr : selected.ptr<int32_t>(), sinks.ptr<float>(),
               out.ptr<float>());
  return p.out_rope.rope_dims > 0 ? Rope(out, p.out_rope) : absl::OkStatus();
}

absl::Status CpuBackend::RingWrite(const Tensor& kv, Tensor ring) {
  RETURN_IF_ERROR(op_checks::RingWrite(kv, ring, view_.num_tokens));
  RingWriteRef(ring.dim(2), ring.dim(1), view_, kv.ptr<float>(), ring.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::RingSnapshot(const Tensor& kv, Tensor ring) {
  RETURN_IF_ERROR(op_checks::RingWrite(kv, ring, view_.num_tokens));
  RingSnapshotRef(ring.dim(2), ring.dim(1), view_, kv.ptr<float>(), ring.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::CompressSnapshot(const CompressParams& p, const Tensor& a,
                                          const Tensor& z, Tensor state) {
  RETURN_IF_ERROR(op_checks::CompressSnapshot(p, a, z, state, view_.num_tokens));
  CompressorShape s;
  s.ratio = p.ratio;
  s.overlap = p.overlap;
  s.dim = p.dim;
  CompressSnapshotRef(s, view_, a.ptr<float>(), z.ptr<float>(), p.position_bias.ptr<float>(),
                      state.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyStateRows(std::span<const Tensor> pools,
                                       std::span<const std::pair<int32_t, int32_t>> copies) {
  for (const Tensor& pool : pools) {
    RETURN_IF_ERROR(op_checks::CopyStateRows(pool, copies));
    const int64_t row = pool.numel() / pool.dim(0);
    for (auto [src, dst] : copies) {
      std::memcpy(pool.ptr<float>() + dst * row, pool.ptr<float>() + src * row,
                  sizeof(float) * row);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                               const Tensor& tid2eid, Tensor idx, Tensor weights) {
  RETURN_IF_ERROR(op_checks::Route(p, logits, bias, tid2eid, idx, weights, view_.num_tokens));
  RouterShape s;
  s.tokens = logits.dim(0);
  s.experts = logits.dim(1);
  s.top_k = p.top_k;
  s.routed_scale = p.routed_scale;
  if (p.hash) {
    for (int32_t t = 0; t < view_.num_tokens; ++t) {
      RETURN_IF_ERROR(Check(view_.token_ids[t] >= 0 && view_.token_ids[t] < tid2eid.dim(0),
                            "Route", "token id outside tid2eid"));
    }
  }
  RouteRef(s, logits.ptr<float>(), bias.empty() ? nullptr : bias.ptr<float>(),
           p.hash ? tid2eid.ptr<int32_t>() : nullptr, view_.token_ids, idx.ptr<int32_t>(),
           weights.ptr<float>());
  if (p.local_experts > 0) {  // expert parallelism: local ids, -1 for another rank's experts
    int32_t* ids = idx.ptr<int32_t>();
    for (int64_t i = 0; i < idx.numel(); ++i) {
      const int64_t local = ids[i] - p.expert_begin;
      ids[i] = local >= 0 && local < p.local_experts ? static_cast<int32_t>(local) : -1;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                                    const MoeWeights& w, float swiglu_limit, Tensor out) {
  RETURN_IF_ERROR(op_checks::MoeExperts(u, idx, weights, w, out));
  const Tensor &gate_up = w.gate_up, &down = w.down;
  RETURN_IF_ERROR(F32Weight(gate_up, "MoeExperts"));
  ExpertsShape s;
  s.tokens = u.dim(0);
  s.dim = u.dim(1);
  s.inter = down.dim(2);
  s.experts = gate_up.dim(0);
  s.top_k = idx.dim(1);
  s.swiglu_limit = swiglu_limit;
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const int32_t e = idx.ptr<int32_t>()[i];
    RETURN_IF_ERROR(Check(e >= -1 && e < s.experts, "MoeExperts", "expert index out of range"));
  }
  MoeExpertsRef(s, u.ptr<float>(), idx.ptr<int32_t>(), weights.ptr<float>(), gate_up.ptr<float>(),
                down.ptr<float>(), out.ptr<float>());
  return AddSharedExpert(*this, u, w, swiglu_limit, out);
}

absl::Status CpuBackend::SwiGlu(const Tensor& gate_up, float limit, Tensor h) {
  RETURN_IF_ERROR(op_checks::SwiGlu(gate_up, h));
  SwiGluRef(gate_up.ptr<float>(), h.dim(0), h.dim(1), limit, h.ptr<float>());
  return absl::OkStatus();
}

absl::Status CpuBackend::SupportsTensorParallel(const ParallelLayout& layout) const {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor_parallel_size ", layout.world_size, " on a cpu backend without a communicator"));
  }
  if (comm_->rank() != layout.rank || comm_->world_size() != layout.world_size ||
      comm_->memory_space() != MemorySpace::kHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cpu backend's communicator is rank ", comm_->rank(), " of ", comm_->world_size(),
        " (", comm_->backend_name(), "); the model is rank ", layout.rank, " of ",
        layout.world_size));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AllReduceSum(Tensor x) {
  if (comm_ == nullptr) return Backend::AllReduceSum(x);
  RETURN_IF_ERROR(Check(x.dtype == DType::kF32 && x.data != nullptr, "AllReduceSum", "f32 tensor"));
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s =
      comm_->AllReduceSum(x.data, x.data, static_cast<size_t>(x.numel()), DType::kF32, nullptr);
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace dsv4
