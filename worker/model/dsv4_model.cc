#include "worker/model/dsv4_model.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "common/step_plan.h"
#include "worker/checkpoint/weight_source.h"
#include "worker/model/weight_loading.h"

namespace dsv4 {

struct Dsv4Model::Weights : ModelWeights {};


struct Dsv4Model::LayerCache {
  Tensor ring;           // [slots, W, hd]
  Tensor entries;        // [blocks, bs/m, hd]
  Tensor comp_state;     // [slots, state floats]
  Tensor index_keys;     // [blocks, bs/m, dI]
  Tensor index_state;    // [slots, state floats]
};

namespace {

absl::StatusOr<Tensor> InvFreq(Backend* backend, const RopeConfig& rope, int64_t rope_dims) {
  HostTensor t{DType::kF32, Shape{rope_dims / 2}, RopeInvFreq(rope, rope_dims), {}};
  return backend->CreateWeight(t, WeightUse::kParam);
}

}  // namespace

Dsv4Model::~Dsv4Model() = default;

absl::StatusOr<std::unique_ptr<Dsv4Model>> Dsv4Model::Create(const ModelConfig& config,
                                                            std::unique_ptr<Backend> backend,
                                                            const CacheConfig& cache,
                                                            const ParallelLayout& parallel) {
  RETURN_IF_ERROR(backend->Supports(config));
  ASSIGN_OR_RETURN(TensorShard shard, ShardOf(config, parallel));
  if (parallel.reduces()) RETURN_IF_ERROR(backend->SupportsTensorParallel(parallel));
  std::unique_ptr<Dsv4Model> m(new Dsv4Model());
  m->config_ = config;
  m->parallel_ = parallel;
  m->shard_ = shard;
  m->backend_ = std::move(backend);
  m->cache_ = cache;
  if (m->cache_.block_size == 0) m->cache_.block_size = DefaultBlockSize(config);
  if (m->cache_.max_model_len == 0) {
    m->cache_.max_model_len = static_cast<int32_t>(
        std::min<int64_t>(config.max_position_embeddings, INT32_MAX - m->cache_.block_size));
  }
  const CacheConfig& cc = m->cache_;
  if (cc.block_size < 1 || cc.num_blocks < 1 || cc.num_slots < 1 || cc.max_model_len < 1 ||
      cc.max_model_len > config.max_position_embeddings || cc.num_state_snapshots < 0 ||
      cc.num_state_snapshots > INT32_MAX - cc.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache config: need block_size, num_blocks, num_slots >= 1, num_state_snapshots >= 0 and "
        "1 <= max_model_len <= max_position_embeddings (", config.max_position_embeddings,
        "); got block_size=", cc.block_size, " num_blocks=", cc.num_blocks, " num_slots=",
        cc.num_slots, " num_state_snapshots=", cc.num_state_snapshots, " max_model_len=",
        cc.max_model_len));
  }
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (config.Ratio(l) > 0 && cc.block_size % config.Ratio(l) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cache config: block_size ", cc.block_size,
                                                     " is not a multiple of layer ", l,
                                                     "'s compression ratio ", config.Ratio(l)));
    }
  }
  m->max_blocks_per_seq_ = (cc.max_model_len + cc.block_size - 1) / cc.block_size;
  return m;
}

absl::Status Dsv4Model::LoadWeights(WeightFactory* factory,
                                     const std::function<void(int64_t, int64_t)>& on_layer) {
  const ModelConfig& config = config_;
  Backend* be = backend_.get();
  auto w = std::make_unique<Weights>();
  RETURN_IF_ERROR(LoadWeightTree(config, shard_, *factory, w.get(), on_layer));
  ASSIGN_OR_RETURN(w->main_inv_freq, InvFreq(be, config.main_rope, config.rope_dims));
  ASSIGN_OR_RETURN(w->compress_inv_freq, InvFreq(be, config.compress_rope, config.rope_dims));
  weights_ = std::move(w);
  return absl::OkStatus();
}

absl::StatusOr<MemoryPlan> Dsv4Model::PlanMemory(
    const ModelConfig& config, const CacheConfig& cache, const Backend& backend,
    const std::function<QuantFormat(const std::string&)>& format_of,
    const ParallelLayout& parallel) {
  MemoryPlan plan;
  ASSIGN_OR_RETURN(TensorShard shard, ShardOf(config, parallel));
  auto census = CensusWeightFactory(format_of, backend, &plan.weights);
  Weights w;
  RETURN_IF_ERROR(LoadWeightTree(config, shard, *census, &w));
  CacheConfig cc = cache;
  if (cc.block_size == 0) cc.block_size = DefaultBlockSize(config);
  ForEachPool(config, cc, [&](int64_t, const char*, Shape shape) {
    plan.pools += static_cast<uint64_t>(shape.numel()) * 4;
  });
  plan.step_scratch = StepScratchBytes(config, cc);
  return plan;
}

