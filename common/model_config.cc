#include "common/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status.h"

namespace dsv4 {
namespace {

// Generous ceilings: far above every real DSV4 config, low enough that products of dimensions
// cannot overflow 64-bit sizes.
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxExperts = 1 << 16;
constexpr int64_t kMaxPositions = int64_t{1} << 31;

absl::Status Invalid(std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", AV(field), " ", AV(problem)));
}

// Reads an integer field with a default, checking min <= value <= max.
absl::StatusOr<int64_t> IntField(const Json& j, std::string_view key, int64_t def, int64_t min,
                                 int64_t max, bool required = false) {
  ASSIGN_OR_RETURN(auto v, OptInt(j, key, ""));
  if (!v.has_value()) {
    if (required) return Invalid(key, "is required");
    return def;
  }
  if (*v < min || *v > max) {
    return Invalid(key, absl::StrCat("= ", *v, " is out of range [", min, ", ", max, "]"));
  }
  return *v;
}

absl::StatusOr<double> DoubleField(const Json& j, std::string_view key, double def) {
  ASSIGN_OR_RETURN(auto v, OptDouble(j, key, ""));
  return v.value_or(def);
}

absl::StatusOr<AttnType> ParseAttnType(const Json& v, size_t i) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "sliding_attention") return AttnType::kSliding;
    if (s == "compressed_sparse_attention") return AttnType::kCsa;
    if (s == "heavily_compressed_attention") return AttnType::kHca;
  }
  return Invalid(absl::StrCat("layer_types[", i, "]"),
                 "must be one of sliding_attention, compressed_sparse_attention, "
                 "heavily_compressed_attention");
}

