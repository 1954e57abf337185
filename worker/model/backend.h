// Backend: the op seam between the DSV4 model code (dsv4_model.cc) and an execution engine.
//
// The model is written once against this interface; the CPU reference backend (worker/cpu/) and
// the CUDA backend (a run-time-loaded plugin) implement it. Model code only allocates tensors,
// calls ops and reads back logits; it never touches tensor memory, so every piece of per-step
// state a kernel needs (token ids, positions, block tables, ...) reaches the backend through
// StepMeta in BeginStep().
//
// Conventions for every op: tensors are contiguous, row-major; shapes are in the comments;
// "T" is the number of tokens in the step, "S" the number of sequences. Ops may not alias inputs
// and outputs unless the comment says "in place". Ops return a Status (launch or validation
// errors); the CPU backend validates shapes and returns InvalidArgument on a mismatch.
//
// Ownership: a Backend owns all memory it hands out. Weights and pools live until the backend is
// destroyed; scratch tensors live until the next BeginStep(). Not thread-safe: one thread drives
// one backend.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor_parallel.h"
#include "kernels/ragged_batch.h"
#include "worker/model/tensor.h"

namespace dsv4 {

class Communicator;  // parallel/communicator.h

struct StoredWeight;  // worker/checkpoint/stored_weight.h
struct ModelConfig;   // common/model_config.h

// Host-side description of one ragged step. Sequences own contiguous runs of tokens.
struct StepMeta {
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  std::vector<int32_t> token_ids;      // [T]
  std::vector<int32_t> positions;      // [T] absolute position of each token
  std::vector<int32_t> token_seq;      // [T] sequence of each token
  std::vector<int32_t> seq_begin;      // [S+1] token index where each sequence's run starts
  std::vector<int32_t> seq_start_pos;  // [S] tokens already cached before this step
  std::vector<int32_t> state_slot;     // [S] state-pool slot of each sequence
  std::vector<int32_t> block_table;    // [S * block_stride] context-pool blocks, -1 padded
  int32_t block_stride = 0;
  int32_t block_size = 0;              // tokens per context block
  std::vector<int32_t> logit_rows;     // token indices whose logits are returned
  // Lightning indexer: score even when all visible candidates fit in top-k (the short-context
  // shortcut is off).
  bool force_indexer_scoring = false;
  // Capacity bound on any position (max_model_len - 1). Host-side launch choices that are
  // captured into a CUDA graph are sized by this bound, never by this step's positions: a graph
  // captured at short context must stay correct when replayed on long cached prefixes.
  int32_t max_position_bound = -1;
  // Prefix caching: state snapshots taken inside the step (RingSnapshot, CompressSnapshot).
  std::vector<int32_t> snap_seq, snap_pos, snap_row;
};

// Points in the forward pass the model announces to the backend (the CUDA backend cuts its
// piecewise graphs there).
enum class StepMark {
  kAttentionBegin,  // the attention block of a layer starts (after its input norm)
  kAttentionEnd,    // it ended (its output projection is done)
  kLayersEnd,       // the last layer is done; the head follows
  // A layer's bounds: the scratch its ops take after kLayerBegin is read by nothing after
  // kLayerEnd (the layer's outputs live in tensors taken before kLayerBegin), so a backend may
  // give that scratch to the next layer (the CUDA backend does in large eager steps: prefill
  // scratch then grows with one layer, not with the model's depth).
  kLayerBegin,
  kLayerEnd,
  // Side work (the compressors of a layer): ops between kSideBegin and kSideEnd depend only on
  // what came before kSideBegin outside other side regions that are not joined yet, and nothing
  // reads their results before kSideJoin, so a backend may run them concurrently with the ops
  // that follow kSideEnd and with the other side regions before the join.
  kSideBegin,
  kSideEnd,
  kSideJoin,
};

// Eager steps of at least this many tokens may reuse a layer's scratch for the next
// (StepMark::kLayerBegin); the memory plan (Dsv4Model::StepScratchBytes) counts every layer's
// for smaller steps.
constexpr int32_t kLayerReuseMinTokens = 32;

// The step's metadata as a view over the host arrays of `meta` (valid while `meta` lives).
inline RaggedBatchView HostView(const StepMeta& meta) {
  RaggedBatchView v;
  v.num_tokens = meta.num_tokens;
  v.num_seqs = meta.num_seqs;
  v.token_ids = meta.token_ids.data();
  v.positions = meta.positions.data();
  v.token_seq = meta.token_seq.data();
  v.seq_begin = meta.seq_begin.data();
  v.seq_start_pos = meta.seq_start_pos.data();
  v.state_slot = meta.state_slot.data();
  v.block_table = meta.block_table.data();
  v.block_stride = meta.block_stride;
  v.block_size = meta.block_size;
  v.force_indexer_scoring = meta.force_indexer_scoring;
  v.num_snapshots = static_cast<int32_t>(meta.snap_seq.size());
  v.snap_seq = meta.snap_seq.data();
  v.snap_pos = meta.snap_pos.data();
  v.snap_row = meta.snap_row.data();
  return v;
}

struct RmsNormParams {
  float eps = 1e-6f;
};

// Interleaved partial RoPE on the trailing `rope_dims` channels of each row.
struct RopeParams {
  int64_t rope_dims = 0;
  Tensor inv_freq;         // [rope_dims/2] f32
  bool inverse = false;    // rotate by -angle (the attention output's inverse RoPE)
};

struct HcParams {
  int64_t hc_mult = 4;
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
};

// One compressor (main or indexer) of a CSA/HCA layer. dsv4-model.md §7.
struct CompressParams {
  int64_t ratio = 0;       // m: tokens per window
  int64_t overlap = 1;     // c: 2 for CSA (overlapping windows), 1 for HCA
  int64_t dim = 0;         // d: width of an entry
  Tensor position_bias;    // [m, c*d] f32
  Tensor norm_weight;      // [d] f32
  float norm_eps = 1e-6f;
  RopeParams rope;         // compress rope applied at position w*m
};

struct IndexerParams {
  int64_t ratio = 0;       // m of the CSA layer
  int64_t topk = 0;
  float weight_scale = 1;  // nI^-0.5
  float score_scale = 1;   // dI^-0.5
};

struct AttentionParams {
  int64_t window = 0;      // sliding window including the current token
  int64_t ratio = 0;       // 0: sliding only
  bool dense_compressed = false;  // HCA: every visible entry; CSA: the indexer's selection
  float scale = 1;         // hd^-0.5
  // Applied to the output (the model's inverse RoPE) when rope_dims > 0: the attention's own
  // last step, which a backend may fuse into its output writes.
  RopeParams out_rope;
};

struct RouterParams {
  int64_t top_k = 0;
  float routed_scale = 1;
  bool hash = false;       // route through tid2eid instead of biased top-k
  // Expert parallelism: this rank holds experts [expert_begin, expert_begin + local_experts);
  // Route writes their ids less expert_begin and -1 for every other expert (0: all experts here).
  int64_t expert_begin = 0;
  int64_t local_experts = 0;
};

// How a weight is used: GEMM operands and embedding tables may be stored in a lower precision
// (bf16 on the GPU by default); parameters (norms, biases, gates of mHC, sinks, index tables) keep
// their own dtype.
enum class WeightUse { kParam, kMatrix };

// A deterministic synthetic weight: element i is SyntheticUniform(seed, i, lo, hi) for f32, or
// SyntheticIndex(seed, i, modulus) for i32 (kernels/counter_rng.h), so every backend materialises
// the same values without a file.
struct SyntheticSpec {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t seed = 0;
  float lo = 0, hi = 0;
  int32_t modulus = 1;
  // A matrix in a released format (kernels/quant_synthetic.h): the same values quantised, FP8
  // with block_rows x block_cols blocks (its scale grid restarting every part_rows rows) or MXFP4.
  QuantFormat format = QuantFormat::kNone;
  int32_t block_rows = 128, block_cols = 128;
  int64_t part_rows = 0;
};

// An mHC gate (the HcPre / HcHead mixing weights and parameters) and the RMSNorm applied to its
// collapsed output (norm_weight [D], empty for an unweighted norm).
struct HcGateNorm {
  Tensor fn, base, scale;
  HcParams hc;
  Tensor norm_weight;
  RmsNormParams norm;
};

// One MoE layer's expert weights: routed gate_up [E, 2I, D] (gate rows, then up rows) and
// down [E, D, I]; the shared expert's gate_up [2I, D] and down [D, I], both empty for none.
struct MoeWeights {
  Tensor gate_up, down;
  Tensor shared_gate_up, shared_down;
  // The shared expert's SwiGLU(shared_gate_up · u) [T, I] when it was computed ahead
  // (Backend::SharedExpertUp, e.g. overlapping the router); empty: computed with the experts.
  Tensor shared_h;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory ----
  // A persistent weight built from host data (the backend picks its storage precision by `use`).
  virtual absl::StatusOr<Tensor> CreateWeight(const HostTensor& src, WeightUse use) = 0;
  // A persistent weight from the form the checkpoint stores it in (dense values, FP8 block-scaled
  // or MXFP4). This default dequantises on the host and calls CreateWeight (the CPU reference);
  // a backend that computes with quantised weights keeps them (the CUDA backend, for matrices).
  virtual absl::StatusOr<Tensor> CreateStoredWeight(const StoredWeight& src, WeightUse use);
  // A persistent weight filled in place from `spec` (no host copy of the data).
  virtual absl::StatusOr<Tensor> CreateSyntheticWeight(const SyntheticSpec& spec, WeightUse use) = 0;
  // OK when every op runs at `config`'s shapes; otherwise an error naming the config field and the
  // values this backend supports (the model refuses to load: a config never fails at its first
  // step). The CPU reference runs every valid config.
  virtual absl::Status Supports(const ModelConfig& config) const { return absl::OkStatus(); }
  // OK when this backend can run rank `layout.rank` of a tensor-parallel group of
  // `layout.world_size`: it has that group's communicator (AllReduceSum) and its Route and
  // MoeExperts take expert-parallel ids. The default cannot (Unimplemented, naming the backend).
  virtual absl::Status SupportsTensorParallel(const ParallelLayout& layout) const;
  // Hands the backend its group's communicator (not owned; it must outlive the backend).
  virtual absl::Status AttachCommunicator(Communicator* comm) {
    return absl::UnimplementedError("this backend takes no communicator");
  }
  // Bytes per element of a dense weight matrix, and whether FP8/MXFP4 matrices stay in their
  // formats (else they cost dense bytes): what the load's memory plan counts.
  virtual int DenseMatrixBytes() const { return 4; }
  virtual bool KeepsQuantizedMatrices() const { return false; }
  // Device memory still free (the CUDA backend: cudaMemGetInfo), for the load's fit check;
  // Unimplemented where memory is the host's.
  virtual absl::StatusOr<uint64_t> FreeMemoryBytes() const {
    return absl::UnimplementedError("host memory");
  }
  // A persistent zero-filled pool (KV entries, state).
  virtual absl::StatusOr<Tensor> CreatePool(DType dtype, Shape shape) = 0;
  // A scratch tensor valid until the next BeginStep().
  virtual absl::StatusOr<Tensor> Scratch(DType dtype, Shape shape) = 0;
  // Starts a step: scratch is recycled and `meta` is staged for the ops. `meta` must outlive the
  // step.
  virtual absl::Status BeginStep(const StepMeta& meta) = 0;
  // A point of the forward pass (see StepMark); no-op by default.
  virtual absl::Status Mark(StepMark) { return absl::OkStatus(); }
  // True when the backend resolves a token id of kDeferredToken (SequenceStep::deferred_token) on
  // the device, from the token last sampled into the sequence's state slot.
  virtual bool deferred_tokens() const { return false; }
  // Copies a tensor to host memory of at least src.nbytes() bytes; waits for completion.
  virtual absl::Status CopyToHost(const Tensor& src, void* dst) = 0;
  // Copies dst.nbytes() bytes of host memory into a tensor (tests and tools); waits for completion.
  virtual absl::Status CopyFromHost(const void* src, Tensor dst) = 0;

