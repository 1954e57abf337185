#include "worker/model/weight_loading.h"

#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/counter_rng.h"

namespace dsv4 {
namespace {

std::string L(int64_t layer, std::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", AV(suffix));
}

absl::StatusOr<StoredWeight> ApplyCuts(StoredWeight w, const WeightCuts& cuts, size_t from = 0) {
  for (size_t i = from; i < cuts.size(); ++i) {
    ASSIGN_OR_RETURN(w, SliceStored(std::move(w), cuts[i]));
  }
  return w;
}

absl::StatusOr<HostTensor> ApplyCuts(HostTensor t, const WeightCuts& cuts, const std::string& name,
                                     size_t from = 0) {
  for (size_t i = from; i < cuts.size(); ++i) {
    ASSIGN_OR_RETURN(t, SliceHost(t, cuts[i], name));
  }
  return t;
}

// The first cut is read from the checkpoint as such (only that part is read); the rest are
// applied after.
WeightSlice FirstCut(const WeightCuts& cuts) { return cuts.empty() ? WeightSlice{} : cuts.front(); }

absl::StatusOr<Tensor> ToBackend(Backend* backend, const StoredWeight& w, WeightUse use) {
  if (w.format == WeightFormat::kDense) return backend->CreateWeight(w.dense, use);
  return backend->CreateStoredWeight(w, use);
}

// Part `p` of a weight stacked from parts of `part_rows` rows each, as a standalone [part_rows,
// cols] weight (an FP8 part with its own scale grid).
StoredWeight StoredPart(const StoredWeight& all, int64_t p, int64_t part_rows) {
  const int64_t cols = all.cols();
  StoredWeight out;
  out.name = all.name;
  out.format = all.format;
  out.shape = Shape{part_rows, cols};
  out.block_rows = all.block_rows;
  out.block_cols = all.block_cols;
  auto rows_of = [&](const auto& v, int64_t per_row, int64_t first, int64_t n) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    return std::vector<T>(v.begin() + first * per_row, v.begin() + (first + n) * per_row);
  };
  switch (all.format) {
    case WeightFormat::kDense:
      out.dense = HostTensor{all.dense.dtype, out.shape, rows_of(all.dense.f32, cols, p * part_rows, part_rows), {}};
      break;
    case WeightFormat::kMxfp4:
      out.data = rows_of(all.data, cols / 2, p * part_rows, part_rows);
      out.scale_e8m0 = rows_of(all.scale_e8m0, cols / 32, p * part_rows, part_rows);
      break;
    case WeightFormat::kFp8Block: {
      const int64_t br = all.block_rows, sc = (cols + all.block_cols - 1) / all.block_cols;
      const int64_t grid_rows = (part_rows + br - 1) / br;
      out.part_rows = part_rows;
      out.data = rows_of(all.data, cols, p * part_rows, part_rows);
      out.scale_f32 = rows_of(all.scale_f32, sc, p * grid_rows, grid_rows);
      break;
    }
  }
  return out;
}

class CheckpointWeights final : public WeightFactory {
 public:
  CheckpointWeights(WeightSource* src, Backend* backend, bool keep_formats)
      : src_(src), backend_(backend), keep_formats_(keep_formats) {}
  bool Has(const std::string& name) const override { return src_->Has(name); }
  absl::StatusOr<Tensor> Get(const std::string& name, Shape shape, WeightUse use,
                             const WeightCuts& cuts) override {
    if (keep_formats_ && use == WeightUse::kMatrix) {
      ASSIGN_OR_RETURN(StoredWeight stored, src_->Stored(name, shape, FirstCut(cuts)));
      ASSIGN_OR_RETURN(stored, ApplyCuts(std::move(stored), cuts, 1));
      return ToBackend(backend_, stored, use);
    }
    ASSIGN_OR_RETURN(HostTensor host, src_->F32(name, shape, FirstCut(cuts)));
    ASSIGN_OR_RETURN(host, ApplyCuts(std::move(host), cuts, name, 1));
    return backend_->CreateWeight(host, use);
  }
  absl::StatusOr<Tensor> Stack(const std::vector<std::string>& names, Shape part, Shape shape,
                               WeightUse use, const StackSlice& slice) override {
    const int64_t begin = slice.part_begin;
    const int64_t count = slice.part_count < 0 ? static_cast<int64_t>(names.size()) - begin
                                               : slice.part_count;
    const Shape kept = slice.kept.rank > 0 ? slice.kept : shape;
    if (keep_formats_ && use == WeightUse::kMatrix) {
      std::vector<StoredWeight> parts;
      parts.reserve(static_cast<size_t>(count));
      for (int64_t i = begin; i < begin + count; ++i) {
        ASSIGN_OR_RETURN(StoredWeight p, src_->Stored(names[i], part, FirstCut(slice.part_cuts)));
        ASSIGN_OR_RETURN(p, ApplyCuts(std::move(p), slice.part_cuts, 1));
        parts.push_back(std::move(p));
      }
      ASSIGN_OR_RETURN(StoredWeight all, StackParts(std::move(parts), kept));
      return ToBackend(backend_, all, use);
    }
    HostTensor all{DType::kF32, kept, {}, {}};
    all.f32.reserve(static_cast<size_t>(kept.numel()));
    for (int64_t i = begin; i < begin + count; ++i) {
      ASSIGN_OR_RETURN(HostTensor t, src_->F32(names[i], part, FirstCut(slice.part_cuts)));
      ASSIGN_OR_RETURN(t, ApplyCuts(std::move(t), slice.part_cuts, names[i], 1));
      all.f32.insert(all.f32.end(), t.f32.begin(), t.f32.end());
    }
    return backend_->CreateWeight(all, use);
  }
  absl::StatusOr<Tensor> Index(const std::string& name, Shape shape, int32_t modulus) override {
    ASSIGN_OR_RETURN(HostTensor table, src_->I32(name, shape));
    for (int32_t e : table.i32) {
      if (e < 0 || e >= modulus) {
        return absl::InvalidArgumentError(absl::StrCat(name, " routes to expert ", e,
                                                       " outside [0, ", modulus, ")"));
      }
    }
    return backend_->CreateWeight(table, WeightUse::kParam);
  }