uint64_t Dsv4Model::StepScratchBytes(const ModelConfig& c, const CacheConfig& cache) {
  const int64_t D = c.hidden_size, n = c.hc_mult, H = c.num_heads, hd = c.head_dim;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim, K = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size;
  // fp32 values per token: across layers (hs, hs2, normed, block_out, post, comb, the embedding).
  const int64_t carried = 2 * n * D + 3 * D + n + n * n;
  int64_t layer_max = 0, layers_sum = 0;
  int64_t min_ratio = 0;  // of the CSA layers (the indexer's scores)
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t ratio = c.Ratio(l);
    const bool csa = c.layer_types[l] == AttnType::kCsa;
    int64_t v = hd + c.q_lora_rank + 2 * H * hd + c.o_groups * c.o_lora_rank;  // kv cq q o grouped
    if (ratio > 0) v += 2 * (csa ? 2 : 1) * hd;                                // the compressor
    if (csa) {
      v += nI * dI + nI + c.index_topk + 2 * 2 * dI;  // indexer q, weights, selection, compressor
      if (min_ratio == 0 || ratio < min_ratio) min_ratio = ratio;
    }
    v += 3 * I + D + c.n_routed_experts + 2 * K;  // shared h, gate/up and output; router
    // The ops' temporaries: bf16 copies of the products' inputs (x of up to nine, cq, o,
    // grouped, h, the tiled experts' u) and the routed experts' workspace (gate/up, SwiGLU and
    // output rows per assignment, sort arrays).
    v += (10 * D + 2 * c.q_lora_rank + H * hd + c.o_groups * c.o_lora_rank + I) / 2 +
         K * (3 * I + D) + 4 * K;
    layer_max = std::max(layer_max, v);
    layers_sum += v;
  }
  const int64_t max_len = cache.max_model_len > 0 ? cache.max_model_len : c.max_position_embeddings;
  const int64_t big = cache.max_step_tokens > 0 ? cache.max_step_tokens
                                                : CacheConfig::kDefaultStepTokens;
  // Eager steps of fewer than kLayerReuseMinTokens tokens and steps run as graphs (up to
  // max_graph_tokens, padded) keep every layer's scratch.
  const int64_t graph = cache.max_graph_tokens >= 0 ? cache.max_graph_tokens : std::min<int64_t>(big, 512);
  const int64_t small = std::max<int64_t>(std::min<int64_t>(big, kLayerReuseMinTokens - 1), graph);
  // Tensors start a new arena block when they do not fit the rest of one (256 MiB blocks), which
  // the sums do not see, and split-KV attention (decode batches) takes partial sums of about
  // 2 x 264 blocks x 16 heads x (hd + 2) a layer. Measured on the H200 (Flash cut to 37 layers,
  // the high water the CUDA backend prints): 11196 MiB at 8192 tokens and 1216 MiB at 1024
  // (1.45 and 1.26 times the large-step sum), 3713 MiB with 64-token decode graphs beside a
  // 2048-token step (1.9 times the batch sum); the plan takes 1.5 and 2 times.
  // In double: a config at the validation limits would overflow 64-bit integers.
  using F = double;
  const F split_kv = F(2 * 264 * 16) * F(hd + 2) * F(c.num_layers);
  const F large = F(big) * F(carried + layer_max) * 1.5;
  const F batches = F(small) * (F(carried) + F(layers_sum)) * 2 + split_kv;
  // One scores buffer per step (the CSA layers share it): tokens x visible entries.
  const F scores = min_ratio > 0 ? F(big) * F(max_len / min_ratio + 1) : 0;
  // The head and the sampler: the sampled rows' streams, normed rows, logits and a work row each.
  const F rows = F(std::min<int64_t>(big, std::max<int32_t>(cache.num_slots, 1) + 1));
  const F head = rows * (F(n * D + D) + 2 * F(c.vocab_size));
  const F bytes = (std::max(large, batches) + scores + head) * 4;
  return bytes >= 1.8e19 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(bytes);
}

uint64_t MemoryPlan::weight_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, bytes] : weights) total += bytes;
  return total;
}

void Dsv4Model::ForEachPool(const ModelConfig& config, const CacheConfig& cc,
                            const std::function<void(int64_t, const char*, Shape)>& f) {
  const int64_t hd = config.head_dim;
  // Per-sequence state: the slots, then the prefix cache's snapshot rows.
  const int64_t rows = int64_t{cc.num_slots} + cc.num_state_snapshots;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    f(l, "ring", Shape{rows, config.sliding_window, hd});
    const int64_t ratio = config.Ratio(l);
    if (ratio == 0) continue;
    const int64_t overlap = config.layer_types[l] == AttnType::kCsa ? 2 : 1;
    f(l, "entries", Shape{cc.num_blocks, cc.block_size / ratio, hd});
    f(l, "comp_state", Shape{rows, CompressStateFloats(ratio, overlap, hd)});
    if (config.layer_types[l] == AttnType::kCsa) {
      const int64_t dI = config.index_head_dim;
      f(l, "index_keys", Shape{cc.num_blocks, cc.block_size / ratio, dI});
      f(l, "index_state", Shape{rows, CompressStateFloats(ratio, 2, dI)});
    }
  }
}