  // ---- collectives (tensor parallelism) ----
  // x = the sum of every rank's x, on every rank (the same bits everywhere).
  virtual absl::Status AllReduceSum(Tensor x);

  // ---- dense ops ----
  // out[T, D] = table[token_ids[t]]
  virtual absl::Status Embed(const Tensor& table, Tensor out) = 0;
  // y[M, N] = x[M, K] · w[N, K]ᵀ
  virtual absl::Status Linear(const Tensor& x, const Tensor& w, Tensor y) = 0;
  // Grouped: y[:, g*N:(g+1)*N] = x[:, g*K:(g+1)*K] · w[g*N:(g+1)*N, :]ᵀ for g < groups.
  // x [M, groups*K], w [groups*N, K], y [M, groups*N].
  virtual absl::Status GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups, Tensor y) = 0;
  // Row-wise RMSNorm over the last dim; `weight` may be empty (unweighted). In place allowed.
  virtual absl::Status RmsNorm(const Tensor& x, const Tensor& weight, const RmsNormParams& p,
                               Tensor y) = 0;
  // x [T, heads, dim] rotated in place at each token's position.
  virtual absl::Status Rope(Tensor x, const RopeParams& p) = 0;
  // RmsNorm of every [dim] row of x [T, heads, dim] in place, then Rope (one kernel where the
  // backend fuses them; this default runs the two ops).
  virtual absl::Status RmsNormRope(Tensor x, const Tensor& weight, const RmsNormParams& norm,
                                   const RopeParams& rope);
  // out = a + b (same shapes). In place allowed.
  virtual absl::Status Add(const Tensor& a, const Tensor& b, Tensor out) = 0;
  // out[R, D] = x[logit_rows[r]]
  virtual absl::Status GatherLogitRows(const Tensor& x, Tensor out) = 0;