 private:
  WeightSource* src_;
  Backend* backend_;
  bool keep_formats_;
};

// Synthetic weights: every tensor seeded by (model seed, name), with ranges that keep activations
// in a realistic regime (matrices ±1/sqrt(fan_in), norm weights and mHC scales near 1, biases
// small). Whole tensors are made on the backend; a rank's slices are made on the host from the
// whole tensor's values, so that they equal those slices of a single rank's tensors.
class SyntheticWeights final : public WeightFactory {
 public:
  SyntheticWeights(uint64_t seed, Backend* backend, bool released_formats,
                   std::vector<int64_t> fp8_block)
      : seed_(seed), backend_(backend), released_(released_formats), block_(std::move(fp8_block)) {}
  bool Has(const std::string& name) const override { return true; }
  absl::StatusOr<Tensor> Get(const std::string& name, Shape shape, WeightUse use,
                             const WeightCuts& cuts) override {
    const SyntheticSpec spec = Spec(name, shape, use, 0);
    if (cuts.empty()) return backend_->CreateSyntheticWeight(spec, use);
    ASSIGN_OR_RETURN(StoredWeight w, ApplyCuts(OnHost(spec, name), cuts));
    return ToBackend(backend_, w, use);
  }
  absl::StatusOr<Tensor> Stack(const std::vector<std::string>& names, Shape part, Shape shape,
                               WeightUse use, const StackSlice& slice) override {
    const SyntheticSpec spec = Spec(names.front(), shape, use, part[0]);
    if (slice.whole()) return backend_->CreateSyntheticWeight(spec, use);
    const StoredWeight all = OnHost(spec, names.front());
    const int64_t begin = slice.part_begin;
    const int64_t count = slice.part_count < 0 ? static_cast<int64_t>(names.size()) - begin
                                               : slice.part_count;
    std::vector<StoredWeight> parts;
    for (int64_t i = begin; i < begin + count; ++i) {
      ASSIGN_OR_RETURN(StoredWeight p, ApplyCuts(StoredPart(all, i, part[0]), slice.part_cuts));
      parts.push_back(std::move(p));
    }
    ASSIGN_OR_RETURN(StoredWeight kept, StackParts(std::move(parts), slice.kept.rank > 0 ? slice.kept : shape));
    return ToBackend(backend_, kept, use);
  }
  absl::StatusOr<Tensor> Index(const std::string& name, Shape shape, int32_t modulus) override {
    SyntheticSpec spec;
    spec.dtype = DType::kI32;
    spec.shape = shape;
    spec.seed = Seed(name);
    spec.modulus = modulus;
    return backend_->CreateSyntheticWeight(spec, WeightUse::kParam);
  }