absl::Status Dsv4Model::AllocatePools() {
  caches_.resize(config_.num_layers);
  absl::Status status;
  ForEachPool(config_, cache_, [&](int64_t l, const char* kind, Shape shape) {
    if (!status.ok()) return;
    auto t = backend_->CreatePool(DType::kF32, shape);
    if (!t.ok()) {
      status = t.status();
      return;
    }
    LayerCache& lc = caches_[l];
    const std::string k = kind;
    Tensor& dst = k == "ring" ? lc.ring : k == "entries" ? lc.entries : k == "comp_state" ? lc.comp_state
                  : k == "index_keys" ? lc.index_keys : lc.index_state;
    dst = *t;
  });
  return status;
}

// The load's memory plan: logged, and checked against the device's free memory before a byte
// is allocated (a model that does not fit is refused with what it needs).
absl::Status Dsv4Model::CheckFits(const MemoryPlan& plan, const Backend& backend) {
  std::string by_class;
  for (const auto& [name, bytes] : plan.weights) {
    absl::StrAppend(&by_class, by_class.empty() ? "" : " ", name, "=",
                    absl::StrFormat("%.3f", bytes / double(1ull << 30)));
  }
  auto free_bytes = backend.FreeMemoryBytes();
  LogInfo("memory_plan", {{"weights_gib", plan.weight_bytes() / double(1ull << 30)},
                          {"by_class_gib", by_class},
                          {"state_pools_gib", plan.pools / double(1ull << 30)},
                          {"step_scratch_gib", plan.step_scratch / double(1ull << 30)},
                          {"device_free_gib", free_bytes.ok() ? *free_bytes / double(1ull << 30) : -1.0}});
  if (!free_bytes.ok()) return absl::OkStatus();
  // cuBLASLt workspaces, the FP8 dequantisation buffers (one per stream), graphs and what the
  // allocator rounds take the reserve (the step's activations are counted above).
  const uint64_t reserve = (1ull << 30) + *free_bytes / 100;
  auto add = [](uint64_t a, uint64_t b) {
    return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
  };
  const uint64_t need = add(add(add(plan.weight_bytes(), plan.pools), plan.step_scratch), reserve);
  if (need > *free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model does not fit: it needs ", need >> 20, " MiB of device memory (weights ",
        plan.weight_bytes() >> 20, " MiB, state pools ", plan.pools >> 20, " MiB, step scratch ",
        plan.step_scratch >> 20, " MiB, reserve ", reserve >> 20, " MiB) and the device has ",
        *free_bytes >> 20,
        " MiB free; use fewer layers, fewer --max-num-seqs / a shorter --max-model-len, a "
        "smaller step budget (--max-batched-tokens) or smaller --cudagraph-capture-sizes (a graph step keeps every layer's activations), --weight-format auto, or more GPUs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dsv4Model>> Dsv4Model::Load(const ModelConfig& config,
                                                          const Checkpoint& ckpt,
                                                          std::unique_ptr<Backend> backend,
                                                          const CacheConfig& cache,
                                                          const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dsv4Model> m,
                   Create(config, std::move(backend), cache, options.parallel));
  ASSIGN_OR_RETURN(WeightSource src, WeightSource::Create(&ckpt, config.quant_block));
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(config, m->cache_, *m->backend_, [&](const std::string& n) {
    if (!options.keep_formats) return QuantFormat::kNone;
    const WeightFormat f = src.FormatOf(n);
    return f == WeightFormat::kFp8Block ? QuantFormat::kFp8Block
           : f == WeightFormat::kMxfp4  ? QuantFormat::kMxfp4
                                        : QuantFormat::kNone;
  }, options.parallel));
  RETURN_IF_ERROR(CheckFits(plan, *m->backend_));
  auto factory = CheckpointWeightFactory(&src, m->backend_.get(), options.keep_formats);
  RETURN_IF_ERROR(m->LoadWeights(factory.get(), options.on_layer));
  LogInfo("checkpoint_read", {{"bytes", src.bytes_read()},
                              {"rank", options.parallel.rank},
                              {"world_size", options.parallel.world_size}});
  if (options.bytes_read != nullptr) *options.bytes_read = src.bytes_read();
  const auto unused = src.Unused();
  if (!unused.empty() && options.parallel.distributed()) {
    // Other ranks' slices (their experts) are not this rank's to load.
    LogInfo("checkpoint_tensors_left_to_other_ranks", {{"count", unused.size()},
                                                       {"rank", options.parallel.rank}});
  } else if (!unused.empty()) {
    LogWarning("checkpoint_unused_tensors",
               {{"count", unused.size()},
                {"first", unused.front()},
                {"detail", "tensors the model does not use were left unloaded"}});
  }
  RETURN_IF_ERROR(m->AllocatePools());
  return m;
}

