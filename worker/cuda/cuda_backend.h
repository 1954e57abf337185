// CudaBackend: the Backend op seam on one GPU. Weights, pools and scratch live in device memory;
// every op is an asynchronous launch on the backend's stream (kernels/cuda/*), GEMMs go through
// cuBLASLt. Big matrices are stored in bf16 by default (fp32 with DType::kF32 for exact checks);
// activations, norms, mHC and state pools are fp32.
//
// Per-step metadata (token ids, positions, block tables, ...) is packed on the host into a pinned
// staging buffer and copied with one transfer into a persistent device buffer whose address stays
// fixed while its capacity suffices; the packing is a function of the step's (padded) shape, so
// every step of one graph shape reads the same addresses (Baked() lists them for the check at
// replay).
//
// Host-side launch choices (docs/cuda-graphs.md):
//   * eagerly, they follow this step's positions: the indexer's short-context shortcut (when no
//     token sees more than top-k compressed entries and scoring is not forced, the select-all
//     kernel runs alone), the scorer's candidate bound and attention's key splits;
//   * while the stream is capturing, they follow the capacity bound (StepMeta::max_position_bound)
//     and the shortcut is never taken, so a graph captured at short context stays exact on long
//     prefixes (the vLLM #52448 failure). set_shortcut_in_capture(true) re-enables the bug, for
//     the regression test's self-check only.
//
// Scratch comes from two bump arenas: the model's (Scratch(), deterministic for one step shape,
// so piecewise replays see the capture's addresses) and the ops' own temporaries.
//
// Not thread-safe; the device is made current on the calling thread in BeginStep().
#pragma once

#include <array>
#include <tuple>
#include <memory>
#include <set>
#include <vector>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/moe.h"
#include "kernels/ragged_batch.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/op_profile.h"
#include "worker/model/backend.h"

namespace dsv4 {

// The piecewise graphs of one padded step shape: the layers cut into segments at the eager
// regions, launched in order between the eager ops.
struct PiecewiseGraph {
  std::vector<CudaGraphExec> segments;
  std::vector<std::pair<size_t, size_t>> arena_marks;  // model-arena position at each cut
  bool captured = false;
};

// What runs eagerly between piecewise segments: the sparse indexer scoring and the attention core
// (narrow), or each layer's whole attention block (wide; for comparison).
enum class EagerRegion { kNarrow, kWide };

// The fewest rows of x a product takes FP8 activations at (CudaBackendOptions::fp8_activations):
// below, the FP8 GEMV (decode) or dequantised bf16 weights; the same on every rank.
constexpr int64_t kFp8ActivationRows = 128;

struct CudaBackendOptions {
  int device = 0;
  DType matrix_dtype = DType::kBF16;  // kBF16 or kF32
  // Every row's result independent of the step's other rows (docs/cuda-backend.md,
  // "Batch-invariant mode"): products through cuda::InvariantGemm, no single-row or split-K
  // kernels, attention without key splits. Slower; for bit-exact reproducibility.
  bool batch_invariant = false;
  // Products with FP8 block-scaled weights of at least kFp8ActivationRows rows (prefill) on FP8
  // tensor cores through cuBLASLt, with the activations quantised to e4m3 in 1 x 128 groups
  // (power-of-two scales, cuda::QuantizeFp8Groups), as DeepSeek's own inference does (precision
  // fp8; bf16 matrices only, not with batch_invariant).
  bool fp8_activations = false;
  size_t scratch_block_bytes = 256ull << 20;
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  absl::StatusOr<Tensor> CreateWeight(const HostTensor& src, WeightUse use) override;
  absl::StatusOr<Tensor> CreateStoredWeight(const StoredWeight& src, WeightUse use) override;
  absl::StatusOr<Tensor> CreateSyntheticWeight(const SyntheticSpec& spec, WeightUse use) override;
  absl::StatusOr<Tensor> CreatePool(DType dtype, Shape shape) override;
  absl::StatusOr<uint64_t> FreeMemoryBytes() const override;
  absl::Status Supports(const ModelConfig& config) const override;
  // Tensor parallelism: NCCL (device, stream-ordered, capturable) or Gloo (host-staged, eager
  // steps only).
  absl::Status AttachCommunicator(Communicator* comm) override;
  absl::Status SupportsTensorParallel(const ParallelLayout& layout) const override;
  absl::Status AllReduceSum(Tensor x) override;
  double TakeCollectiveSeconds() {
    const double s = collective_seconds_;
    collective_seconds_ = 0;
    return s;
  }
  int DenseMatrixBytes() const override { return options_.matrix_dtype == DType::kBF16 ? 2 : 4; }
  bool KeepsQuantizedMatrices() const override { return true; }
  absl::StatusOr<Tensor> Scratch(DType dtype, Shape shape) override;
  absl::Status BeginStep(const StepMeta& meta) override;
  absl::Status Mark(StepMark mark) override;
  absl::Status CopyToHost(const Tensor& src, void* dst) override;
  absl::Status CopyFromHost(const void* src, Tensor dst) override;