 private:
  SyntheticSpec Spec(const std::string& name, Shape shape, WeightUse use, int64_t part_rows) const {
    SyntheticSpec spec;
    if (released_ && use == WeightUse::kMatrix && shape.rank >= 2) {
      spec.format = ReleasedFormat(name);
      if (block_.size() == 2) {
        spec.block_rows = static_cast<int32_t>(block_[0]);
        spec.block_cols = static_cast<int32_t>(block_[1]);
      }
      spec.part_rows = part_rows;
    }
    spec.shape = shape;
    spec.seed = Seed(name);
    const bool near_one = shape.rank == 1 && (absl::StrContains(name, "norm") ||
                                              absl::EndsWith(name, "scale"));
    if (near_one) {
      spec.lo = 0.9f, spec.hi = 1.1f;
    } else if (shape.rank == 1) {
      spec.lo = -0.1f, spec.hi = 0.1f;
    } else if (absl::StrContains(name, "embed_tokens")) {
      spec.lo = -1.0f, spec.hi = 1.0f;
    } else {
      const float a = 1.0f / std::sqrt(static_cast<float>(shape[shape.rank - 1]));
      spec.lo = -a, spec.hi = a;
    }
    return spec;
  }
  // The values the backend would make for `spec`, on the host, as a 2-D [rows, cols] weight
  // (1-D tensors stay 1-D).
  static StoredWeight OnHost(const SyntheticSpec& spec, const std::string& name) {
    StoredWeight w;
    if (spec.format != QuantFormat::kNone) {
      w = SyntheticStoredWeight(spec.format, spec.shape, spec.seed, spec.lo, spec.hi,
                                spec.block_rows, spec.block_cols, spec.part_rows);
    } else {
      w.format = WeightFormat::kDense;
      w.shape = spec.shape;
      w.dense = HostTensor{DType::kF32, spec.shape, {}, {}};
      const int64_t n = spec.shape.numel();
      w.dense.f32.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) w.dense.f32[i] = SyntheticUniform(spec.seed, i, spec.lo, spec.hi);
    }
    w.name = name;
    return w;
  }
  uint64_t Seed(const std::string& name) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
    return h ^ seed_;
  }
  uint64_t seed_;
  Backend* backend_;
  bool released_;
  std::vector<int64_t> block_;
};

// The class a weight's bytes are counted under in the load's memory plan.
const char* WeightClass(const std::string& name, WeightUse use) {
  if (absl::StrContains(name, "mlp.experts.")) return "routed_experts";
  if (absl::StrContains(name, "mlp.shared_experts.")) return "shared_expert";
  if (absl::StrContains(name, "embed_tokens") || absl::StrContains(name, "lm_head")) {
    return "embedding_head";
  }
  if (use == WeightUse::kParam) return "params";
  if (absl::StrContains(name, "self_attn.compressor.")) return "compressor_indexer";
  return "attention";
}

// Counts what the weights will take on a backend, allocating nothing: run through the same
// weight tree as the real load, it sees every tensor with this rank's shape. `format_of` says
// how a matrix is stored (checkpoint dtype, or the synthetic policy).
class CensusWeights final : public WeightFactory {
 public:
  CensusWeights(std::function<QuantFormat(const std::string&)> format_of, const Backend& backend,
                std::map<std::string, uint64_t>* bytes)
      : format_of_(std::move(format_of)), backend_(backend), bytes_(bytes) {}
  bool Has(const std::string& name) const override { return true; }
  absl::StatusOr<Tensor> Get(const std::string& name, Shape shape, WeightUse use,
                             const WeightCuts& cuts) override {
    for (const WeightSlice& s : cuts) {
      ASSIGN_OR_RETURN(shape, SlicedShape(shape, s, name));
    }
    (*bytes_)[WeightClass(name, use)] += Bytes(name, shape, use);
    return Dummy(shape);
  }
  absl::StatusOr<Tensor> Stack(const std::vector<std::string>& names, Shape part, Shape shape,
                               WeightUse use, const StackSlice& slice) override {
    return Get(names.front(), slice.kept.rank > 0 ? slice.kept : shape, use, {});
  }
  absl::StatusOr<Tensor> Index(const std::string& name, Shape shape, int32_t) override {
    (*bytes_)["params"] += static_cast<uint64_t>(shape.numel()) * 4;
    return Dummy(shape);
  }

