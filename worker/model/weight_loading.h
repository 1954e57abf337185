// How Dsv4Model's weights reach its backend: the weight tree (every tensor the forward pass
// uses), the factories that produce them (a checkpoint, a deterministic synthetic fill, or a
// census that only counts bytes for the memory plan) and the slices a tensor-parallel rank owns
// (common/tensor_parallel.h). Internal to worker/model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/tensor_parallel.h"
#include "worker/checkpoint/weight_slice.h"
#include "worker/checkpoint/weight_source.h"
#include "worker/model/backend.h"

namespace dsv4 {

struct HcWeights {
  Tensor fn, base, scale;
};

struct CompressorWeights {
  Tensor kv_proj;        // [c*d, D]
  Tensor gate_proj;      // [c*d, D]
  Tensor position_bias;  // [m, c*d]
  Tensor kv_norm;        // [d]
};

// One layer; the shapes are this rank's (h heads of H, g output groups of G, e experts of E, i
// shared-expert columns of I; all full at tensor-parallel size 1).
struct LayerWeights {
  Tensor attn_norm, ffn_norm;
  HcWeights attn_hc, ffn_hc;
  Tensor q_a_proj, q_a_norm, kv_proj, kv_norm;
  Tensor q_b_proj;   // [h*hd, q_lora]
  Tensor o_a_proj;   // [g*o_lora, group columns]
  Tensor o_b_proj;   // [D, g*o_lora]
  Tensor sinks;      // [h]
  CompressorWeights compressor;        // CSA and HCA
  CompressorWeights index_compressor;  // CSA
  Tensor index_q_b_proj, index_weights_proj;
  Tensor gate, gate_bias, tid2eid;     // the router: all E experts
  Tensor experts_gate_up;  // [e, 2I, D]
  Tensor experts_down;     // [e, D, I]
  Tensor shared_gate_up;   // [2i, D]
  Tensor shared_down;      // [D, i]
};

struct ModelWeights {
  Tensor embed, head, norm;
  HcWeights hc_head;
  Tensor main_inv_freq, compress_inv_freq;
  std::vector<LayerWeights> layers;
};

// The part of a tensor a rank keeps: slices applied in order (none: all of it).
using WeightCuts = std::vector<WeightSlice>;

// Where weights come from. `shape` is always the full tensor's; `cuts` the part to keep.
class WeightFactory {
 public:
  virtual ~WeightFactory() = default;
  virtual bool Has(const std::string& name) const = 0;
  virtual absl::StatusOr<Tensor> Get(const std::string& name, Shape shape, WeightUse use,
                                     const WeightCuts& cuts) = 0;
  // Tensors `names` (each of `part` shape) stacked along dim 0 into `shape`, all of them; this
  // rank keeps parts [part_begin, part_begin + part_count) (-1: to the end), each cut by
  // `part_cuts`, stacked into `kept` (rank 0: `shape`).
  struct StackSlice {
    int64_t part_begin = 0, part_count = -1;
    WeightCuts part_cuts;
    Shape kept;
    bool whole() const { return part_begin == 0 && part_count < 0 && part_cuts.empty(); }
  };
  virtual absl::StatusOr<Tensor> Stack(const std::vector<std::string>& names, Shape part,
                                       Shape shape, WeightUse use, const StackSlice& slice) = 0;
  // An int32 table whose values must lie in [0, modulus).
  virtual absl::StatusOr<Tensor> Index(const std::string& name, Shape shape, int32_t modulus) = 0;
};

// Matrices as stored (FP8 / MXFP4 with their scales, which the backend may keep) when
// `keep_formats`; otherwise everything dequantised to fp32 here (--weight-format bf16).
std::unique_ptr<WeightFactory> CheckpointWeightFactory(WeightSource* src, Backend* backend,
                                                       bool keep_formats);
// Every tensor seeded by (seed, name), matrices in the released formats when `released_formats`
// (FP8 with `fp8_block` blocks, MXFP4 experts). A rank's slices equal those slices of the
// tensors a single rank makes.
std::unique_ptr<WeightFactory> SyntheticWeightFactory(uint64_t seed, Backend* backend,
                                                      bool released_formats,
                                                      std::vector<int64_t> fp8_block);
// Counts bytes per weight class (WeightClass) on `backend`, allocating nothing.
std::unique_ptr<WeightFactory> CensusWeightFactory(
    std::function<QuantFormat(const std::string&)> format_of, const Backend& backend,
    std::map<std::string, uint64_t>* bytes);

// How the release stores a matrix (dsv4-model.md §12): FP8 block-scaled for the attention
// projections, the indexer's query projection and the shared expert; MXFP4 for the routed
// experts; BF16 for the rest.
QuantFormat ReleasedFormat(const std::string& name);

// Every checkpoint weight of the model (the RoPE tables aside), this rank's slices of the split
// ones; `on_layer(done, total)` after each layer.
absl::Status LoadWeightTree(const ModelConfig& config, const TensorShard& shard,
                            WeightFactory& factory, ModelWeights* w,
                            const std::function<void(int64_t, int64_t)>& on_layer = {});

}  // namespace dsv4
