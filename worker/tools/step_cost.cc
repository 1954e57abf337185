#include "worker/tools/step_cost.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

WeightBytes StepWeightBytes(bool gpu, const std::string& precision, const std::string& format) {
  const double dense = gpu && precision != "fp32" ? 2.0 : 4.0;
  if (!gpu || format != "auto") return {dense, dense, dense};
  return {dense, 1.0 + 4.0 / (128 * 128), 0.5 + 1.0 / 32};
}

namespace {

// Elements of the FP8 projections of a layer (wq_a, wq_b, wkv, wo_a, wo_b, indexer query).
double Fp8Elements(const ModelConfig& c, int64_t layer) {
  const double D = c.hidden_size, H = c.num_heads, hd = c.head_dim, q = c.q_lora_rank;
  double e = q * D + H * hd * q + hd * D + c.o_lora_rank * H * hd + D * c.o_groups * c.o_lora_rank;
  if (c.layer_types[layer] == AttnType::kCsa) e += c.index_n_heads * c.index_head_dim * q;
  return e;
}

// Elements of the dense (bf16/fp32) projections: compressors, the indexer's compressor and head
// weights.
double DenseElements(const ModelConfig& c, int64_t layer) {
  const double D = c.hidden_size, hd = c.head_dim;
  double e = 0;
  if (c.Ratio(layer) > 0) {
    const bool csa = c.layer_types[layer] == AttnType::kCsa;
    e += 2.0 * (csa ? 2 : 1) * hd * D;  // kv + gate
    if (csa) e += 2.0 * 2 * c.index_head_dim * D + c.index_n_heads * D;
  }
  return e;
}

// The two mHC mixes of a layer (attention and MoE: fn [(2+n)n, nD], fp32).
double HcElements(const ModelConfig& c) { return 2.0 * c.HcMixDim() * c.hc_mult * c.hidden_size; }

double ExpertElements(const ModelConfig& c) {
  return 3.0 * c.hidden_size * c.moe_intermediate_size;
}

double DistinctExperts(const ModelConfig& c, double picks_by_tokens) {
  const double E = c.n_routed_experts, K = c.num_experts_per_tok;
  return E * (1.0 - std::pow(1.0 - K / E, picks_by_tokens));
}

}  // namespace

double LayerGemmMacsPerToken(const ModelConfig& c, int64_t layer) {
  const double router = static_cast<double>(c.n_routed_experts) * c.hidden_size;
  const double experts = (1.0 + c.num_experts_per_tok) * ExpertElements(c);  // shared + K routed
  return Fp8Elements(c, layer) + DenseElements(c, layer) + HcElements(c) + router + experts;
}

double DecodeStepBytes(const ModelConfig& c, int64_t batch, int64_t ctx, const WeightBytes& w) {
  const double D = c.hidden_size, hd = c.head_dim;
  const double distinct = DistinctExperts(c, static_cast<double>(batch));
  double bytes = c.vocab_size * D * w.dense + batch * D * w.dense;  // lm_head + embedding rows
  for (int64_t l = 0; l < c.num_layers; ++l) {
    double state = c.sliding_window * hd * 4.0;  // the window ring (fp32)
    const int64_t ratio = c.Ratio(l);
    if (ratio > 0) {
      const double entries = std::floor(static_cast<double>(ctx + 1) / ratio);
      if (c.layer_types[l] == AttnType::kCsa) {
        state += entries * c.index_head_dim * 4.0 + std::min<double>(entries, c.index_topk) * hd * 4.0;
      } else {
        state += entries * hd * 4.0;
      }
    }
    const double shared = ExpertElements(c) * w.fp8;
    const double mlp = distinct * ExpertElements(c) * w.experts + shared + c.n_routed_experts * D * 4.0;
    bytes += Fp8Elements(c, l) * w.fp8 + DenseElements(c, l) * w.dense + mlp + batch * state;
  }
  return bytes;
}

PrefillCost PrefillStepCost(const ModelConfig& c, int64_t batch, int64_t tokens,
                            const WeightBytes& w) {
  PrefillCost cost;
  const double B = static_cast<double>(batch), T = static_cast<double>(tokens);
  const double D = c.hidden_size, H = c.num_heads, hd = c.head_dim;
  // The sampled rows' head (the HyperHead mix and the vocabulary projection).
  double macs = B * (c.vocab_size * D + c.hc_mult * c.hc_mult * D);
  double attn_macs = 0, index_macs = 0;
  const double distinct = DistinctExperts(c, B * T);
  cost.bytes = c.vocab_size * D * w.dense + B * T * D * w.dense;
  double routed_macs = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    macs += B * T * LayerGemmMacsPerToken(c, l);
    routed_macs += B * T * c.num_experts_per_tok * ExpertElements(c);
    const int64_t ratio = c.Ratio(l);
    const bool csa = c.layer_types[l] == AttnType::kCsa;
    // Keys each query sees: its window and, in compressed layers, the entries it may attend to.
    double keys = 0, scored = 0;
    for (int64_t p = 0; p < tokens; ++p) {
      keys += static_cast<double>(std::min<int64_t>(p + 1, c.sliding_window));
      if (ratio <= 0) continue;
      const int64_t visible = (p + 1) / ratio;
      if (!csa) {
        keys += static_cast<double>(visible);
      } else {
        keys += static_cast<double>(std::min<int64_t>(visible, c.index_topk));
        if (visible > c.index_topk) scored += static_cast<double>(visible);
      }
    }
    attn_macs += B * keys * 2.0 * H * hd;  // q.k and p.v per head and key
    index_macs += B * scored * c.index_n_heads * c.index_head_dim;
    // Weights read once; the state written: window ring and compressed entries (fp32).
    const double entries = ratio > 0 ? std::floor(T / ratio) : 0;
    const double state = std::min<double>(T, c.sliding_window) * hd * 4.0 +
                         entries * (hd + (csa ? c.index_head_dim : 0)) * 4.0;
    cost.bytes += Fp8Elements(c, l) * w.fp8 + DenseElements(c, l) * w.dense + HcElements(c) * 4.0 +
                  (distinct * ExpertElements(c) * w.experts + ExpertElements(c) * w.fp8) +
                  c.n_routed_experts * D * 4.0 + B * state;
  }
  cost.gemm_flops = 2.0 * macs;
  cost.routed_expert_flops = 2.0 * routed_macs;
  cost.attention_flops = 2.0 * attn_macs;
  cost.indexer_flops = 2.0 * index_macs;
  return cost;
}

}  // namespace dsv4