// Reads a rope dict (nested `main`/`compress`, a flat `rope_parameters`, or legacy
// `rope_scaling`). Only rope_type default/yarn are supported.
absl::Status ParseRopeDict(const Json& d, std::string_view where, RopeConfig* rope,
                           double max_positions) {
  if (!d.is_object()) return Invalid(where, "must be an object");
  std::optional<std::string> type;
  ASSIGN_OR_RETURN(type, OptString(d, "rope_type", where));
  if (!type.has_value()) {
    ASSIGN_OR_RETURN(type, OptString(d, "type", where));
  }
  ASSIGN_OR_RETURN(auto theta, OptDouble(d, "rope_theta", where));
  if (theta.has_value()) rope->theta = *theta;
  const std::string t = type.value_or("default");
  if (t == "default") {
    rope->yarn = false;
    return absl::OkStatus();
  }
  if (t != "yarn") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: ", AV(where), ".rope_type = \"", t,
                     "\" is not supported (DSV4 uses default and yarn)"));
  }
  rope->yarn = true;
  ASSIGN_OR_RETURN(auto factor, OptDouble(d, "factor", where));
  ASSIGN_OR_RETURN(auto orig, OptInt(d, "original_max_position_embeddings", where));
  ASSIGN_OR_RETURN(auto beta_fast, OptDouble(d, "beta_fast", where));
  ASSIGN_OR_RETURN(auto beta_slow, OptDouble(d, "beta_slow", where));
  ASSIGN_OR_RETURN(auto attention_factor, OptDouble(d, "attention_factor", where));
  ASSIGN_OR_RETURN(auto truncate, OptBool(d, "truncate", where));
  if (truncate.has_value() && !*truncate) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: ", AV(where), ".truncate = false is not supported"));
  }
  if (attention_factor.has_value() && *attention_factor != 1.0) {
    LogWarning("config_rope_attention_factor_ignored",
               {{"field", absl::StrCat(AV(where), ".attention_factor")},
                {"value", *attention_factor},
                {"reason", "DSV4 applies no YaRN mscale; using 1"}});
  }
  // transformers 5.17 (checked against the dsv4-tiny fixture, whose factor 4 differs from
  // max_position_embeddings / original_max_position_embeddings = 64): the interpolation factor is
  // the dict's `factor`; only when it is absent is it derived from the two context lengths. The
  // correction range uses original_max_position_embeddings (default: max_position_embeddings).
  if (orig.has_value() && (*orig < 1 || *orig > kMaxPositions)) {
    return Invalid(absl::StrCat(AV(where), ".original_max_position_embeddings"), "must be >= 1");
  }
  rope->original_max_position = orig.value_or(static_cast<int64_t>(max_positions));
  if (factor.has_value()) {
    rope->factor = *factor;
  } else if (orig.has_value()) {
    rope->factor = max_positions / static_cast<double>(*orig);
  } else {
    return Invalid(absl::StrCat(AV(where), ".factor"), "is required for yarn");
  }
  if (!(rope->factor > 0)) return Invalid(absl::StrCat(AV(where), ".factor"), "must be > 0");
  rope->beta_fast = beta_fast.value_or(32.0);
  rope->beta_slow = beta_slow.value_or(1.0);
  if (!(rope->beta_fast > 0) || !(rope->beta_slow > 0)) {
    return Invalid(absl::StrCat(AV(where), ".beta_fast/beta_slow"), "must be > 0");
  }
  if (rope->beta_fast < rope->beta_slow) {
    return Invalid(absl::StrCat(AV(where), ".beta_fast"), "must be >= beta_slow");
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view AttnTypeName(AttnType t) {
  switch (t) {
    case AttnType::kSliding: return "sliding_attention";
    case AttnType::kCsa: return "compressed_sparse_attention";
    case AttnType::kHca: return "heavily_compressed_attention";
  }
  return "?";
}

std::string_view MlpTypeName(MlpType t) { return t == MlpType::kHashMoe ? "hash_moe" : "moe"; }

int64_t ModelConfig::Ratio(int64_t layer) const {
  switch (layer_types[layer]) {
    case AttnType::kSliding: return 0;
    case AttnType::kCsa: return csa_ratio;
    case AttnType::kHca: return hca_ratio;
  }
  return 0;
}

bool ModelConfig::HasLayerType(AttnType t) const {
  return std::find(layer_types.begin(), layer_types.end(), t) != layer_types.end();
}

std::string ModelConfig::Summary() const {
  std::vector<std::string> types;
  for (AttnType t : layer_types) {
    types.push_back(t == AttnType::kSliding ? "S" : t == AttnType::kCsa ? "C" : "H");
  }
  return absl::StrCat("layers=", num_layers, " [", absl::StrJoin(types, ""), "] D=", hidden_size,
                      " H=", num_heads, "x", head_dim, " rd=", rope_dims, " q_lora=", q_lora_rank,
                      " G=", o_groups, "x", o_lora_rank, " W=", sliding_window,
                      " ratios=", csa_ratio, "/", hca_ratio, " indexer=", index_n_heads, "x",
                      index_head_dim, " top", index_topk, " hc=", hc_mult, " E=", n_routed_experts,
                      " K=", num_experts_per_tok, " I=", moe_intermediate_size, " V=", vocab_size);
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  ASSIGN_OR_RETURN(Json j, ParseJson(json_text, "config.json"));
  if (!j.is_object()) return Invalid("(top level)", "must be a JSON object");
  ModelConfig c;

  ASSIGN_OR_RETURN(auto model_type, OptString(j, "model_type", ""));
  if (model_type.has_value() && *model_type != "deepseek_v4") {
    return Invalid("model_type", absl::StrCat("= \"", *model_type, "\"; expected \"deepseek_v4\""));
  }
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("architectures", "must be a list");
    bool found = false;
    for (const auto& a : *it) found |= a.is_string() && a.get<std::string>() == "DeepseekV4ForCausalLM";
    if (!found) return Invalid("architectures", "must include \"DeepseekV4ForCausalLM\"");
  }

  ASSIGN_OR_RETURN(c.vocab_size, IntField(j, "vocab_size", /*def=*/0, 1, kMaxVocab, /*required=*/true));
  ASSIGN_OR_RETURN(c.hidden_size, IntField(j, "hidden_size", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.num_layers, IntField(j, "num_hidden_layers", /*def=*/0, 1, kMaxLayers, /*required=*/true));
  ASSIGN_OR_RETURN(c.num_heads, IntField(j, "num_attention_heads", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(auto kv_heads, IntField(j, "num_key_value_heads", 1, 1, kMaxDim));
  if (kv_heads != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "config.json: num_key_value_heads = ", kv_heads, "; DSV4 has one shared K=V latent"));
  }
  ASSIGN_OR_RETURN(c.head_dim, IntField(j, "head_dim", /*def=*/0, 2, kMaxDim, /*required=*/true));
  if (c.head_dim % 2 != 0) return Invalid("head_dim", "must be even");
  ASSIGN_OR_RETURN(c.q_lora_rank, IntField(j, "q_lora_rank", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.o_groups, IntField(j, "o_groups", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.o_lora_rank, IntField(j, "o_lora_rank", /*def=*/0, 1, kMaxDim, /*required=*/true));
  if (c.num_heads % c.o_groups != 0) {
    return Invalid("num_attention_heads",
                   absl::StrCat("= ", c.num_heads, " is not divisible by o_groups = ", c.o_groups));
  }
  ASSIGN_OR_RETURN(c.sliding_window, IntField(j, "sliding_window", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   IntField(j, "max_position_embeddings", /*def=*/0, 1, kMaxPositions, /*required=*/true));

  // Rotary dims: legacy qk_rope_head_dim, or partial_rotary_factor * head_dim.
  ASSIGN_OR_RETURN(auto legacy_rd, OptInt(j, "qk_rope_head_dim", ""));
  ASSIGN_OR_RETURN(auto prf, OptDouble(j, "partial_rotary_factor", ""));
  if (prf.has_value() && !(*prf > 0 && *prf <= 1)) {
    return Invalid("partial_rotary_factor", "must be in (0, 1]");
  }
  if (legacy_rd.has_value()) {
    c.rope_dims = *legacy_rd;
    if (prf.has_value() && static_cast<int64_t>(c.head_dim * *prf) != c.rope_dims) {
      return Invalid("qk_rope_head_dim",
                     absl::StrCat("= ", c.rope_dims, " disagrees with partial_rotary_factor * "
                                  "head_dim = ", static_cast<int64_t>(c.head_dim * *prf)));
    }
  } else {
    c.rope_dims = static_cast<int64_t>(c.head_dim * prf.value_or(0.125));
  }
  if (c.rope_dims < 2 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    return Invalid("qk_rope_head_dim", absl::StrCat("= ", c.rope_dims,
                                                    " must be even and in [2, head_dim]"));
  }

  // Compression rates: compress_rates dict, or legacy compress_rate_csa / compress_rate_hca.
  ASSIGN_OR_RETURN(c.csa_ratio, IntField(j, "compress_rate_csa", 4, 1, kMaxDim));
  ASSIGN_OR_RETURN(c.hca_ratio, IntField(j, "compress_rate_hca", 128, 1, kMaxDim));
  if (auto it = j.find("compress_rates"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("compress_rates", "must be an object");
    for (const auto& [key, value] : it->items()) {
      const std::string where = absl::StrCat("compress_rates.", key);
      ASSIGN_OR_RETURN(int64_t rate, JsonToInt(value, where));
      if (rate < 1 || rate > kMaxDim) return Invalid(where, "must be >= 1");
      if (key == "compressed_sparse_attention") {
        c.csa_ratio = rate;
      } else if (key == "heavily_compressed_attention") {
        c.hca_ratio = rate;
      } else {
        return Invalid(where, "is not a compressed layer type");
      }
    }
  }

  // Layer schedule: layer_types, or the official per-layer compress_ratios (truncated to L; the
  // tail entries belong to MTP layers).
  std::vector<AttnType> from_ratios;
  if (auto it = j.find("compress_ratios"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("compress_ratios", "must be a list");
    if (static_cast<int64_t>(it->size()) < c.num_layers) {
      return Invalid("compress_ratios", absl::StrCat("has ", it->size(), " entries; need at least "
                                                     "num_hidden_layers = ", c.num_layers));
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string where = absl::StrCat("compress_ratios[", i, "]");
      ASSIGN_OR_RETURN(int64_t r, JsonToInt((*it)[i], where));
      if (r == 0) {
        from_ratios.push_back(AttnType::kSliding);
      } else if (r == c.csa_ratio) {
        from_ratios.push_back(AttnType::kCsa);
      } else if (r == c.hca_ratio) {
        from_ratios.push_back(AttnType::kHca);
      } else {
        return Invalid(where, absl::StrCat("= ", r, " matches neither 0, the CSA rate ",
                                           c.csa_ratio, " nor the HCA rate ", c.hca_ratio));
      }
    }
  }
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("layer_types", "must be a list");
    if (static_cast<int64_t>(it->size()) != c.num_layers) {
      return Invalid("layer_types", absl::StrCat("has ", it->size(),
                                                 " entries; num_hidden_layers = ", c.num_layers));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(AttnType t, ParseAttnType((*it)[i], i));
      c.layer_types.push_back(t);
    }
    if (!from_ratios.empty() && from_ratios != c.layer_types) {
      return Invalid("layer_types", "disagrees with compress_ratios");
    }
  } else if (!from_ratios.empty()) {
    c.layer_types = std::move(from_ratios);
  } else {
    return Invalid("layer_types",
                   "is missing (and so is compress_ratios); refusing to guess the layer schedule");
  }
  if (c.csa_ratio == c.hca_ratio && c.HasLayerType(AttnType::kCsa) &&
      c.HasLayerType(AttnType::kHca)) {
    return Invalid("compress_rates", "CSA and HCA rates must differ");
  }
  for (AttnType t : {AttnType::kCsa, AttnType::kHca}) {
    const int64_t ratio = t == AttnType::kCsa ? c.csa_ratio : c.hca_ratio;
    if (c.HasLayerType(t) && ratio > c.sliding_window) {
      // Still well defined (transformers runs it), but the tokens of an open compression window
      // that fall outside the raw window are seen by no query until their window closes.
      LogWarning("config_ratio_exceeds_window",
                 {{"layer_type", AttnTypeName(t)},
                  {"ratio", ratio},
                  {"sliding_window", c.sliding_window},
                  {"effect", "open-window tokens outside the raw window are invisible"}});
    }
  }

  // MLP schedule: mlp_layer_types, or legacy num_hash_layers (first N layers hash-routed).
  if (auto it = j.find("mlp_layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("mlp_layer_types", "must be a list");
    if (static_cast<int64_t>(it->size()) != c.num_layers) {
      return Invalid("mlp_layer_types", absl::StrCat("has ", it->size(),
                                                     " entries; num_hidden_layers = ", c.num_layers));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& v = (*it)[i];
      if (v.is_string() && v.get<std::string>() == "hash_moe") {
        c.mlp_types.push_back(MlpType::kHashMoe);
      } else if (v.is_string() && v.get<std::string>() == "moe") {
        c.mlp_types.push_back(MlpType::kMoe);
      } else {
        return Invalid(absl::StrCat("mlp_layer_types[", i, "]"), "must be \"hash_moe\" or \"moe\"");
      }
    }
  } else {
    ASSIGN_OR_RETURN(int64_t hash_layers,
                     IntField(j, "num_hash_layers", std::min<int64_t>(3, c.num_layers), 0,
                              c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      c.mlp_types.push_back(i < hash_layers ? MlpType::kHashMoe : MlpType::kMoe);
    }
  }

  // Indexer (CSA layers only, but always validated when present).
  const bool has_csa = c.HasLayerType(AttnType::kCsa);
  ASSIGN_OR_RETURN(c.index_n_heads, IntField(j, "index_n_heads", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.index_head_dim, IntField(j, "index_head_dim", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.index_topk, IntField(j, "index_topk", /*def=*/0, 1, kMaxPositions, /*required=*/true));
  if (has_csa && c.rope_dims > c.index_head_dim) {
    return Invalid("index_head_dim", absl::StrCat("= ", c.index_head_dim,
                                                  " is smaller than qk_rope_head_dim = ",
                                                  c.rope_dims));
  }

  // mHC.
  ASSIGN_OR_RETURN(c.hc_mult, IntField(j, "hc_mult", /*def=*/0, 1, 64, /*required=*/true));
  ASSIGN_OR_RETURN(c.hc_sinkhorn_iters, IntField(j, "hc_sinkhorn_iters", 20, 1, 10000));
  ASSIGN_OR_RETURN(c.hc_eps, DoubleField(j, "hc_eps", 1e-6));
  if (c.hc_eps < 0) return Invalid("hc_eps", "must be >= 0");
  ASSIGN_OR_RETURN(c.rms_norm_eps, DoubleField(j, "rms_norm_eps", 1e-6));
  if (!(c.rms_norm_eps > 0)) return Invalid("rms_norm_eps", "must be > 0");

  // MoE.
  ASSIGN_OR_RETURN(c.n_routed_experts, IntField(j, "n_routed_experts", /*def=*/0, 1, kMaxExperts, /*required=*/true));
  ASSIGN_OR_RETURN(c.num_experts_per_tok,
                   IntField(j, "num_experts_per_tok", /*def=*/0, 1, c.n_routed_experts, /*required=*/true));
  ASSIGN_OR_RETURN(int64_t inter, IntField(j, "intermediate_size", 2048, 1, kMaxDim));
  ASSIGN_OR_RETURN(c.moe_intermediate_size, IntField(j, "moe_intermediate_size", /*def=*/0, 1, kMaxDim, /*required=*/true));
  ASSIGN_OR_RETURN(c.routed_scaling_factor, DoubleField(j, "routed_scaling_factor", 1.5));
  if (!(c.routed_scaling_factor > 0)) return Invalid("routed_scaling_factor", "must be > 0");
  ASSIGN_OR_RETURN(c.swiglu_limit, DoubleField(j, "swiglu_limit", 10.0));
  if (!(c.swiglu_limit > 0)) return Invalid("swiglu_limit", "must be > 0");
  ASSIGN_OR_RETURN(auto scoring, OptString(j, "scoring_func", ""));
  if (scoring.has_value() && *scoring != "sqrtsoftplus") {
    return absl::UnimplementedError(absl::StrCat("config.json: scoring_func = \"", *scoring,
                                                 "\" is not supported (expected sqrtsoftplus)"));
  }
  ASSIGN_OR_RETURN(auto act, OptString(j, "hidden_act", ""));
  if (act.has_value() && *act != "silu") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: hidden_act = \"", *act, "\" is not supported (expected silu)"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(auto b, OptBool(j, key, ""));
    if (b.value_or(false)) {
      return absl::UnimplementedError(absl::StrCat("config.json: ", key, " = true is not supported"));
    }
  }
  ASSIGN_OR_RETURN(auto shared, IntField(j, "n_shared_experts", 1, 0, kMaxExperts));
  if (shared != 1) {
    // HF builds exactly one shared expert whatever this says; so do we.
    LogWarning("config_n_shared_experts", {{"value", shared}, {"using", 1}});
  }
  ASSIGN_OR_RETURN(auto tie, OptBool(j, "tie_word_embeddings", ""));
  c.tie_word_embeddings = tie.value_or(false);

  // Special tokens.
  ASSIGN_OR_RETURN(c.bos_token_id, IntField(j, "bos_token_id", 0, 0, c.vocab_size - 1));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        ASSIGN_OR_RETURN(int64_t id, JsonToInt((*it)[i], absl::StrCat("eos_token_id[", i, "]")));
        c.eos_token_ids.push_back(id);
      }
    } else {
      ASSIGN_OR_RETURN(int64_t id, JsonToInt(*it, "eos_token_id"));
      c.eos_token_ids.push_back(id);
    }
  } else {
    c.eos_token_ids.push_back(1);
  }
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return Invalid("eos_token_id", absl::StrCat("= ", id, " is outside the vocabulary"));
    }
  }

  // RoPE. main: rope_theta, default. compress: compress_rope_theta + YaRN from (in order of
  // precedence) rope_parameters.compress, a flat rope_parameters, legacy rope_scaling, or the
  // official top-level keys (rope_factor, original_seq_len, beta_fast, beta_slow).
  ASSIGN_OR_RETURN(c.main_rope.theta, DoubleField(j, "rope_theta", 10000.0));
  ASSIGN_OR_RETURN(c.compress_rope.theta, DoubleField(j, "compress_rope_theta", 160000.0));
  const double max_pos = static_cast<double>(c.max_position_embeddings);
  const Json* rope_params = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) rope_params = &*it;
  const Json* rope_scaling = nullptr;
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) rope_scaling = &*it;
  if (rope_params != nullptr && !rope_params->is_object()) {
    return Invalid("rope_parameters", "must be an object");
  }
  if (rope_params != nullptr && (rope_params->contains("main") || rope_params->contains("compress"))) {
    for (const char* key : {"main", "compress"}) {
      auto it = rope_params->find(key);
      if (it == rope_params->end()) continue;
      RopeConfig* rope = std::string_view(key) == "main" ? &c.main_rope : &c.compress_rope;
      RETURN_IF_ERROR(ParseRopeDict(*it, absl::StrCat("rope_parameters.", key), rope, max_pos));
      ASSIGN_OR_RETURN(auto nested_prf, OptDouble(*it, "partial_rotary_factor", ""));
      if (nested_prf.has_value() &&
          static_cast<int64_t>(c.head_dim * *nested_prf) != c.rope_dims) {
        return Invalid(absl::StrCat("rope_parameters.", key, ".partial_rotary_factor"),
                       absl::StrCat("gives ", static_cast<int64_t>(c.head_dim * *nested_prf),
                                    " rotary dims; qk_rope_head_dim = ", c.rope_dims));
      }
    }
  } else if (rope_params != nullptr || rope_scaling != nullptr) {
    const Json& d = rope_params != nullptr ? *rope_params : *rope_scaling;
    const char* where = rope_params != nullptr ? "rope_parameters" : "rope_scaling";
    RopeConfig flat;
    flat.theta = c.compress_rope.theta;
    RETURN_IF_ERROR(ParseRopeDict(d, where, &flat, max_pos));
    if (flat.yarn) {
      flat.theta = c.compress_rope.theta;  // the flat dict's rope_theta is the main base
      c.compress_rope = flat;
    }
  } else {
    ASSIGN_OR_RETURN(auto rope_factor, OptDouble(j, "rope_factor", ""));
    ASSIGN_OR_RETURN(auto orig, OptInt(j, "original_seq_len", ""));
    if (rope_factor.has_value() || orig.has_value()) {
      Json d = {{"rope_type", "yarn"}};
      if (rope_factor.has_value()) d["factor"] = *rope_factor;
      if (orig.has_value()) d["original_max_position_embeddings"] = *orig;
      for (const char* key : {"beta_fast", "beta_slow"}) {
        if (auto it = j.find(key); it != j.end()) d[key] = *it;
      }
      RETURN_IF_ERROR(ParseRopeDict(d, "(top-level yarn keys)", &c.compress_rope, max_pos));
    }
  }
  if (c.main_rope.yarn) {
    return absl::UnimplementedError(
        "config.json: rope_parameters.main must be the default rope (YaRN applies only to the "
        "compress rope)");
  }
  for (const RopeConfig* r : {&c.main_rope, &c.compress_rope}) {
    if (!(r->theta > 1.0)) return Invalid("rope_theta/compress_rope_theta", "must be > 1");
  }

  // Quantisation seam: recorded, consumed by the weight loader.
  if (auto it = j.find("quantization_config"); it != j.end() && it->is_object()) {
    ASSIGN_OR_RETURN(auto method, OptString(*it, "quant_method", "quantization_config"));
    c.quant_method = method.value_or("");
    if (auto b = it->find("weight_block_size"); b != it->end() && b->is_array() && b->size() == 2) {
      for (int i = 0; i < 2; ++i) {
        ASSIGN_OR_RETURN(c.quant_block[i],
                         JsonToInt((*b)[i], "quantization_config.weight_block_size"));
        if (c.quant_block[i] < 1) return Invalid("quantization_config.weight_block_size", "must be >= 1");
      }
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 16 << 20));
  auto config = ParseModelConfig(text);
  if (!config.ok()) return Annotate(config.status(), path);
  return config;
}

std::vector<float> RopeInvFreq(const RopeConfig& rope, int64_t rope_dims) {
  // Mirrors HF's fp32 arithmetic: pos_freqs = base ** (arange(0, dim, 2) / dim).
  const int64_t half = rope_dims / 2;
  const float base = static_cast<float>(rope.theta);
  std::vector<float> inv(half);
  for (int64_t p = 0; p < half; ++p) {
    const float exponent = static_cast<float>(2 * p) / static_cast<float>(rope_dims);
    const float pos_freq = std::pow(base, exponent);
    inv[p] = 1.0f / pos_freq;
  }
  if (!rope.yarn) return inv;
  const double dim = static_cast<double>(rope_dims);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(rope.original_max_position) /
                          (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(rope.theta));
  };
  double low = std::floor(correction_dim(rope.beta_fast));
  double high = std::ceil(correction_dim(rope.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  float lo = static_cast<float>(low);
  float hi = static_cast<float>(high);
  if (lo == hi) hi += 0.001f;
  const float factor = static_cast<float>(rope.factor);
  for (int64_t p = 0; p < half; ++p) {
    const float exponent = static_cast<float>(2 * p) / static_cast<float>(rope_dims);
    const float pos_freq = std::pow(base, exponent);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(p) - lo) / (hi - lo), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[p] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

}  // namespace dsv4