 private:
  uint64_t Bytes(const std::string& name, Shape shape, WeightUse use) const {
    const uint64_t n = static_cast<uint64_t>(shape.numel());
    if (use == WeightUse::kParam) return n * 4;
    const QuantFormat f = backend_.KeepsQuantizedMatrices() ? format_of_(name) : QuantFormat::kNone;
    if (f == QuantFormat::kFp8Block) return n + (n / (128 * 128) + 1) * 4;
    if (f == QuantFormat::kMxfp4) return n / 2 + n / 32;
    return n * static_cast<uint64_t>(backend_.DenseMatrixBytes());
  }
  static Tensor Dummy(Shape shape) {
    static char byte;
    Tensor t;
    t.data = &byte;
    t.shape = shape;
    return t;
  }
  std::function<QuantFormat(const std::string&)> format_of_;
  const Backend& backend_;
  std::map<std::string, uint64_t>* bytes_;
};

// A cut along `dim` unless it keeps everything.
WeightCuts Cut(int dim, int64_t begin, int64_t size, int64_t full) {
  if (begin == 0 && size == full) return {};
  return {WeightSlice::Along(dim, begin, size)};
}

class Loader {
 public:
  Loader(WeightFactory* f, const TensorShard& shard) : f_(f), shard_(shard) {}

  absl::StatusOr<Tensor> Param(const std::string& name, Shape shape, WeightCuts cuts = {}) {
    return f_->Get(name, shape, WeightUse::kParam, cuts);
  }
  absl::StatusOr<Tensor> Matrix(const std::string& name, Shape shape, WeightCuts cuts = {}) {
    return f_->Get(name, shape, WeightUse::kMatrix, cuts);
  }
  bool Has(const std::string& name) const { return f_->Has(name); }

  absl::StatusOr<HcWeights> Hc(const std::string& prefix, int64_t mix, int64_t nd, int64_t scales,
                              const char* fn, const char* base, const char* scale) {
    HcWeights w;
    ASSIGN_OR_RETURN(w.fn, Param(absl::StrCat(prefix, fn), Shape{mix, nd}));
    ASSIGN_OR_RETURN(w.base, Param(absl::StrCat(prefix, base), Shape{mix}));
    ASSIGN_OR_RETURN(w.scale, Param(absl::StrCat(prefix, scale), Shape{scales}));
    return w;
  }

  absl::StatusOr<CompressorWeights> Compressor(const std::string& prefix, int64_t ratio,
                                               int64_t overlap, int64_t dim, int64_t hidden) {
    CompressorWeights w;
    const int64_t cd = overlap * dim;
    ASSIGN_OR_RETURN(w.kv_proj, Matrix(absl::StrCat(prefix, "kv_proj.weight"), Shape{cd, hidden}));
    ASSIGN_OR_RETURN(w.gate_proj, Matrix(absl::StrCat(prefix, "gate_proj.weight"), Shape{cd, hidden}));
    ASSIGN_OR_RETURN(w.position_bias, Param(absl::StrCat(prefix, "position_bias"), Shape{ratio, cd}));
    ASSIGN_OR_RETURN(w.kv_norm, Param(absl::StrCat(prefix, "kv_norm.weight"), Shape{dim}));
    return w;
  }

  // Routed experts as [e, 2I, D] and [e, D, I] (this rank's e experts), from per-expert tensors
  // or HF's fused ones.
  absl::Status Experts(int64_t layer, const ModelConfig& c, LayerWeights* lw) {
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, D = c.hidden_size;
    const int64_t e0 = shard_.expert_begin, e = shard_.experts;
    const std::string fused_gu = L(layer, "mlp.experts.gate_up_proj");
    if (Has(fused_gu)) {
      ASSIGN_OR_RETURN(lw->experts_gate_up, Matrix(fused_gu, Shape{E, 2 * I, D}, Cut(0, e0, e, E)));
      ASSIGN_OR_RETURN(lw->experts_down, Matrix(L(layer, "mlp.experts.down_proj"), Shape{E, D, I},
                                                Cut(0, e0, e, E)));
      return absl::OkStatus();
    }
    std::vector<std::string> gate_up, down;
    for (int64_t x = 0; x < E; ++x) {
      const std::string p = L(layer, absl::StrCat("mlp.experts.", x, "."));
      gate_up.push_back(absl::StrCat(p, "gate_proj.weight"));
      gate_up.push_back(absl::StrCat(p, "up_proj.weight"));
      down.push_back(absl::StrCat(p, "down_proj.weight"));
    }
    WeightFactory::StackSlice gu_slice, down_slice;
    if (e != E) {
      gu_slice = {2 * e0, 2 * e, {}, Shape{e, 2 * I, D}};
      down_slice = {e0, e, {}, Shape{e, D, I}};
    }
    ASSIGN_OR_RETURN(lw->experts_gate_up,
                     f_->Stack(gate_up, Shape{I, D}, Shape{E, 2 * I, D}, WeightUse::kMatrix, gu_slice));
    ASSIGN_OR_RETURN(lw->experts_down,
                     f_->Stack(down, Shape{D, I}, Shape{E, D, I}, WeightUse::kMatrix, down_slice));
    return absl::OkStatus();
  }

