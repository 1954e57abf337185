// What a step of the model must do at least: the bytes it reads (the decode roofline) and, for a
// prefill, the FLOPs it must compute, split into the GEMMs (every projection, the compressors and
// indexer projections, the mHC mixes, the shared and the chosen routed experts, the router and
// the sampled rows' head), the attention (QK and PV over the window and the compressed entries
// each query sees) and the indexer's scoring (every visible compressed entry, per query, in
// compressed-sparse layers once there are more than index_topk of them, as the engine skips it
// below that). `dsv4-node bench` prints them next to the measured times; the model is
// ../shared/design/dsv4-model.md §5-§10. Elementwise work (norms, RoPE, softmaxes, Sinkhorn) is
// left out: it is bandwidth, not FLOPs, and small.
#pragma once

#include <cstdint>
#include <string>

#include "common/model_config.h"

namespace dsv4 {

// Bytes per element of each weight class as a step reads them: dense matrices (bf16 2, fp32 4),
// the FP8 projections (1 byte and a fp32 scale per 128x128 block) and the MXFP4 routed experts
// (half a byte and a scale per 32) when the weights keep the released formats.
struct WeightBytes {
  double dense = 2, fp8 = 2, experts = 2;
};
WeightBytes StepWeightBytes(bool gpu, const std::string& precision, const std::string& format);

// Bytes a decode step of `batch` sequences at context `ctx` must read at least once: the weights
// it touches (routed experts counted by the expected number of distinct experts among
// batch x top-k uniform picks) and each sequence's attention state.
double DecodeStepBytes(const ModelConfig& c, int64_t batch, int64_t ctx, const WeightBytes& w);

struct PrefillCost {
  double gemm_flops = 0;
  double routed_expert_flops = 0;  // the part of gemm_flops in the K chosen routed experts
  double attention_flops = 0;
  double indexer_flops = 0;
  double bytes = 0;  // weights read (every expert some token picks) and the state written
  double flops() const { return gemm_flops + attention_flops + indexer_flops; }
};

// A prefill of `tokens` prompt tokens for each of `batch` fresh sequences (positions 0..tokens-1),
// sampling one token per sequence.
PrefillCost PrefillStepCost(const ModelConfig& c, int64_t batch, int64_t tokens,
                            const WeightBytes& w);

// Multiply-accumulates of the GEMMs per token of one layer (routed experts: the K chosen ones).
double LayerGemmMacsPerToken(const ModelConfig& c, int64_t layer);

}  // namespace dsv4