absl::StatusOr<std::unique_ptr<Dsv4Model>> Dsv4Model::LoadSynthetic(const ModelConfig& config,
                                                                   uint64_t seed,
                                                                   std::unique_ptr<Backend> backend,
                                                                   const CacheConfig& cache,
                                                                   const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dsv4Model> m,
                   Create(config, std::move(backend), cache, options.parallel));
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(config, m->cache_, *m->backend_, [&](const std::string& n) {
    return options.synthetic_released_formats ? ReleasedFormat(n) : QuantFormat::kNone;
  }, options.parallel));
  RETURN_IF_ERROR(CheckFits(plan, *m->backend_));
  auto factory = SyntheticWeightFactory(seed, m->backend_.get(), options.synthetic_released_formats,
                                        config.quant_block);
  RETURN_IF_ERROR(m->LoadWeights(factory.get(), options.on_layer));
  RETURN_IF_ERROR(m->AllocatePools());
  return m;
}


absl::Status Dsv4Model::ValidateStep(std::span<const SequenceStep> seqs) const {
  if (seqs.empty()) return absl::InvalidArgumentError("step has no sequences");
  std::vector<bool> slot_used(cache_.num_slots, false);
  bool needs_blocks = false;
  for (int64_t l = 0; l < config_.num_layers; ++l) needs_blocks |= config_.Ratio(l) > 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceStep& s = seqs[i];
    const std::string where = absl::StrCat("sequence ", i, ": ");
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "no tokens"));
    if (s.deferred_token) {
      if (!backend_->deferred_tokens()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "a deferred token needs a backend that resolves them on the device"));
      }
      if (s.tokens.size() != 1 || s.tokens[0] != kDeferredToken || s.state_slot < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "a deferred token is one placeholder token in a state slot"));
      }
    }
    for (int32_t id : s.tokens) {
      if (s.deferred_token) break;
      if (id < 0 || id >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(where, "token id ", id,
                                                       " outside the vocabulary [0, ",
                                                       config_.vocab_size, ")"));
      }
    }
    const int64_t end = static_cast<int64_t>(s.start_pos) + static_cast<int64_t>(s.tokens.size());
    if (s.start_pos < 0 || end > cache_.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat(where, "positions [", s.start_pos, ", ", end,
                                                     ") exceed the model length ",
                                                     cache_.max_model_len));
    }
    if (s.state_slot < 0 || s.state_slot >= cache_.num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(where, "state slot ", s.state_slot,
                                                     " outside [0, ", cache_.num_slots, ")"));
    }
    if (slot_used[s.state_slot]) {
      return absl::InvalidArgumentError(absl::StrCat(where, "state slot ", s.state_slot,
                                                     " is used by another sequence of the step"));
    }
    slot_used[s.state_slot] = true;
    RETURN_IF_ERROR(ValidateSnapshots(s, end, where));
    if (needs_blocks) {
      const int64_t need = (end + cache_.block_size - 1) / cache_.block_size;
      if (static_cast<int64_t>(s.block_table.size()) < need ||
          static_cast<int64_t>(s.block_table.size()) > max_blocks_per_seq_) {
        return absl::InvalidArgumentError(absl::StrCat(where, "block table has ",
                                                       s.block_table.size(), " blocks; positions < ",
                                                       end, " need ", need));
      }
      for (int64_t b = 0; b < need; ++b) {
        if (s.block_table[b] < 0 || s.block_table[b] >= cache_.num_blocks) {
          return absl::InvalidArgumentError(absl::StrCat(where, "block ", s.block_table[b],
                                                         " outside [0, ", cache_.num_blocks, ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Dsv4Model::ValidateSnapshots(const SequenceStep& s, int64_t end,
                                          const std::string& where) const {
  const int32_t first = cache_.num_slots, last = cache_.num_slots + cache_.num_state_snapshots;
  auto is_row = [&](int32_t r) { return r >= first && r < last; };
  if (s.restore_from != -1) {
    if (!is_row(s.restore_from) || s.start_pos == 0 || s.start_pos % cache_.block_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "restore from state row ", s.restore_from, " at position ", s.start_pos,
          ": needs a snapshot row in [", first, ", ", last, ") and a block boundary > 0"));
    }
  }
  for (const StateSnapshotAt& at : s.snapshots) {
    if (!is_row(at.row) || at.row == s.restore_from || at.position <= s.start_pos ||
        at.position > end || at.position % cache_.block_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "snapshot into state row ", at.row, " at position ", at.position,
          ": needs a snapshot row in [", first, ", ", last, ") and a block boundary in (",
          s.start_pos, ", ", end, "]"));
    }
  }
  return absl::OkStatus();
}

std::vector<Tensor> Dsv4Model::StatePools() const {
  std::vector<Tensor> pools;
  for (const LayerCache& c : caches_) {
    for (const Tensor* t : {&c.ring, &c.comp_state, &c.index_state}) {
      if (!t->empty()) pools.push_back(*t);
    }
  }
  return pools;
}

absl::Status Dsv4Model::FinishStep() {
  if (saves_.empty()) return absl::OkStatus();
  const std::vector<std::pair<int32_t, int32_t>> saves = std::exchange(saves_, {});
  return backend_->CopyStateRows(StatePools(), saves);
}

absl::StatusOr<Tensor> Dsv4Model::StepToBackend(std::span<const SequenceStep> seqs,
                                                const StepOptions& options,
                                                std::vector<int32_t>* seq_row_begin) {
  RETURN_IF_ERROR(PrepareStep(seqs, options, seq_row_begin));
  ASSIGN_OR_RETURN(Tensor logits, RunForward());
  RETURN_IF_ERROR(FinishStep());
  return logits;
}

absl::Status Dsv4Model::PrepareStep(std::span<const SequenceStep> seqs, const StepOptions& options,
                                    std::vector<int32_t>* seq_row_begin) {
  RETURN_IF_ERROR(ValidateStep(seqs));
  StepMeta& m = meta_;
  m = StepMeta{};
  const int32_t real_seqs = static_cast<int32_t>(seqs.size());
  int64_t real_tokens = 0;
  for (const SequenceStep& seq : seqs) real_tokens += static_cast<int64_t>(seq.tokens.size());
  const bool padded = options.padded_tokens > 0;
  if (padded) {
    const bool pad_seq = real_tokens < options.padded_tokens;
    if (real_tokens > options.padded_tokens || real_seqs + (pad_seq ? 1 : 0) > options.padded_seqs) {
      return absl::InvalidArgumentError(
          absl::StrCat("step of ", real_tokens, " tokens in ", real_seqs,
                       " sequences does not fit a graph padded to ", options.padded_tokens,
                       " tokens and ", options.padded_seqs, " sequences"));
    }
  }
  RETURN_IF_ERROR(PlanSnapshots(seqs, padded));
  m.num_seqs = padded ? options.padded_seqs : real_seqs;
  m.block_size = cache_.block_size;
  m.block_stride = max_blocks_per_seq_;
  m.force_indexer_scoring = options.force_indexer_scoring;
  m.max_position_bound = cache_.max_model_len - 1;
  m.block_table.assign(static_cast<size_t>(m.num_seqs) * m.block_stride, -1);
  seq_row_begin->assign(1, 0);
  for (int32_t s = 0; s < real_seqs; ++s) {
    const SequenceStep& seq = seqs[s];
    m.seq_begin.push_back(static_cast<int32_t>(m.token_ids.size()));
    m.seq_start_pos.push_back(seq.start_pos);
    m.state_slot.push_back(seq.state_slot);
    std::copy(seq.block_table.begin(), seq.block_table.end(),
              m.block_table.begin() + static_cast<int64_t>(s) * m.block_stride);
    const int32_t first = static_cast<int32_t>(m.token_ids.size());
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      m.token_ids.push_back(seq.tokens[i]);
      m.positions.push_back(seq.start_pos + static_cast<int32_t>(i));
      m.token_seq.push_back(s);
    }
    const int32_t last = static_cast<int32_t>(m.token_ids.size()) - 1;
    if (options.logits_per_seq || seq.logits == SequenceStep::Logits::kLast) {
      m.logit_rows.push_back(last);
    } else if (seq.logits == SequenceStep::Logits::kAll) {
      for (int32_t t = first; t <= last; ++t) m.logit_rows.push_back(t);
    }
    seq_row_begin->push_back(static_cast<int32_t>(m.logit_rows.size()));
  }
  if (padded) {
    // Inert padding: one sequence holding the padding tokens (positions 0.., slot -1), then empty
    // sequences up to the padded count.
    for (int32_t s = real_seqs; s < m.num_seqs; ++s) {
      m.seq_begin.push_back(static_cast<int32_t>(m.token_ids.size()));
      m.seq_start_pos.push_back(0);
      m.state_slot.push_back(-1);
      const int32_t n = s == real_seqs ? options.padded_tokens - static_cast<int32_t>(real_tokens) : 0;
      for (int32_t i = 0; i < n; ++i) {
        m.token_ids.push_back(0);
        m.positions.push_back(i);
        m.token_seq.push_back(s);
      }
      if (options.logits_per_seq) m.logit_rows.push_back(options.padded_tokens - 1);
    }
  }
  m.seq_begin.push_back(static_cast<int32_t>(m.token_ids.size()));
  m.num_tokens = static_cast<int32_t>(m.token_ids.size());
  return backend_->BeginStep(m);
}