  absl::Status Attention(int64_t l, const ModelConfig& c, LayerWeights* w) {
    const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, G = c.o_groups;
    const int64_t oL = c.o_lora_rank;
    const TensorShard& s = shard_;
    ASSIGN_OR_RETURN(w->q_a_proj, Matrix(L(l, "self_attn.q_a_proj.weight"), Shape{c.q_lora_rank, D}));
    ASSIGN_OR_RETURN(w->q_a_norm, Param(L(l, "self_attn.q_a_norm.weight"), Shape{c.q_lora_rank}));
    ASSIGN_OR_RETURN(w->q_b_proj, Matrix(L(l, "self_attn.q_b_proj.weight"), Shape{H * hd, c.q_lora_rank},
                                         Cut(0, s.head_begin * hd, s.heads * hd, H * hd)));
    ASSIGN_OR_RETURN(w->kv_proj, Matrix(L(l, "self_attn.kv_proj.weight"), Shape{hd, D}));
    ASSIGN_OR_RETURN(w->kv_norm, Param(L(l, "self_attn.kv_norm.weight"), Shape{hd}));
    WeightCuts oa = Cut(0, s.group_begin * oL, s.groups * oL, G * oL);
    for (const WeightSlice& cut : Cut(1, s.group_col_begin, s.group_cols, (H / G) * hd)) oa.push_back(cut);
    ASSIGN_OR_RETURN(w->o_a_proj, Matrix(L(l, "self_attn.o_a_proj.weight"), Shape{G * oL, (H / G) * hd}, oa));
    ASSIGN_OR_RETURN(w->o_b_proj, Matrix(L(l, "self_attn.o_b_proj.weight"), Shape{D, G * oL},
                                         Cut(1, s.group_begin * oL, s.groups * oL, G * oL)));
    ASSIGN_OR_RETURN(w->sinks, Param(L(l, "self_attn.sinks"), Shape{H}, Cut(0, s.head_begin, s.heads, H)));
    return absl::OkStatus();
  }

  absl::Status Layer(int64_t l, const ModelConfig& c, LayerWeights* w) {
    const int64_t D = c.hidden_size, n = c.hc_mult;
    ASSIGN_OR_RETURN(w->attn_norm, Param(L(l, "input_layernorm.weight"), Shape{D}));
    ASSIGN_OR_RETURN(w->ffn_norm, Param(L(l, "post_attention_layernorm.weight"), Shape{D}));
    ASSIGN_OR_RETURN(w->attn_hc, Hc(L(l, "attn_hc."), c.HcMixDim(), n * D, 3, "fn", "base", "scale"));
    ASSIGN_OR_RETURN(w->ffn_hc, Hc(L(l, "ffn_hc."), c.HcMixDim(), n * D, 3, "fn", "base", "scale"));
    RETURN_IF_ERROR(Attention(l, c, w));
    const AttnType type = c.layer_types[l];
    const int64_t hd = c.head_dim;
    if (type != AttnType::kSliding) {
      const int64_t overlap = type == AttnType::kCsa ? 2 : 1;
      ASSIGN_OR_RETURN(w->compressor, Compressor(L(l, "self_attn.compressor."), c.Ratio(l), overlap,
                                                 hd, D));
    }
    if (type == AttnType::kCsa) {
      const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
      ASSIGN_OR_RETURN(w->index_compressor,
                       Compressor(L(l, "self_attn.compressor.indexer."), c.Ratio(l), 2, dI, D));
      ASSIGN_OR_RETURN(w->index_q_b_proj, Matrix(L(l, "self_attn.compressor.indexer.q_b_proj.weight"),
                                                 Shape{nI * dI, c.q_lora_rank}));
      ASSIGN_OR_RETURN(w->index_weights_proj,
                       Matrix(L(l, "self_attn.compressor.indexer.scorer.weights_proj.weight"),
                              Shape{nI, D}));
    }
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, I = c.moe_intermediate_size;
    // The router stays fp32 on every backend: expert choice is sensitive to rounding.
    ASSIGN_OR_RETURN(w->gate, Param(L(l, "mlp.gate.weight"), Shape{E, D}));
    if (c.mlp_types[l] == MlpType::kHashMoe) {
      ASSIGN_OR_RETURN(w->tid2eid, f_->Index(L(l, "mlp.gate.tid2eid"), Shape{c.vocab_size, K},
                                             static_cast<int32_t>(E)));
    } else {
      ASSIGN_OR_RETURN(w->gate_bias, Param(L(l, "mlp.gate.e_score_correction_bias"), Shape{E}));
    }
    RETURN_IF_ERROR(Experts(l, c, w));
    const int64_t i0 = shard_.shared_begin, i = shard_.shared_inter;
    WeightFactory::StackSlice shared;
    if (i != I) shared = {0, -1, Cut(0, i0, i, I), Shape{2 * i, D}};
    ASSIGN_OR_RETURN(w->shared_gate_up,
                     f_->Stack({L(l, "mlp.shared_experts.gate_proj.weight"),
                                L(l, "mlp.shared_experts.up_proj.weight")},
                               Shape{I, D}, Shape{2 * I, D}, WeightUse::kMatrix, shared));
    ASSIGN_OR_RETURN(w->shared_down, Matrix(L(l, "mlp.shared_experts.down_proj.weight"), Shape{D, I},
                                            Cut(1, i0, i, I)));
    return absl::OkStatus();
  }

