// Dsv4Model: the DeepSeek-V4 forward pass (dsv4-model.md §2–§10), written once over the Backend
// op seam. It owns the weights and the paged state pools on its backend and runs ragged steps:
// many sequences, each with a prefill chunk or one decode token at its own position.
//
// State (dsv4-model.md §11): two paged pools.
//   * Context pool, `num_blocks` blocks of `block_size` tokens, addressed by each sequence's
//     block table: compressed K=V entries of every CSA/HCA layer (block_size/m per block) and
//     the CSA indexer keys.
//   * State pool, `num_slots` slots, one per live sequence (its one-page block table): the
//     sliding-window ring (W x hd per layer) and every compressor's open-window and overlap state.
// The block and slot allocators belong to the caller (the coordinator's block manager). State
// needs no reset between sequences: a sequence starting at position 0 never reads stale data.
//
// Not thread-safe: one thread drives one model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cache_config.h"
#include "common/model_config.h"
#include "common/step_plan.h"
#include "common/tensor_parallel.h"
#include "worker/model/backend.h"
#include "worker/checkpoint/safetensors.h"

namespace dsv4 {

class WeightFactory;  // weight_loading.h: checkpoint, synthetic or census weights

// One sequence's work in a step.
// What a model takes on its backend, counted before anything is allocated (logged as
// `memory_plan` at load; a device that cannot hold it refuses the model).
struct MemoryPlan {
  std::map<std::string, uint64_t> weights;  // class (attention, routed_experts, ...) -> bytes
  uint64_t pools = 0;                       // KV entries, rings, compressor and indexer state
  // The largest step's activations, an upper estimate (Dsv4Model::StepScratchBytes).
  uint64_t step_scratch = 0;
  uint64_t weight_bytes() const;
};

// How weights reach the backend.
struct LoadOptions {
  // Matrices as the checkpoint stores them (FP8 block-scaled, MXFP4): a backend that computes with
  // them keeps them (the CUDA backend); false dequantises them to fp32 on the host first, as
  // --weight-format bf16 asks.
  bool keep_formats = true;
  // Synthetic weights: the matrices in the formats the release stores them in (FP8 projections,
  // MXFP4 routed experts; --weight-format auto) instead of dense values.
  bool synthetic_released_formats = false;
  // Called after each layer's weights are in place (done of total layers); may be empty.
  std::function<void(int64_t done, int64_t total)> on_layer = {};
  // This rank's place in its tensor-parallel group: it loads its slices of the split weights
  // (common/tensor_parallel.h) and all-reduces the partial outputs of its attention and MoE
  // blocks through the backend's communicator (Backend::SupportsTensorParallel).
  ParallelLayout parallel;
  // Set by Load (when not null): the checkpoint bytes this rank read.
  uint64_t* bytes_read = nullptr;
};

struct SequenceStep {
  std::span<const int32_t> tokens;        // new tokens: a prefill chunk or one decode token
  int32_t start_pos = 0;                  // tokens already processed for this sequence
  int32_t state_slot = 0;
  std::span<const int32_t> block_table;   // covers positions [0, start_pos + tokens.size())
  enum class Logits { kNone, kLast, kAll } logits = Logits::kLast;
  // tokens = {kDeferredToken}: the backend feeds the token last sampled into this state slot
  // (Backend::deferred_tokens(); overlapped decode, see Worker::Launch).
  bool deferred_token = false;
  // Prefix caching (ScheduledSeq): the state row copied into state_slot before the step (-1:
  // none), and the block boundaries whose state the step keeps in snapshot rows.
  int32_t restore_from = -1;
  std::span<const StateSnapshotAt> snapshots;
};

struct StepOptions {
  // Score the lightning indexer even when every visible candidate fits in top-k.
  bool force_indexer_scoring = false;
  // Graph steps: pad the batch to `padded_tokens` tokens and `padded_seqs` sequences. The padding
  // tokens form one extra sequence at positions 0.. with state slot -1 (kernels write no KV or
  // state for slot -1); the remaining padding sequences are empty. 0 = no padding.
  int32_t padded_tokens = 0;
  int32_t padded_seqs = 0;
  // One logit row per (padded) sequence, its last token, whether or not it asked for logits: the
  // row count of a FULL graph is fixed. seq_row_begin then maps sequence s to row s.
  bool logits_per_seq = false;
};

struct StepLogits {
  int64_t vocab = 0;
  std::vector<float> values;          // [rows, vocab]
  std::vector<int32_t> seq_row_begin; // [S+1] rows of each sequence
  std::span<const float> Row(int64_t r) const {
    return {values.data() + r * vocab, static_cast<size_t>(vocab)};
  }
};

class Dsv4Model {
 public:
  // Loads weights from `ckpt` onto `backend` and allocates the state pools.
  static absl::StatusOr<std::unique_ptr<Dsv4Model>> Load(const ModelConfig& config,
                                                         const Checkpoint& ckpt,
                                                         std::unique_ptr<Backend> backend,
                                                         const CacheConfig& cache,
                                                         const LoadOptions& options = {});
  // Materialises deterministic synthetic weights (seeded by `seed` and each tensor's name)
  // directly on `backend`: no file, any config (benchmarks of full-width layers).
  static absl::StatusOr<std::unique_ptr<Dsv4Model>> LoadSynthetic(const ModelConfig& config,
                                                                  uint64_t seed,
                                                                  std::unique_ptr<Backend> backend,
                                                                  const CacheConfig& cache,
                                                                  const LoadOptions& options = {});
  ~Dsv4Model();