absl::Status Dsv4Model::PlanSnapshots(std::span<const SequenceStep> seqs, bool padded) {
  StepMeta& m = meta_;
  saves_.clear();
  std::vector<std::pair<int32_t, int32_t>> restores;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceStep& s = seqs[i];
    if (s.restore_from >= 0) restores.emplace_back(s.restore_from, s.state_slot);
    const int32_t end = s.start_pos + static_cast<int32_t>(s.tokens.size());
    for (const StateSnapshotAt& at : s.snapshots) {
      if (at.position == end) {
        saves_.emplace_back(s.state_slot, at.row);  // the state after the step: a row copy
        continue;
      }
      m.snap_seq.push_back(static_cast<int32_t>(i));
      m.snap_pos.push_back(at.position);
      m.snap_row.push_back(at.row);
    }
  }
  if (padded && !m.snap_seq.empty()) {
    return absl::InvalidArgumentError(
        "a step with state snapshots inside a chunk runs eagerly, not as a graph");
  }
  if (restores.empty()) return absl::OkStatus();
  return backend_->CopyStateRows(StatePools(), restores);
}

std::vector<std::pair<std::string, Tensor>> Dsv4Model::Pools() const {
  std::vector<std::pair<std::string, Tensor>> pools;
  for (size_t l = 0; l < caches_.size(); ++l) {
    const LayerCache& c = caches_[l];
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"ring", &c.ring},
                                  {"comp_state", &c.comp_state},
                                  {"entries", &c.entries},
                                  {"index_state", &c.index_state},
                                  {"index_keys", &c.index_keys}}) {
      if (!t->empty()) pools.emplace_back(absl::StrCat("layer ", l, " ", name), *t);
    }
  }
  return pools;
}