 private:
  WeightFactory* f_;
  TensorShard shard_;
};

}  // namespace

QuantFormat ReleasedFormat(const std::string& name) {
  if (absl::StrContains(name, "mlp.experts.")) return QuantFormat::kMxfp4;
  if (absl::StrContains(name, "mlp.shared_experts.")) return QuantFormat::kFp8Block;
  if (absl::StrContains(name, "self_attn.compressor.indexer.q_b_proj")) return QuantFormat::kFp8Block;
  if (absl::StrContains(name, "self_attn.compressor.")) return QuantFormat::kNone;
  for (const char* p : {"self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_proj",
                        "self_attn.o_a_proj", "self_attn.o_b_proj"}) {
    if (absl::StrContains(name, p)) return QuantFormat::kFp8Block;
  }
  return QuantFormat::kNone;
}

std::unique_ptr<WeightFactory> CheckpointWeightFactory(WeightSource* src, Backend* backend,
                                                       bool keep_formats) {
  return std::make_unique<CheckpointWeights>(src, backend, keep_formats);
}

std::unique_ptr<WeightFactory> SyntheticWeightFactory(uint64_t seed, Backend* backend,
                                                      bool released_formats,
                                                      std::vector<int64_t> fp8_block) {
  return std::make_unique<SyntheticWeights>(seed, backend, released_formats, std::move(fp8_block));
}

std::unique_ptr<WeightFactory> CensusWeightFactory(
    std::function<QuantFormat(const std::string&)> format_of, const Backend& backend,
    std::map<std::string, uint64_t>* bytes) {
  return std::make_unique<CensusWeights>(std::move(format_of), backend, bytes);
}

absl::Status LoadWeightTree(const ModelConfig& config, const TensorShard& shard,
                            WeightFactory& factory, ModelWeights* w,
                            const std::function<void(int64_t, int64_t)>& on_layer) {
  Loader load(&factory, shard);
  const int64_t D = config.hidden_size, V = config.vocab_size, n = config.hc_mult;
  ASSIGN_OR_RETURN(w->embed, load.Matrix("model.embed_tokens.weight", Shape{V, D}));
  if (config.tie_word_embeddings && !load.Has("lm_head.weight")) {
    w->head = w->embed;
  } else {
    ASSIGN_OR_RETURN(w->head, load.Matrix("lm_head.weight", Shape{V, D}));
  }
  ASSIGN_OR_RETURN(w->norm, load.Param("model.norm.weight", Shape{D}));
  ASSIGN_OR_RETURN(w->hc_head, load.Hc("model.hc_head.", n, n * D, 1, "hc_fn", "hc_base", "hc_scale"));
  w->layers.resize(config.num_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    RETURN_IF_ERROR(load.Layer(l, config, &w->layers[l]));
    if (on_layer) on_layer(l + 1, config.num_layers);
  }
  return absl::OkStatus();
}

}  // namespace dsv4