  absl::Status Embed(const Tensor& table, Tensor out) override;
  absl::Status Linear(const Tensor& x, const Tensor& w, Tensor y) override;
  absl::Status GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups, Tensor y) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& weight, const RmsNormParams& p,
                       Tensor y) override;
  absl::Status Rope(Tensor x, const RopeParams& p) override;
  absl::Status RmsNormRope(Tensor x, const Tensor& weight, const RmsNormParams& norm,
                           const RopeParams& rope) override;
  absl::Status Add(const Tensor& a, const Tensor& b, Tensor out) override;
  absl::Status GatherLogitRows(const Tensor& x, Tensor out) override;
  absl::Status HcExpand(const Tensor& x, Tensor hs) override;
  absl::Status EmbedExpand(const Tensor& table, Tensor hs) override;
  absl::Status HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                     const HcParams& p, Tensor collapsed, Tensor post, Tensor comb) override;
  absl::Status HcPost(const Tensor& hs, const Tensor& f, const Tensor& post, const Tensor& comb,
                      Tensor out) override;
  absl::Status HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HcParams& p, Tensor y) override;
  absl::Status HcPreNorm(const Tensor& hs, const HcGateNorm& g, Tensor normed, Tensor post,
                         Tensor comb) override;
  absl::Status HcPostPreNorm(const Tensor& hs, const Tensor& f, const Tensor& post,
                             const Tensor& comb, Tensor hs_out, const HcGateNorm& g, Tensor normed,
                             Tensor post_out, Tensor comb_out) override;
  absl::Status HcHeadNorm(const Tensor& hs, const HcGateNorm& g, Tensor y) override;
  absl::Status Compress(const CompressParams& p, const Tensor& a, const Tensor& z, Tensor state,
                        Tensor entries) override;
  absl::Status IndexerTopK(const IndexerParams& p, const Tensor& q, const Tensor& weights,
                           const Tensor& keys, Tensor out) override;
  absl::Status Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& ring, const Tensor& entries, const Tensor& selected,
                         const Tensor& sinks, Tensor out) override;
  absl::Status RingWrite(const Tensor& kv, Tensor ring) override;
  absl::Status RingSnapshot(const Tensor& kv, Tensor ring) override;
  absl::Status CompressSnapshot(const CompressParams& p, const Tensor& a, const Tensor& z,
                                Tensor state) override;
  absl::Status CopyStateRows(std::span<const Tensor> pools,
                             std::span<const std::pair<int32_t, int32_t>> copies) override;
  absl::Status Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                     const Tensor& tid2eid, Tensor idx, Tensor weights) override;
  absl::Status MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                          const MoeWeights& w, float swiglu_limit, Tensor out) override;
  absl::Status SwiGlu(const Tensor& gate_up, float limit, Tensor h) override;
  absl::Status SharedExpertUp(const Tensor& u, const MoeWeights& w, float swiglu_limit,
                              Tensor h) override;

  cudaStream_t stream() const { return stream_.get(); }
  int device() const { return options_.device; }
  DType matrix_dtype() const { return options_.matrix_dtype; }
  size_t persistent_bytes() const { return persistent_bytes_; }
  // The current step's metadata as device pointers.
  const RaggedBatchView& view() const { return view_; }
  // Copies host data into device memory on the stream (pinned staging not required); waits.
  absl::Status Upload(const void* src, void* dst, size_t bytes);

  // ---- graphs (docs/cuda-graphs.md) ----
  // Whether the stream is capturing now.
  absl::StatusOr<bool> Capturing() const;
  // FULL graphs: starts capturing the stream (after BeginStep); the caller issues the forward and
  // its own launches, then ends with CudaGraphExec::EndCapture(stream()).
  absl::Status BeginCapture();
  // PIECEWISE: after BeginStep, runs the step's layers through `g`: capture = true records the
  // segments while executing the step, false replays them (the non-eager ops only stage their
  // scratch). Ends at Mark(kLayersEnd); the head runs eagerly.
  absl::Status BeginPiecewise(PiecewiseGraph* g, bool capture, EagerRegion region);
  // Ends a capture or a piecewise run left open by an error.
  void AbortGraphs();
  // The device addresses and shape scalars a captured step bakes in (metadata arrays, strides);
  // `with_head`: also the logit rows (FULL graphs capture the head, piecewise graphs do not).
  std::vector<uintptr_t> Baked(bool with_head) const;
  // Debug only: take the indexer shortcut even while capturing (reproduces vLLM #52448).
  void set_shortcut_in_capture(bool on) { shortcut_in_capture_ = on; }
  // The next BeginStep uploads `bytes` of `host` after the step's metadata, in the same transfer
  // (the worker's sampling rows: one copy less per step). payload() is their device address, 16-byte
  // aligned, until the next BeginStep; like the metadata's, it depends only on the step's (padded)
  // shape, so a graph may bake it. `host` must stay valid until BeginStep returns.
  void SetStepPayload(const void* host, size_t bytes) {
    payload_host_ = host;
    payload_bytes_ = bytes;
  }
  const void* payload() const { return payload_dev_; }
  // Overlapped decode: the [slots] device table where the worker's sampling leaves each slot's
  // last token; the embedding resolves a step's deferred tokens (kDeferredToken) from it.
  void set_slot_tokens(int32_t* table) { slot_tokens_ = table; }
  bool deferred_tokens() const override { return slot_tokens_ != nullptr; }

  // Op profiling (DSV4_PROFILE_OPS=1, worker/cuda/op_profile.h): null when off.
  OpProfile* profile() { return profile_.get(); }
  // The step's ops are issued: let them run (before waiting on the stream), then collect.
  void ProfileRelease() {
    if (profile_) profile_->Release();
  }
  absl::Status ProfileCollect() { return profile_ ? profile_->Collect() : absl::OkStatus(); }

 private:
  struct Arena {
    std::vector<DeviceBuffer> blocks;
    size_t block = 0, offset = 0;
    size_t used() const;  // bytes up to the bump position (the blocks before it whole)
    size_t held() const;  // bytes of all its blocks
  };
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}
  absl::StatusOr<Tensor> AllocPersistent(DType dtype, Shape shape);
  absl::StatusOr<Tensor> Bump(Arena* arena, DType dtype, Shape shape);
  // An op's own temporary (the ops' arena).
  absl::StatusOr<Tensor> OpScratch(DType dtype, Shape shape) { return Bump(&op_arena_, dtype, shape); }
  // Whether a 1-row product x · wᵀ goes to the single-token GEMV (kernels/cuda/gemv.h).
  bool UseRowGemv(const Tensor& x, const Tensor& w) const;
  // The sorted grouped expert path (no shared expert).
  absl::StatusOr<Tensor> CreateSyntheticQuantized(const SyntheticSpec& spec);
  // Quantised weights (kernels/quant_weights.h views of their tensors).
  static Fp8Matrix Fp8(const Tensor& w);
  static Mxfp4Matrix Mxfp4(const Tensor& w);
  absl::Status QuantLinear(const Tensor& x, const Tensor& w, int64_t groups, Tensor y);
  // QuantLinear on FP8 tensor cores (precision fp8): x to e4m3 per 1 x 128 group, then
  // cuBLASLt's block-scaled FP8 GEMM per group; whether these shapes take it.
  bool Fp8BlocksFit(const Tensor& x, const Fp8Matrix& m, int64_t groups, int64_t group_rows) const;
  absl::Status Fp8BlockLinear(int bench_op, const Tensor& x, const Fp8Matrix& m, int64_t groups,
                              int64_t group_rows, Tensor y);
  // The dequantised copy of an FP8 matrix for a product of more rows than the weight-streaming
  // kernel takes: one buffer per stream (main, side lanes), sized at load for the largest FP8
  // matrix, so that the copies of a step's many projections do not accumulate in the op arena
  // and graphs keep their addresses.
  absl::Status ReserveDequant(const Tensor& w);
  absl::StatusOr<Tensor> DequantBuffer(const Tensor& w, DType dtype);
  absl::Status QuantMoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                               const MoeWeights& w, float swiglu_limit, Tensor out);
  absl::Status RoutedExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                             const MoeWeights& w, float swiglu_limit, Tensor out);
  // The stream ops launch on: a side stream between StepMark::kSideBegin and kSideEnd (the
  // compressors overlap the query path; joined by events, captured as graph branches).
  cudaStream_t cur_stream() const { return on_side_ ? side_[side_lane_].get() : stream_.get(); }
  // Positions the host sizes launches by: the capacity bound while capturing, else this step's.
  absl::StatusOr<int64_t> LaunchMaxPosition() const;
  // Piecewise cuts: EnterEager ends (capture) or launches (replay) the current segment; LeaveEager
  // resumes capturing or skipping.
  absl::Status EnterEager();
  absl::Status LeaveEager();
  absl::Status CutSegment();
  // Replaying a piecewise segment: the op's launches are in the graph.
  bool skip() const { return skip_; }
  // The embedding's deferred-token operands: the view's ids live in meta_dev_, which this backend
  // owns, so the kernel may write the resolved ids back.
  cuda::DeferredTokens Deferred() const {
    return {slot_tokens_, const_cast<int32_t*>(view_.token_ids)};
  }
  absl::StatusOr<const void*> MatrixOperand(const Tensor& x, const Tensor& w);
  absl::StatusOr<Tensor> HcMix(const Tensor& hs, const Tensor& fn);

  CudaBackendOptions options_;
  std::unique_ptr<OpProfile> profile_;
  CudaStream stream_;
  // Side regions open before a join alternate between kSideLanes streams, so two independent
  // regions (a CSA layer's two compressors) run side by side; a third queues behind the first.
  // DSV4_TWO_SIDE_STREAMS=0 keeps every region on one side stream (the side-by-side baseline).
  static constexpr int kSideLanes = 2;
  int side_lanes_ = kSideLanes;
  std::array<CudaStream, kSideLanes> side_;
  std::array<CudaEvent, kSideLanes> side_done_;
  CudaEvent side_fork_;
  bool on_side_ = false;
  int side_lane_ = 0;         // the open region's lane, else the next region's
  unsigned side_pending_ = 0;  // lanes with a region not yet joined (bit mask)
  CudaEvent meta_copied_;
  std::unique_ptr<cuda::Gemm> gemm_;
  // Each side lane has its own cuBLASLt workspace: they run concurrently.
  std::array<std::unique_ptr<cuda::Gemm>, kSideLanes> side_gemm_;
  cuda::Gemm& gemm() { return on_side_ ? *side_gemm_[side_lane_] : *gemm_; }
  // y = x · wᵀ through cuBLASLt, or cuda::InvariantGemm in batch-invariant mode.
  absl::Status RunGemm(const cuda::GemmShape& s, const void* x, const void* w, float* y);
  // Joins every pending side lane (and the gates lane) into the main stream (errors returned,
  // not logged).
  absl::Status JoinSides();
  // The mHC boundaries' Sinkhorn (cuda::HcGates) is deferred to its own stream: forked after the
  // boundary's kernel, it writes post and comb while the sub-block's first products run. Joined
  // (JoinGates) before any op that reads or writes post / comb again, at every side join, before
  // a piecewise cut and before a copy to the host. Inline (no fork) when profiling or inside a
  // side region.
  CudaStream gates_stream_;
  size_t dequant_bytes_ = 0;                          // the largest FP8 matrix, as fp32
  std::vector<std::pair<cudaStream_t, DeviceBuffer>> dequant_;
  CudaEvent gates_fork_, gates_done_;
  bool gates_pending_ = false;
  absl::Status JoinGates();
  absl::Status DeferredGates(const cuda::HcDims& d, const Tensor& gates, const HcGateNorm& g,
                             Tensor post, Tensor comb);
  absl::Status BoundaryKernels(const cuda::HcDims& d, const cuda::HcPostIn* in, const Tensor& hs,
                               const HcGateNorm& g, Tensor normed, Tensor post, Tensor comb);
  std::vector<DeviceBuffer> persistent_;
  size_t persistent_bytes_ = 0;
  Arena model_arena_, op_arena_;
  DeviceBuffer meta_dev_;
  int32_t* slot_tokens_ = nullptr;  // owned by the worker
  const void* payload_host_ = nullptr;
  size_t payload_bytes_ = 0;
  const void* payload_dev_ = nullptr;
  uint64_t meta_generation_ = 0;  // bumped when meta_dev_ moves
  PinnedBuffer meta_host_;
  Communicator* comm_ = nullptr;  // not owned
  PinnedBuffer collective_host_;  // the host-staged all-reduce's buffer
  double collective_seconds_ = 0;
  RaggedBatchView view_;
  const int32_t* logit_rows_ = nullptr;
  int32_t num_logit_rows_ = 0;
  int32_t max_position_ = -1;
  int32_t max_position_bound_ = -1;
  Tensor step_scores_;  // the indexer's scores of this step (op arena)
  // Scratch of a layer given to the next (StepMark::kLayerBegin / kLayerEnd) in eager steps of at
  // least kLayerReuseMinTokens tokens (backend.h, which the memory plan counts by): a
  // prefill's scratch is one layer's, not the model's. Not in captured or piecewise steps (their
  // addresses are the graphs'), nor in small eager steps (the join at each layer's end would put
  // the deferred gates back on the critical path of a decode batch).
  bool layer_reuse_ = false;  // the open layer's scratch goes back at its kLayerEnd
  std::pair<size_t, size_t> layer_mark_model_, layer_mark_op_;
  absl::Status LayerMark(StepMark mark);
  // The largest scratch a step took (both arenas) and that step's tokens: printed when the
  // backend is destroyed, next to what the arenas hold.
  size_t scratch_high_ = 0;
  int32_t scratch_high_tokens_ = 0;
  bool shortcut_in_capture_ = false;
  // single-token GEMV / fused MoE kernels (kernels/cuda/gemv.h, moe_decode.h)
  bool row_gemv_ = true;
  bool hc_cluster_ = true;  // decode boundaries as one cluster launch (cuda::HcClusterNorm)
  bool hc_staged_ = true;   // prefill mHC kernels pipelined (DSV4_HC_STAGED)
  // FP8 products of at least this many rows on FP8 tensor cores (0: off; precision fp8).
  int64_t fp8_prefill_rows_ = 0;
  // The indexer's scores on TF32 tensor cores (bf16 mode; DSV4_INDEXER_TF32=0: the fp32 FMA
  // kernel, the A/B baseline).
  bool indexer_tf32_ = false;
  // (groups, N, K) of FP8 products cuBLASLt has no block-scaled algorithm for: the bf16 path.
  std::set<std::tuple<int64_t, int64_t, int64_t>> fp8_blocks_refused_;
  cuda::MoeKernels moe_kernels_;  // the grouped expert kernels allowed (DSV4_MOE_WIDE, _TILED)
  bool defer_gates_ = true;  // the boundaries' Sinkhorn on the gates stream (DeferredGates)
  // Benchmarks only, DSV4_BENCH_REPEAT_OPS=Op,Op,...: the named ops launch their kernels twice
  // (the work inside Launch's lambda; e.g. not the bf16 cast of a cuBLASLt operand), so a
  // captured step's time grows by what the second launch costs on the step's critical path
  // (nothing else measures an op inside a graph). The second launch of an op that updates
  // something in place (RmsNorm, Rope, RmsNormRope, HcPostPreNorm's post and comb, Compress's
  // state) works on the first one's output, and a repeated HcPostPreNorm races with the first
  // launch's deferred gates: the values after it are not the model's, and the compressor state
  // and the KV ring stay wrong for later steps. For timing runs on synthetic weights only; no
  // index or address is computed from such values, so nothing reads out of bounds.
  // Bit i: BenchOp i (cuda_backend.cc).
  uint32_t repeat_ops_ = 0;
  template <class F>
  absl::Status Launch(int bench_op, F&& launch) {
    absl::Status st = launch();
    if (st.ok() && (repeat_ops_ >> bench_op & 1u) != 0) st = launch();
    return st;
  }
  // Piecewise state.
  PiecewiseGraph* pw_ = nullptr;
  bool pw_capture_ = false;
  EagerRegion pw_region_ = EagerRegion::kNarrow;
  int eager_depth_ = 0;
  size_t pw_segment_ = 0;
  bool skip_ = false;
};

}  // namespace dsv4