absl::Status Dsv4Model::Step(std::span<const SequenceStep> seqs, const StepOptions& options,
                             StepLogits* out) {
  ASSIGN_OR_RETURN(Tensor logits, StepToBackend(seqs, options, &out->seq_row_begin));
  out->vocab = config_.vocab_size;
  out->values.assign(static_cast<size_t>(logits.numel()), 0.0f);
  if (logits.numel() == 0) return absl::OkStatus();
  return backend_->CopyToHost(logits, out->values.data());
}

absl::StatusOr<Tensor> Dsv4Model::RunForward() {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const Weights& w = *weights_;
  const int64_t T = meta_.num_tokens, D = c.hidden_size, n = c.hc_mult;
  HcParams hc;
  hc.hc_mult = n;
  hc.sinkhorn_iters = c.hc_sinkhorn_iters;
  hc.hc_eps = static_cast<float>(c.hc_eps);
  hc.norm_eps = static_cast<float>(c.rms_norm_eps);
  const RmsNormParams norm{static_cast<float>(c.rms_norm_eps)};

  ASSIGN_OR_RETURN(Tensor hs, be.Scratch(DType::kF32, Shape{T, n, D}));
  ASSIGN_OR_RETURN(Tensor hs2, be.Scratch(DType::kF32, Shape{T, n, D}));
  RETURN_IF_ERROR(be.EmbedExpand(w.embed, hs));
  ASSIGN_OR_RETURN(Tensor normed, be.Scratch(DType::kF32, Shape{T, D}));
  ASSIGN_OR_RETURN(Tensor block_out, be.Scratch(DType::kF32, Shape{T, D}));
  ASSIGN_OR_RETURN(Tensor post, be.Scratch(DType::kF32, Shape{T, n}));
  ASSIGN_OR_RETURN(Tensor comb, be.Scratch(DType::kF32, Shape{T, n, n}));
  auto gate = [&](const HcWeights& hw, const Tensor& norm_weight) {
    return HcGateNorm{hw.fn, hw.base, hw.scale, hc, norm_weight, norm};
  };

  // Each sub-block: Hs' = post ⊗ Block(norm(collapse(Hs))) + Cᵀ·Hs. A sub-block's HcPost and the
  // next one's collapse + norm form one boundary op (HcPostPreNorm), which a backend may fuse.
  if (c.num_layers > 0) {  // (the config requires at least one layer)
    RETURN_IF_ERROR(be.HcPreNorm(hs, gate(w.layers[0].attn_hc, w.layers[0].attn_norm), normed,
                                 post, comb));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    RETURN_IF_ERROR(be.Mark(StepMark::kLayerBegin));
    RETURN_IF_ERROR(be.Mark(StepMark::kAttentionBegin));
    RETURN_IF_ERROR_CTX(AttentionBlock(l, normed, block_out), absl::StrCat("layer ", l, " attention"));
    RETURN_IF_ERROR(be.Mark(StepMark::kAttentionEnd));
    RETURN_IF_ERROR(be.HcPostPreNorm(hs, block_out, post, comb, hs2, gate(lw.ffn_hc, lw.ffn_norm),
                                     normed, post, comb));
    RETURN_IF_ERROR_CTX(MoeBlock(l, normed, block_out), absl::StrCat("layer ", l, " moe"));
    if (l + 1 < c.num_layers) {
      const LayerWeights& next = w.layers[l + 1];
      RETURN_IF_ERROR(be.HcPostPreNorm(hs2, block_out, post, comb, hs,
                                       gate(next.attn_hc, next.attn_norm), normed, post, comb));
    } else {
      RETURN_IF_ERROR(be.HcPost(hs2, block_out, post, comb, hs));
    }
    RETURN_IF_ERROR(be.Mark(StepMark::kLayerEnd));
  }
  RETURN_IF_ERROR(be.Mark(StepMark::kLayersEnd));

  const int64_t R = static_cast<int64_t>(meta_.logit_rows.size());
  if (R == 0) return Tensor{nullptr, DType::kF32, Shape{0, c.vocab_size}};
  ASSIGN_OR_RETURN(Tensor rows, be.Scratch(DType::kF32, Shape{R, n, D}));
  // Only the rows whose logits are wanted go through the head.
  RETURN_IF_ERROR(be.GatherLogitRows(hs.View(Shape{T, n * D}), rows.View(Shape{R, n * D})));
  ASSIGN_OR_RETURN(Tensor y, be.Scratch(DType::kF32, Shape{R, D}));
  RETURN_IF_ERROR(be.HcHeadNorm(rows, gate(w.hc_head, w.norm), y));
  ASSIGN_OR_RETURN(Tensor logits, be.Scratch(DType::kF32, Shape{R, c.vocab_size}));
  RETURN_IF_ERROR(be.Linear(y, w.head, logits));
  return logits;
}