  // ---- mHC (dsv4-model.md §4) ----
  // hs[T, n, D] = x[T, D] copied into each stream.
  virtual absl::Status HcExpand(const Tensor& x, Tensor hs) = 0;
  // hs[T, n, D] = table[token_ids[t]] copied into each stream: Embed then HcExpand (one kernel
  // where the backend fuses them; this default runs the two ops).
  virtual absl::Status EmbedExpand(const Tensor& table, Tensor hs);
  // From streams hs[T, n, D]: collapsed[T, D], post[T, n], comb[T, n, n].
  virtual absl::Status HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base,
                             const Tensor& scale, const HcParams& p, Tensor collapsed, Tensor post,
                             Tensor comb) = 0;
  // out[k] = post_k · f + Σ_j comb[j, k] · hs[j]
  virtual absl::Status HcPost(const Tensor& hs, const Tensor& f, const Tensor& post,
                              const Tensor& comb, Tensor out) = 0;
  // y[T, D] = Σ_j pre_j hs[j] with the head's own pre gate.
  virtual absl::Status HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base,
                              const Tensor& scale, const HcParams& p, Tensor y) = 0;
  // The sub-block boundaries, which a backend may fuse (these defaults run the ops one by one):
  // normed[T, D] = RmsNorm(HcPre(hs).collapsed) with post and comb as HcPre.
  virtual absl::Status HcPreNorm(const Tensor& hs, const HcGateNorm& g, Tensor normed, Tensor post,
                                 Tensor comb);
  // hs_out = HcPost(hs, f, post, comb), then HcPreNorm(hs_out, g, normed, post_out, comb_out);
  // post_out / comb_out may be post / comb (they are read before they are written).
  virtual absl::Status HcPostPreNorm(const Tensor& hs, const Tensor& f, const Tensor& post,
                                     const Tensor& comb, Tensor hs_out, const HcGateNorm& g,
                                     Tensor normed, Tensor post_out, Tensor comb_out);
  // y[T, D] = RmsNorm(HcHead(hs)).
  virtual absl::Status HcHeadNorm(const Tensor& hs, const HcGateNorm& g, Tensor y);

  // ---- attention state and compressed attention (§6–§9, §11) ----
  // Feeds each token's projections a[T, c*d], z[T, c*d] into its sequence's compressor state
  // (state [slots, CompressStateFloats]) in position order, and writes every entry whose window
  // closes into entries [blocks, block_size/m, d] (normed and roped).
  virtual absl::Status Compress(const CompressParams& p, const Tensor& a, const Tensor& z,
                                Tensor state, Tensor entries) = 0;
  // Lightning-indexer selection for each token: out [T, topk] int32, entry indices sorted
  // ascending, -1 padded. q [T, nI, dI] roped, weights [T, nI], keys [blocks, bs/m, dI].
  virtual absl::Status IndexerTopK(const IndexerParams& p, const Tensor& q, const Tensor& weights,
                                   const Tensor& keys, Tensor out) = 0;
  // One softmax (with per-head sink) over the raw window ∪ compressed entries.
  // q [T, H, hd]; kv [T, hd] this step's keys (= values); ring [slots, W, hd] earlier keys;
  // entries [blocks, bs/m, hd] (empty for sliding layers); selected [T, topk] (CSA) or empty;
  // sinks [H]; out [T, H, hd].
  virtual absl::Status Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                                 const Tensor& ring, const Tensor& entries, const Tensor& selected,
                                 const Tensor& sinks, Tensor out) = 0;
  // Writes each token's kv [T, hd] into its sequence's ring [slots, W, hd] at position mod W.
  // Must run after Attention of the same step.
  virtual absl::Status RingWrite(const Tensor& kv, Tensor ring) = 0;

  // ---- prefix caching: state snapshots at block boundaries (kernels/state_snapshot_ref.h) ----
  // Pools of per-sequence state have rows past the slots (CacheConfig::num_state_snapshots).
  // The step's in-step snapshots (StepMeta::snap_*): the ring [rows, W, hd] at each snapshot's
  // position into its row. Must run before RingWrite of the same step.
  virtual absl::Status RingSnapshot(const Tensor& kv, Tensor ring) = 0;
  // The compressor state [rows, CompressStateFloats] at each snapshot's position into its row
  // (a, z as for Compress). Must run before Compress of the same step.
  virtual absl::Status CompressSnapshot(const CompressParams& p, const Tensor& a, const Tensor& z,
                                        Tensor state) = 0;
  // For each (src, dst): row src of every pool (rows on dim 0) copied onto row dst, in stream
  // order with the steps (outside any graph). No dst is another pair's src; dsts are distinct.
  virtual absl::Status CopyStateRows(std::span<const Tensor> pools,
                                     std::span<const std::pair<int32_t, int32_t>> copies) = 0;

  // ---- MoE (§10) ----
  // logits [T, E] -> idx [T, K] int32 and weights [T, K]. bias [E] (score routing) and tid2eid
  // [V, K] int32 (hash routing) may be empty when unused.
  virtual absl::Status Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                             const Tensor& tid2eid, Tensor idx, Tensor weights) = 0;
  // out[T, D] = Σ_k weights[t,k] · Expert_{idx[t,k]}(u[t]) + SharedExpert(u[t]) (MoeWeights),
  // Expert(u) = down · SwiGLU(gate_up · u) with the clamp `swiglu_limit`.
  virtual absl::Status MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                                  const MoeWeights& w, float swiglu_limit, Tensor out) = 0;
  // (idx entries of -1 are experts of another rank: skipped; RouterParams::local_experts.)
  // h[M, I] = silu(min(gu[:, :I], L)) * clamp(gu[:, I:], -L, L)
  virtual absl::Status SwiGlu(const Tensor& gate_up, float limit, Tensor h) = 0;
  // h[T, I] = SwiGLU(shared_gate_up · u), the shared expert's first half, which reads u only:
  // the model runs it as side work next to the router and passes h on as MoeWeights::shared_h.
  // This default runs Linear and SwiGlu.
  virtual absl::Status SharedExpertUp(const Tensor& u, const MoeWeights& w, float swiglu_limit,
                                      Tensor h);
};

// out += shared_down · SwiGLU(shared_gate_up · u) through the backend's own ops (a no-op without a
// shared expert; w.shared_h, when given, is the SwiGLU): the shared expert for backends that do
// not fuse it into MoeExperts.
absl::Status AddSharedExpert(Backend& be, const Tensor& u, const MoeWeights& w,
                             float swiglu_limit, Tensor out);

// Floats of compressor state per sequence slot: the open window's raw projections (a and z,
// m x c*d each) and, for overlapping (CSA) compressors, the previous window's first halves
// (values and biased logits, m x d each).
inline int64_t CompressStateFloats(int64_t ratio, int64_t overlap, int64_t dim) {
  return 2 * ratio * overlap * dim + (overlap == 2 ? 2 * ratio * dim : 0);
}

}  // namespace dsv4
