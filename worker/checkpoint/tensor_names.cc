#include "worker/checkpoint/tensor_names.h"

#include <array>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4 {
namespace {

using Pair = std::pair<std::string_view, std::string_view>;

// Official top-level name -> canonical.
constexpr std::array<Pair, 8> kTopLevel = {{
    {"embed.weight", "model.embed_tokens.weight"},
    {"embed_tokens.weight", "model.embed_tokens.weight"},
    {"head.weight", "lm_head.weight"},
    {"lm_head.weight", "lm_head.weight"},
    {"norm.weight", "model.norm.weight"},
    {"hc_head_fn", "model.hc_head.hc_fn"},
    {"hc_head_base", "model.hc_head.hc_base"},
    {"hc_head_scale", "model.hc_head.hc_scale"},
}};

// Official per-layer suffix -> canonical (HF) suffix.
constexpr std::array<Pair, 31> kLayer = {{
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attn.wkv.weight", "self_attn.kv_proj.weight"},
    {"attn.kv_norm.weight", "self_attn.kv_norm.weight"},
    {"attn.norm.weight", "self_attn.kv_norm.weight"},  // transformers 5.17 save_pretrained
    {"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
    {"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
    {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
    {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
    {"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"},
    {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
    {"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {"ffn.gate.weight", "mlp.gate.weight"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
    {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
}};

constexpr std::array<Pair, 2> kLayerExtra = {{
    {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
}};

// Official expert projection -> canonical.
constexpr std::array<Pair, 3> kExpert = {{
    {"w1", "gate_proj"},
    {"w3", "up_proj"},
    {"w2", "down_proj"},
}};

std::optional<std::string_view> Lookup(std::string_view key, const auto& table) {
  for (const auto& [from, to] : table) {
    if (key == from) return to;
  }
  return std::nullopt;
}

// Maps a per-layer suffix (after `layers.N.`), without any `.scale` handling.
std::string MapLayerSuffix(std::string_view suffix) {
  if (auto hit = Lookup(suffix, kLayer)) return std::string(*hit);
  if (auto hit = Lookup(suffix, kLayerExtra)) return std::string(*hit);
  // ffn.experts.E.wX.weight
  if (suffix.starts_with("ffn.experts.")) {
    std::string_view rest = suffix.substr(12);
    const size_t dot = rest.find('.');
    uint32_t expert = 0;
    if (dot != std::string_view::npos && absl::SimpleAtoi(AV(rest.substr(0, dot)), &expert)) {
      std::string_view proj = rest.substr(dot + 1);
      if (proj.ends_with(".weight")) {
        if (auto hit = Lookup(proj.substr(0, proj.size() - 7), kExpert)) {
          return absl::StrCat("mlp.experts.", expert, ".", AV(*hit), ".weight");
        }
      }
    }
  }
  return std::string(suffix);
}

}  // namespace

std::optional<std::string> CanonicalTensorName(std::string_view name) {
  std::string_view s = name;
  if (s.starts_with("model.")) s.remove_prefix(6);
  if (s.starts_with("mtp.")) return std::nullopt;
  // Official FP8 scale: `<stem>.scale` next to `<stem>.weight`.
  bool scale = false;
  std::string stem_weight;
  if (s.ends_with(".scale") && !s.ends_with("_hc.scale")) {
    stem_weight = absl::StrCat(AV(s.substr(0, s.size() - 6)), ".weight");
    s = stem_weight;
    scale = true;
  }
  std::string canonical;
  if (auto hit = Lookup(s, kTopLevel)) {
    canonical = std::string(*hit);
  } else if (s.starts_with("hc_head.")) {
    canonical = absl::StrCat("model.", AV(s));
  } else if (s.starts_with("layers.")) {
    std::string_view rest = s.substr(7);
    const size_t dot = rest.find('.');
    uint32_t layer = 0;
    if (dot == std::string_view::npos || !absl::SimpleAtoi(AV(rest.substr(0, dot)), &layer)) {
      return std::string(name);
    }
    canonical = absl::StrCat("model.layers.", layer, ".", MapLayerSuffix(rest.substr(dot + 1)));
  } else {
    return std::string(name);
  }
  if (scale) {
    canonical = absl::StrCat(canonical.substr(0, canonical.size() - 7), ".weight_scale_inv");
  }
  return canonical;
}

}  // namespace dsv4