absl::Status Dsv4Model::AttentionBlock(int64_t l, const Tensor& x, Tensor out) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_->layers[l];
  LayerCache& cache = caches_[l];
  // This rank's heads and output groups (all of them at tensor-parallel size 1).
  const int64_t T = meta_.num_tokens, H = shard_.heads, hd = c.head_dim, G = shard_.groups;
  const AttnType type = c.layer_types[l];
  const RmsNormParams norm{static_cast<float>(c.rms_norm_eps)};
  RopeParams rope;
  rope.rope_dims = c.rope_dims;
  rope.inv_freq = type == AttnType::kSliding ? weights_->main_inv_freq : weights_->compress_inv_freq;

  const int64_t ratio = c.Ratio(l);
  const bool csa = type == AttnType::kCsa;
  RopeParams crope;
  crope.rope_dims = c.rope_dims;
  crope.inv_freq = weights_->compress_inv_freq;
  // The compressors read only x: side work the backend may overlap with the query path (they
  // write the pools that the indexer and the attention read after kSideJoin).
  if (ratio > 0) {
    auto compress = [&](const CompressorWeights& cw, int64_t overlap, int64_t d, Tensor state,
                        Tensor entries) -> absl::Status {
      ASSIGN_OR_RETURN(Tensor a, be.Scratch(DType::kF32, Shape{T, overlap * d}));
      ASSIGN_OR_RETURN(Tensor z, be.Scratch(DType::kF32, Shape{T, overlap * d}));
      RETURN_IF_ERROR(be.Linear(x, cw.kv_proj, a));
      RETURN_IF_ERROR(be.Linear(x, cw.gate_proj, z));
      CompressParams p;
      p.ratio = ratio;
      p.overlap = overlap;
      p.dim = d;
      p.position_bias = cw.position_bias;
      p.norm_weight = cw.kv_norm;
      p.norm_eps = static_cast<float>(c.rms_norm_eps);
      p.rope = crope;
      if (!meta_.snap_seq.empty()) RETURN_IF_ERROR(be.CompressSnapshot(p, a, z, state));
      return be.Compress(p, a, z, state, entries);
    };
    // One side region per compressor: a backend with two side streams runs a CSA layer's two
    // compressors side by side.
    RETURN_IF_ERROR(be.Mark(StepMark::kSideBegin));
    RETURN_IF_ERROR(compress(lw.compressor, csa ? 2 : 1, hd, cache.comp_state, cache.entries));
    RETURN_IF_ERROR(be.Mark(StepMark::kSideEnd));
    if (csa) {
      RETURN_IF_ERROR(be.Mark(StepMark::kSideBegin));
      RETURN_IF_ERROR(compress(lw.index_compressor, 2, c.index_head_dim, cache.index_state,
                               cache.index_keys));
      RETURN_IF_ERROR(be.Mark(StepMark::kSideEnd));
    }
  }

  // The single K=V latent reads x only: side work too (in a CSA layer, with two side streams,
  // behind the main compressor while the index compressor and then the indexer's inputs take the
  // other; on the main stream after the query instead it measured the same on the H200).
  ASSIGN_OR_RETURN(Tensor kv, be.Scratch(DType::kF32, Shape{T, hd}));
  RETURN_IF_ERROR(be.Mark(StepMark::kSideBegin));
  RETURN_IF_ERROR(be.Linear(x, lw.kv_proj, kv));
  RETURN_IF_ERROR(be.RmsNormRope(kv.View(Shape{T, 1, hd}), lw.kv_norm, norm, rope));
  RETURN_IF_ERROR(be.Mark(StepMark::kSideEnd));

  // Query: LoRA down, q_a_norm (cq is shared with the indexer), up, per-head unweighted norm, RoPE.
  ASSIGN_OR_RETURN(Tensor cq, be.Scratch(DType::kF32, Shape{T, c.q_lora_rank}));
  RETURN_IF_ERROR(be.Linear(x, lw.q_a_proj, cq));
  RETURN_IF_ERROR(be.RmsNorm(cq, lw.q_a_norm, norm, cq));
  // Indexer inputs: side work too (they read cq and x only), overlapping the rest of the query.
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  Tensor qi, wi;
  if (csa) {
    RETURN_IF_ERROR(be.Mark(StepMark::kSideBegin));
    ASSIGN_OR_RETURN(qi, be.Scratch(DType::kF32, Shape{T, nI, dI}));
    RETURN_IF_ERROR(be.Linear(cq, lw.index_q_b_proj, qi.View(Shape{T, nI * dI})));
    RETURN_IF_ERROR(be.Rope(qi, crope));
    ASSIGN_OR_RETURN(wi, be.Scratch(DType::kF32, Shape{T, nI}));
    RETURN_IF_ERROR(be.Linear(x, lw.index_weights_proj, wi));
    RETURN_IF_ERROR(be.Mark(StepMark::kSideEnd));
  }
  ASSIGN_OR_RETURN(Tensor q, be.Scratch(DType::kF32, Shape{T, H, hd}));
  RETURN_IF_ERROR(be.Linear(cq, lw.q_b_proj, q.View(Shape{T, H * hd})));
  RETURN_IF_ERROR(be.RmsNormRope(q, Tensor{}, norm, rope));

  Tensor selected;
  if (csa) {
    // The indexer's scoring, once its keys (side work) are written.
    IndexerParams ip;
    ip.ratio = ratio;
    ip.topk = c.index_topk;
    ip.weight_scale = 1.0f / std::sqrt(static_cast<float>(nI));
    ip.score_scale = 1.0f / std::sqrt(static_cast<float>(dI));
    ASSIGN_OR_RETURN(selected, be.Scratch(DType::kI32, Shape{T, c.index_topk}));
    RETURN_IF_ERROR(be.Mark(StepMark::kSideJoin));
    RETURN_IF_ERROR(be.IndexerTopK(ip, qi, wi, cache.index_keys, selected));
  }
  RETURN_IF_ERROR(be.Mark(StepMark::kSideJoin));

  AttentionParams ap;
  ap.window = c.sliding_window;
  ap.ratio = ratio;
  ap.dense_compressed = type == AttnType::kHca;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // The inverse RoPE on every head of the output, as the attention's last step.
  ap.out_rope = rope;
  ap.out_rope.inverse = true;
  ASSIGN_OR_RETURN(Tensor o, be.Scratch(DType::kF32, Shape{T, H, hd}));
  RETURN_IF_ERROR(be.Attention(ap, q, kv, cache.ring, cache.entries, selected, lw.sinks, o));
  // The ring write (after the attention that read the ring) is side work as well, off the output
  // projections' path; joined before the block returns, so nothing crosses into the next
  // capture segment.
  RETURN_IF_ERROR(be.Mark(StepMark::kSideBegin));
  if (!meta_.snap_seq.empty()) RETURN_IF_ERROR(be.RingSnapshot(kv, cache.ring));
  RETURN_IF_ERROR(be.RingWrite(kv, cache.ring));
  RETURN_IF_ERROR(be.Mark(StepMark::kSideEnd));

  // The grouped output projection.
  ASSIGN_OR_RETURN(Tensor grouped, be.Scratch(DType::kF32, Shape{T, G * c.o_lora_rank}));
  RETURN_IF_ERROR(be.GroupedLinear(o.View(Shape{T, H * hd}), lw.o_a_proj, G, grouped));
  RETURN_IF_ERROR(be.Linear(grouped, lw.o_b_proj, out));
  // Each rank's heads give a partial output: the sum is the block's.
  if (parallel_.reduces()) RETURN_IF_ERROR(be.AllReduceSum(out));
  return be.Mark(StepMark::kSideJoin);
}