  // Runs one ragged step. Validates the batch first (token ids, positions, slots, block tables)
  // and returns InvalidArgument naming the problem without touching any state.
  absl::Status Step(std::span<const SequenceStep> seqs, const StepOptions& options,
                    StepLogits* out);

  // Step() without the copy: the logits [rows, vocab] f32 stay on the backend (valid until the
  // next step) for on-device sampling; seq_row_begin [S+1] gives each sequence's rows.
  absl::StatusOr<Tensor> StepToBackend(std::span<const SequenceStep> seqs,
                                       const StepOptions& options,
                                       std::vector<int32_t>* seq_row_begin);
  // StepToBackend() in three parts, for graph capture: PrepareStep() validates the batch, copies
  // prefix-cache restores into their slots and stages the metadata (Backend::BeginStep, a
  // host-to-device copy that must stay outside any capture); RunForward() issues the forward pass
  // and returns the logits; FinishStep() saves the snapshots taken at the end of a chunk (row
  // copies, outside any capture too). A step with snapshots inside a chunk runs eagerly.
  absl::Status PrepareStep(std::span<const SequenceStep> seqs, const StepOptions& options,
                           std::vector<int32_t>* seq_row_begin);
  absl::StatusOr<Tensor> RunForward();
  absl::Status FinishStep();
  // Every persistent state pool (context pool: blocks on dim 0; state pool: slots on dim 0), for
  // tests that check which rows a step writes.
  std::vector<std::pair<std::string, Tensor>> Pools() const;

  const ModelConfig& config() const { return config_; }
  const CacheConfig& cache() const { return cache_; }
  int32_t max_blocks_per_seq() const { return max_blocks_per_seq_; }
  Backend& backend() { return *backend_; }

  struct Weights;
  struct LayerCache;

  // The memory plan of `config` with `cache` on `backend`; `format_of` says how each matrix is
  // stored (FP8, MXFP4 or dense); `parallel` which rank's slices are counted.
  static absl::StatusOr<MemoryPlan> PlanMemory(
      const ModelConfig& config, const CacheConfig& cache, const Backend& backend,
      const std::function<QuantFormat(const std::string&)>& format_of,
      const ParallelLayout& parallel = {});

  // Scratch of the largest step `cache` allows: the tensors carried across layers plus one
  // layer's (a backend that reuses a layer's scratch for the next in large steps, as the CUDA
  // backend does from kLayerReuseMinTokens; see StepMark::kLayerBegin) or every layer's (steps
  // below that and captured decode batches: at most num_slots or 512 tokens), with the ops' own
  // temporaries (bf16 operand copies, the expert workspace, the indexer's scores).
  static uint64_t StepScratchBytes(const ModelConfig& config, const CacheConfig& cache);

 private:
  // The state pools, layer by layer: f(layer, kind, shape), kind ring|entries|comp_state|
  // index_keys|index_state (fp32).
  static void ForEachPool(const ModelConfig& config, const CacheConfig& cache,
                          const std::function<void(int64_t, const char*, Shape)>& f);
  static absl::Status CheckFits(const MemoryPlan& plan, const Backend& backend);
  Dsv4Model() = default;
  static absl::StatusOr<std::unique_ptr<Dsv4Model>> Create(const ModelConfig& config,
                                                           std::unique_ptr<Backend> backend,
                                                           const CacheConfig& cache,
                                                           const ParallelLayout& parallel);
  absl::Status LoadWeights(WeightFactory* factory,
                           const std::function<void(int64_t, int64_t)>& on_layer);
  absl::Status AllocatePools();
  absl::Status ValidateStep(std::span<const SequenceStep> seqs) const;
  absl::Status ValidateSnapshots(const SequenceStep& s, int64_t end, const std::string& where) const;
  // Restores (row copies now), in-step snapshots (meta_.snap_*) and end-of-chunk saves (saves_).
  absl::Status PlanSnapshots(std::span<const SequenceStep> seqs, bool padded);
  // Every pool of per-sequence state (ring, comp_state, index_state; rows on dim 0).
  std::vector<Tensor> StatePools() const;
  absl::Status AttentionBlock(int64_t layer, const Tensor& x, Tensor out);
  absl::Status MoeBlock(int64_t layer, const Tensor& u, Tensor out);

  ModelConfig config_;
  CacheConfig cache_;
  ParallelLayout parallel_;
  TensorShard shard_;  // this rank's heads, groups, experts (all of them at size 1)
  int32_t max_blocks_per_seq_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Weights> weights_;
  std::vector<LayerCache> caches_;
  StepMeta meta_;
  std::vector<std::pair<int32_t, int32_t>> saves_;  // (slot, snapshot row) after the forward
};

}  // namespace dsv4
