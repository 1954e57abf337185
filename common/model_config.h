// DeepSeek-V4 model configuration, parsed from a Hugging Face `config.json` of
// `DeepseekV4ForCausalLM` (and the legacy/official key spellings). See
// ../shared/design/dsv4-model.md §1. Shared by the coordinator (vocab, limits, special tokens)
// and the workers (every shape).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4 {

enum class AttnType { kSliding, kCsa, kHca };
enum class MlpType { kHashMoe, kMoe };

std::string_view AttnTypeName(AttnType t);  // "sliding_attention", ...
std::string_view MlpTypeName(MlpType t);    // "hash_moe" / "moe"

// One rotary embedding: plain (default) or YaRN-scaled. The attention factor is always 1 for
// DSV4 (dsv4-model.md §1.3): cos/sin are never scaled.
struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;                      // YaRN interpolation factor (HF semantics)
  int64_t original_max_position = 0;        // YaRN original context
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // D
  int64_t num_layers = 0;           // L
  int64_t num_heads = 0;            // H
  int64_t head_dim = 0;             // hd
  int64_t rope_dims = 0;            // rd = qk_rope_head_dim, the rotated trailing dims
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;             // G
  int64_t o_lora_rank = 0;          // R
  int64_t sliding_window = 0;       // raw window including the current token
  std::vector<AttnType> layer_types;
  std::vector<MlpType> mlp_types;
  int64_t csa_ratio = 4;            // m
  int64_t hca_ratio = 128;          // m'
  RopeConfig main_rope;             // sliding layers
  RopeConfig compress_rope;         // CSA/HCA layers, their compressors and indexers
  int64_t max_position_embeddings = 0;
  int64_t index_n_heads = 0;        // nI
  int64_t index_head_dim = 0;       // dI
  int64_t index_topk = 0;
  int64_t hc_mult = 0;              // n
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int64_t n_routed_experts = 0;     // E
  int64_t num_experts_per_tok = 0;  // K
  int64_t moe_intermediate_size = 0;  // I
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 10.0;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  std::vector<int64_t> eos_token_ids;
  // Informational: "fp8" when the checkpoint declares FP8 block-scaled weights.
  std::string quant_method;
  std::vector<int64_t> quant_block = {128, 128};

  // Compression ratio of layer `l` (0 for sliding layers).
  int64_t Ratio(int64_t layer) const;
  bool HasLayerType(AttnType t) const;
  // Number of mHC mixing coefficients: (2 + n) * n.
  int64_t HcMixDim() const { return (2 + hc_mult) * hc_mult; }
  // One-line summary for logs.
  std::string Summary() const;
};

// Parses and validates `config.json` text. Every problem gives InvalidArgument (or Unimplemented
// for valid-but-unsupported features) with a message naming the field.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);
// Reads `path` (a config.json file) and parses it.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// YaRN inverse frequencies (fp32, as HF computes them) for `rope_dims` rotated dims: rope_dims/2
// values theta_p, p = 0..rope_dims/2-1.
std::vector<float> RopeInvFreq(const RopeConfig& rope, int64_t rope_dims);

}  // namespace dsv4