absl::Status Dsv4Model::MoeBlock(int64_t l, const Tensor& u, Tensor out) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_->layers[l];
  const int64_t T = meta_.num_tokens, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);
  MoeWeights mw{lw.experts_gate_up, lw.experts_down, lw.shared_gate_up, lw.shared_down, Tensor{}};
  // The shared expert's first half reads u only: side work next to the router.
  if (!mw.shared_gate_up.empty()) {
    ASSIGN_OR_RETURN(mw.shared_h, be.Scratch(DType::kF32, Shape{T, mw.shared_down.dim(1)}));
    RETURN_IF_ERROR(be.Mark(StepMark::kSideBegin));
    RETURN_IF_ERROR(be.SharedExpertUp(u, mw, limit, mw.shared_h));
    RETURN_IF_ERROR(be.Mark(StepMark::kSideEnd));
  }
  ASSIGN_OR_RETURN(Tensor logits, be.Scratch(DType::kF32, Shape{T, E}));
  RETURN_IF_ERROR(be.Linear(u, lw.gate, logits));
  RouterParams rp;
  rp.top_k = K;
  rp.routed_scale = static_cast<float>(c.routed_scaling_factor);
  rp.hash = c.mlp_types[l] == MlpType::kHashMoe;
  if (parallel_.distributed()) {  // EP: this rank's experts get local ids, the others -1
    rp.expert_begin = shard_.expert_begin;
    rp.local_experts = shard_.experts;
  }
  ASSIGN_OR_RETURN(Tensor idx, be.Scratch(DType::kI32, Shape{T, K}));
  ASSIGN_OR_RETURN(Tensor weights, be.Scratch(DType::kF32, Shape{T, K}));
  RETURN_IF_ERROR(be.Route(rp, logits, lw.gate_bias, lw.tid2eid, idx, weights));
  RETURN_IF_ERROR(be.Mark(StepMark::kSideJoin));
  // Routed experts plus the shared expert's second half, which a backend may fuse.
  RETURN_IF_ERROR(be.MoeExperts(u, idx, weights, mw, limit, out));
  // This rank's experts and shared-expert columns give a partial output: the sum is the block's.
  if (parallel_.reduces()) RETURN_IF_ERROR(be.AllReduceSum(out));
  return absl::OkStatus();
}

}  // namespace dsv4
