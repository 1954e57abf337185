#include "worker/cuda/cuda_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "common/status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model_steps.h"
#include "worker/worker_factory.h"

namespace dsv4 {
namespace {

bool UsesPenalties(const SamplingSpec& s) {
  return s.repetition_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f;
}

// Bump layout inside the staging buffers (host and device share offsets).
class Packer {
 public:
  template <typename T>
  size_t Add(size_t count) {
    off_ = (off_ + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) *
           alignof(std::max_align_t);
    const size_t at = off_;
    off_ += sizeof(T) * count;
    return at;
  }
  size_t size() const { return off_; }

 private:
  size_t off_ = 0;
};

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A row that samples greedily with no penalties: FULL graphs sample every padded row.
cuda::SampleRow InertRow() {
  cuda::SampleRow row{};
  row.top_p = 1;
  row.repetition_penalty = 1;
  row.counts_row = -1;
  row.slot = -1;  // leaves every slot's last token alone
  return row;
}

}  // namespace

CudaWorker::CudaWorker(int device) : device_(device) {}

CudaWorker::~CudaWorker() { Shutdown(); }

absl::Status CudaWorker::Configure(const WorkerConfig& config) {
  RETURN_IF_ERROR(life_.Check("Configure", Lifecycle::kCreated));
  ASSIGN_OR_RETURN(precision_, ParsePrecision(config.precision));
  WeightsSpec weights;
  RETURN_IF_ERROR(ParseWeightFormat(config.weight_format, &weights));
  if (!config.synthetic && config.model_dir.empty()) {
    return absl::InvalidArgumentError("WorkerConfig.model_dir: no checkpoint and not synthetic");
  }
  load_.keep_formats = weights.keep_formats;
  load_.synthetic_released_formats = weights.keep_formats;
  CudaGraphOptions graphs = config.graphs;
  ASSIGN_OR_RETURN(const bool enforce_eager, EnvBool("DSV4_ENFORCE_EAGER", false));
  ASSIGN_OR_RETURN(const int region, EnvChoice("DSV4_PIECEWISE_EAGER_REGION", {"narrow", "wide"}, 0));
  ASSIGN_OR_RETURN(const bool shortcut, EnvBool("DSV4_DEBUG_INDEXER_SHORTCUT_IN_CAPTURE", false));
  graphs.enforce_eager |= enforce_eager;
  graphs.wide_eager_region |= region == 1;
  graphs.shortcut_in_capture |= shortcut;
  options_ = graphs;
  ASSIGN_OR_RETURN(time_steps_, EnvBool("DSV4_STEP_DEVICE_TIME", false));
  config_ = config;
  life_.Enter(Lifecycle::kConfigured);
  return absl::OkStatus();
}

absl::Status CudaWorker::Load(const LoadProgressFn& progress) {
  RETURN_IF_ERROR(life_.Check("Load", Lifecycle::kConfigured));
  CudaBackendOptions options;
  options.device = device_;
  options.matrix_dtype = precision_ == Precision::kFP32 ? DType::kF32 : DType::kBF16;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  CudaBackend* be = backend.get();
  LoadOptions load = load_;
  if (progress) {
    load.on_layer = [&progress](int64_t done, int64_t total) {
      progress(LoadProgress{"weights", done, total});
    };
  }
  if (config_.synthetic) {
    ASSIGN_OR_RETURN(model_, Dsv4Model::LoadSynthetic(config_.model, config_.synthetic_seed,
                                                      std::move(backend), config_.cache, load));
  } else {
    ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(config_.model_dir));
    ASSIGN_OR_RETURN(model_,
                     Dsv4Model::Load(config_.model, *ckpt, std::move(backend), config_.cache, load));
  }
  backend_ = be;
  RETURN_IF_ERROR(Setup());
  info_.num_blocks = model_->cache().num_blocks;
  info_.num_slots = model_->cache().num_slots;
  info_.block_size = model_->cache().block_size;
  info_.max_model_len = model_->cache().max_model_len;
  // Op profiling brackets one step at a time.
  info_.overlap = backend_->profile() == nullptr;
  info_.max_in_flight = info_.overlap ? kMaxInFlight : 1;
  if (progress) progress(LoadProgress{"pools", 1, 1});
  life_.Enter(Lifecycle::kLoaded);
  return absl::OkStatus();
}

absl::Status CudaWorker::Setup() {
  backend_->set_shortcut_in_capture(options_.shortcut_in_capture);
  for (Staging& st : staging_) {
    ASSIGN_OR_RETURN(st.done, CudaEvent::Create(cudaEventDisableTiming));
    if (time_steps_) {
      ASSIGN_OR_RETURN(st.begin, CudaEvent::Create());
      ASSIGN_OR_RETURN(st.end, CudaEvent::Create());
      ASSIGN_OR_RETURN(st.pre, CudaEvent::Create());
      ASSIGN_OR_RETURN(st.post, CudaEvent::Create());
    }
  }
  const size_t slot_bytes = sizeof(int32_t) * static_cast<size_t>(model_->cache().num_slots);
  ASSIGN_OR_RETURN(slot_tokens_, AllocDevice(std::max<size_t>(slot_bytes, sizeof(int32_t))));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(slot_tokens_.get(), 0, slot_bytes, backend_->stream()));
  backend_->set_slot_tokens(static_cast<int32_t*>(slot_tokens_.get()));
  return absl::OkStatus();
}

absl::Status CudaWorker::WarmUp() {
  // Graphs are captured at the first step of each size (RunFull, BeginPiecewise).
  RETURN_IF_ERROR(life_.Check("WarmUp", Lifecycle::kLoaded));
  life_.Enter(Lifecycle::kReady);
  return absl::OkStatus();
}

void CudaWorker::Shutdown() {
  if (life_.stage() == Lifecycle::kShutDown) return;
  life_.Enter(Lifecycle::kShutDown);
  if (backend_ == nullptr) return;  // nothing was loaded
  // Launched steps (or what a failed one queued) may still use the staging buffers.
  (void)cudaStreamSynchronize(backend_->stream());
  flights_.clear();
  last_slots_.clear();
  full_.clear();
  piecewise_.clear();
  for (Staging& st : staging_) st = Staging{};
  seen_ = DeviceBuffer();
  outputs_ = DeviceBuffer();
  slot_tokens_ = DeviceBuffer();
  backend_ = nullptr;
  model_.reset();
  if (phases_.empty()) return;
  // Medians over the recorded steps (captures and prefills are a few outliers among the decode
  // steps).
  const char* names[] = {"pack",   "prepare", "launch", "wait",
                         "finish", "device",  "upload", "return"};
  std::string line =
      absl::StrCat("cuda worker: per-step medians over ", phases_.size(), " steps (us):");
  for (size_t k = 0; k < 8; ++k) {
    std::vector<double> v;
    v.reserve(phases_.size());
    for (const auto& p : phases_) v.push_back(p[k]);
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    absl::StrAppend(&line, " ", names[k], " ", absl::StrFormat("%.1f", v[v.size() / 2] * 1e6));
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  phases_.clear();
}

WorkerInfo CudaWorker::info() const {
  WorkerInfo w = info_;
  w.device = absl::StrCat("cuda:", device_);
  w.precision = PrecisionName(precision_);
  w.cuda_graphs = true;
  return w;
}

void CudaWorker::ClearGraphs() {
  full_.clear();
  piecewise_.clear();
}

absl::Status CudaWorker::EnsureCounts() {
  if (seen_.get() != nullptr) return absl::OkStatus();
  const size_t bytes = sizeof(int32_t) * static_cast<size_t>(model_->cache().num_slots) *
                       static_cast<size_t>(model_->config().vocab_size);
  ASSIGN_OR_RETURN(seen_, AllocDevice(bytes));
  ASSIGN_OR_RETURN(outputs_, AllocDevice(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(seen_.get(), 0, bytes, backend_->stream()));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(outputs_.get(), 0, bytes, backend_->stream()));
  return absl::OkStatus();
}

// The staged FULL step: captures the graph when it has none (or a baked address moved) and
// launches it. Its sampling rows and mask ids came up with the step's metadata (`dev_rows`,
// `dev_mask`: the backend's payload, at an address fixed by the padded shape); its results land
// in the graph's own buffer (`*outs`) and, when `host_outs` (mapped pinned memory) is given, the
// graph's last node copies them there (`*copied`): that node's destination is set before each
// launch, as the launches alternate between two staging sets.
absl::Status CudaWorker::RunFull(int32_t padded, int64_t rows, const cuda::SampleRow* dev_rows,
                                 const int32_t* dev_mask, void* host_outs, GraphRun* run,
                                 const void** outs, bool* copied) {
  cudaStream_t stream = backend_->stream();
  FullGraph& g = full_[padded];
  const size_t outs_bytes = sizeof(cuda::SampleOut) * rows;
  if (g.io.get() == nullptr || g.rows != rows) {
    ASSIGN_OR_RETURN(g.io, AllocDevice(outs_bytes));
    g.rows = static_cast<int32_t>(rows);
    g.captured = false;
  }
  auto* dev_outs = static_cast<cuda::SampleOut*>(g.io.get());
  *outs = dev_outs;
  *copied = host_outs != nullptr;
  const int64_t vocab = model_->config().vocab_size;
  auto* seen = static_cast<int32_t*>(seen_.get());
  auto* outputs = static_cast<int32_t*>(outputs_.get());
  // The forward, the sampling and the results' copy, as issued eagerly or into a capture.
  auto issue = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Tensor logits, model_->RunForward());
    ASSIGN_OR_RETURN(Tensor work, backend_->Scratch(DType::kF32, Shape{rows, vocab}));
    RETURN_IF_ERROR(cuda::Sample(logits.ptr<float>(), rows, vocab, dev_rows, dev_mask, seen,
                                 outputs, work.ptr<float>(), dev_outs,
                                 static_cast<int32_t*>(slot_tokens_.get()), stream));
    if (host_outs == nullptr) return absl::OkStatus();
    return cuda::CopyWords(dev_outs, host_outs, outs_bytes, stream);
  };
  // A graph this size cannot use (its capture or its update failed; nothing of it was queued):
  // the size runs eagerly from now on, this step included, and the step reports the fallback.
  auto run_eagerly = [&]() -> absl::Status {
    g.failed = true;
    g.captured = false;
    ++run->capture_failures;
    ++stats_.fallbacks;
    run->fallback = true;
    run->mode = GraphMode::kEager;
    return issue();
  };
  std::vector<uintptr_t> baked = backend_->Baked(/*with_head=*/true);
  baked.push_back(reinterpret_cast<uintptr_t>(dev_rows));
  baked.push_back(reinterpret_cast<uintptr_t>(dev_mask));
  baked.push_back(reinterpret_cast<uintptr_t>(seen));
  baked.push_back(reinterpret_cast<uintptr_t>(outputs));
  baked.push_back(host_outs != nullptr ? 1 : 0);
  if (!g.captured || g.baked != baked) {
    if (g.captured) ++stats_.recaptures;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = backend_->BeginCapture();
    if (st.ok()) st = issue();
    absl::StatusOr<CudaGraphExec> exec =
        st.ok() ? CudaGraphExec::EndCapture(stream, /*keep_graph=*/host_outs != nullptr)
                : absl::StatusOr<CudaGraphExec>(st);
    cudaGraphNode_t copy_node = nullptr;
    if (exec.ok() && host_outs != nullptr) {
      copy_node = exec->SinkNode();
      if (copy_node == nullptr || !cuda::IsCopyWordsNode(copy_node)) {
        exec = absl::InternalError("the FULL graph does not end in its results' copy");
      }
    }
    if (!exec.ok()) {
      // Nothing ran during the capture: the staged step still runs, eagerly.
      backend_->AbortGraphs();
      return run_eagerly();
    }
    g.exec = *std::move(exec);
    g.copy_node = copy_node;
    g.baked = std::move(baked);
    g.captured = true;
    ++run->captures;
    ++stats_.full_captures;
    run->capture_seconds += Since(t0);
  }
  if (g.copy_node != nullptr) {
    const absl::Status set =
        cuda::SetCopyWordsNode(g.exec.get(), g.copy_node, dev_outs, host_outs, outs_bytes);
    if (!set.ok()) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "cuda worker: %s; FULL graphs of %d tokens run eagerly\n",
                   std::string(set.message()).c_str(), padded);
      return run_eagerly();
    }
  }
  RETURN_IF_ERROR(g.exec.Launch(stream));
  ++run->replays;
  ++stats_.full_replays;
  run->mode = GraphMode::kFull;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> CudaWorker::Execute(const StepPlan& plan) {
  if (!flights_.empty()) {
    return absl::FailedPreconditionError("Execute with launched steps not yet collected");
  }
  RETURN_IF_ERROR(Launch(plan));
  return Collect();
}

absl::Status CudaWorker::Launch(const StepPlan& plan) {
  absl::Status st = LaunchStep(plan);
  if (!st.ok() && backend_ != nullptr) {
    // What the failed step queued may still read its staging, which the next launch (the same
    // parity) rewrites: let it drain first. A payload the failed step set but no step took must
    // not reach a later one.
    backend_->SetStepPayload(nullptr, 0);
    if (cudaStreamSynchronize(backend_->stream()) != cudaSuccess) (void)cudaGetLastError();
  }
  return st;
}

absl::Status CudaWorker::LaunchStep(const StepPlan& plan) {
  RETURN_IF_ERROR(life_.Check("Launch", Lifecycle::kReady));
  const auto t0 = std::chrono::steady_clock::now();
  if (static_cast<int>(flights_.size()) >= kMaxInFlight) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Launch with ", flights_.size(), " steps in flight (at most ", kMaxInFlight, ")"));
  }
  if (!flights_.empty() && backend_->profile() != nullptr) {
    return absl::FailedPreconditionError("op profiling (DSV4_PROFILE_OPS) runs one step at a time");
  }
  Flight f;
  f.step_id = plan.step_id;
  f.t0 = t0;
  if (plan.seqs.empty()) {
    last_slots_.clear();
    flights_.push_back(std::move(f));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<SequenceStep> steps, ModelSteps(plan));
  int64_t rows = 0, masked = 0, counted_tokens = 0, resets = 0;
  bool penalties = false;
  for (const ScheduledSeq& s : plan.seqs) {
    const bool counts = s.sampling != nullptr && UsesPenalties(*s.sampling);
    if (s.deferred_token) {
      // The token comes from the previous launched step's sampling, into this slot.
      auto it = last_slots_.find(s.request_id);
      if (it == last_slots_.end() || it->second != s.state_slot) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request ", s.request_id,
            ": a deferred token, but the previous launched step did not sample it in slot ",
            s.state_slot));
      }
    }
    if (counts) {
      penalties = true;
      counted_tokens += static_cast<int64_t>(s.tokens.size());
      resets += s.start_pos == 0 ? 1 : 0;
    }
    if (s.sample) {
      ++rows;
      masked += static_cast<int64_t>(s.sampling->min_tokens_mask.size());
    }
  }
  if (penalties) RETURN_IF_ERROR(EnsureCounts());

  // The graph to run: the plan's, unless this step cannot use it.
  GraphMode mode = plan.graph_mode;
  GraphRun& graph = f.graph;
  const int64_t T = plan.num_tokens(), S = static_cast<int64_t>(plan.seqs.size());
  const int32_t padded = plan.padded_tokens;
  const int32_t padded_seqs = std::min(padded, model_->cache().num_slots + 1);
  if (mode != GraphMode::kEager) {
    const bool fits = padded >= T && S + (T < padded ? 1 : 0) <= padded_seqs;
    const bool full_ok = mode != GraphMode::kFull || !full_[padded].failed;
    // Op profiling times eager launches only.
    if (options_.enforce_eager || !fits || !full_ok || backend_->profile() != nullptr) {
      mode = GraphMode::kEager;
      graph.fallback = true;
      ++stats_.fallbacks;
    }
  }
  graph.mode = mode;
  const bool full = mode == GraphMode::kFull;
  // FULL graphs sample one row per padded sequence (row i = sequence i); otherwise one row per
  // sampled sequence.
  const int64_t sample_rows = full ? padded_seqs : rows;

  // Host staging: sampling rows, mask ids, count updates; one transfer. Two sets, by the parity of
  // the launch: the step still in flight keeps its own (its results land in it).
  Packer pack;
  const size_t at_rows = pack.Add<cuda::SampleRow>(sample_rows);
  const size_t at_mask = pack.Add<int32_t>(masked);
  const size_t at_reset = pack.Add<int32_t>(resets);
  const size_t at_crow = pack.Add<int32_t>(counted_tokens);
  const size_t at_ctok = pack.Add<int32_t>(counted_tokens);
  const size_t at_cout = pack.Add<uint8_t>(counted_tokens);
  const size_t at_out = pack.Add<cuda::SampleOut>(sample_rows);
  Staging& st = staging_[launches_ % 2];
  if (st.host.bytes() < pack.size()) {
    const size_t cap = pack.size() * 2;
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(backend_->stream()));
    // Both buffers or neither: a failed allocation leaves the set as it was.
    ASSIGN_OR_RETURN(PinnedBuffer host, AllocPinned(cap));
    ASSIGN_OR_RETURN(DeviceBuffer dev, AllocDevice(cap));
    // The device's view of the pinned staging (the same address under unified addressing); a
    // platform without mapped pinned memory copies the results back with the copy engine.
    void* mapped = nullptr;
    if (cudaHostGetDevicePointer(&mapped, host.get(), 0) != cudaSuccess) {
      (void)cudaGetLastError();
      mapped = nullptr;
    }
    st.host = std::move(host);
    st.dev = std::move(dev);
    st.host_mapped = mapped;
  }
  char* h = static_cast<char*>(st.host.get());
  char* d = static_cast<char*>(st.dev.get());
  auto* sample_rows_h = reinterpret_cast<cuda::SampleRow*>(h + at_rows);
  auto* mask = reinterpret_cast<int32_t*>(h + at_mask);
  auto* reset = reinterpret_cast<int32_t*>(h + at_reset);
  auto* crow = reinterpret_cast<int32_t*>(h + at_crow);
  auto* ctok = reinterpret_cast<int32_t*>(h + at_ctok);
  auto* cout = reinterpret_cast<uint8_t*>(h + at_cout);
  if (full) std::fill(sample_rows_h, sample_rows_h + sample_rows, InertRow());
  std::map<uint64_t, int32_t> sampled_slots;
  int64_t r = 0, m = 0, nr = 0, nc = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const bool counts = s.sampling != nullptr && UsesPenalties(*s.sampling);
    if (counts) {
      if (s.start_pos == 0) reset[nr++] = s.state_slot;
      for (size_t k = 0; k < s.tokens.size(); ++k) {
        crow[nc] = s.state_slot;
        ctok[nc] = s.tokens[k];
        cout[nc] = s.start_pos + static_cast<int32_t>(k) >= s.prompt_len ? 1 : 0;
        ++nc;
      }
    }
    if (!s.sample) continue;
    const SamplingSpec& spec = *s.sampling;
    const int64_t out_row = full ? static_cast<int64_t>(i) : r++;
    cuda::SampleRow& row = sample_rows_h[out_row];
    row.temperature = spec.temperature;
    row.top_p = spec.top_p;
    row.min_p = spec.min_p;
    row.repetition_penalty = spec.repetition_penalty;
    row.presence_penalty = spec.presence_penalty;
    row.frequency_penalty = spec.frequency_penalty;
    row.top_k = spec.top_k;
    row.min_tokens = spec.min_tokens;
    row.output_index = s.output_index;
    row.logprobs = std::min(spec.logprobs, cuda::kMaxLogprobs);
    row.counts_row = counts ? s.state_slot : -1;
    row.mask_offset = static_cast<int32_t>(m);
    row.mask_count = static_cast<int32_t>(spec.min_tokens_mask.size());
    row.slot = s.state_slot;
    row.seed = spec.seed;
    for (int32_t id : spec.min_tokens_mask) mask[m++] = id;
    f.rows.push_back({s.request_id, out_row, row.logprobs});
    sampled_slots[s.request_id] = s.state_slot;
  }

  std::vector<int32_t> seq_rows;
  StepOptions options;
  options.force_indexer_scoring = plan.force_indexer_scoring;
  if (mode != GraphMode::kEager) {
    options.padded_tokens = padded;
    options.padded_seqs = padded_seqs;
    options.logits_per_seq = full;
  }
  f.t_prepare = std::chrono::steady_clock::now();
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.pre.get(), backend_->stream()));
  // The sampling rows and mask ids go up with the metadata, in one transfer.
  backend_->SetStepPayload(h + at_rows, at_reset - at_rows);
  RETURN_IF_ERROR(model_->PrepareStep(steps, options, &seq_rows));
  const char* payload = static_cast<const char*>(backend_->payload());
  const auto* dev_rows = reinterpret_cast<const cuda::SampleRow*>(payload);
  const auto* dev_mask = reinterpret_cast<const int32_t*>(payload + (at_mask - at_rows));
  f.t_prepared = std::chrono::steady_clock::now();
  cudaStream_t stream = backend_->stream();
  // The penalty count updates (nothing without penalties).
  if (at_out > at_reset) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + at_reset, h + at_reset, at_out - at_reset,
                                         cudaMemcpyHostToDevice, stream));
  }
  auto* seen = static_cast<int32_t*>(seen_.get());
  auto* outputs = static_cast<int32_t*>(outputs_.get());
  auto* slot_tokens = static_cast<int32_t*>(slot_tokens_.get());
  const int64_t vocab = model_->config().vocab_size;
  if (penalties) {
    RETURN_IF_ERROR(cuda::UpdateCounts(reinterpret_cast<const int32_t*>(d + at_reset), nr,
                                       reinterpret_cast<const int32_t*>(d + at_crow),
                                       reinterpret_cast<const int32_t*>(d + at_ctok),
                                       reinterpret_cast<const uint8_t*>(d + at_cout), nc, vocab,
                                       slot_tokens, seen, outputs, stream));
  }
  const void* outs_dev = d + at_out;
  bool copied = false;  // the results are in the host staging once the step's work is done
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.begin.get(), stream));
  if (full) {
    void* host_outs =
        st.host_mapped != nullptr ? static_cast<char*>(st.host_mapped) + at_out : nullptr;
    RETURN_IF_ERROR(
        RunFull(padded, sample_rows, dev_rows, dev_mask, host_outs, &graph, &outs_dev, &copied));
  } else {
    absl::StatusOr<Tensor> logits;
    if (mode == GraphMode::kPiecewise) {
      PiecewiseEntry& e = piecewise_[padded];
      std::vector<uintptr_t> baked = backend_->Baked(/*with_head=*/false);
      const bool capture = !e.graph.captured || e.baked != baked;
      if (capture && e.graph.captured) ++stats_.recaptures;
      const auto tc = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(backend_->BeginPiecewise(
          &e.graph, capture,
          options_.wide_eager_region ? EagerRegion::kWide : EagerRegion::kNarrow));
      logits = model_->RunForward();
      if (!logits.ok()) {
        backend_->AbortGraphs();
        return logits.status();
      }
      if (capture) {
        e.baked = std::move(baked);
        ++graph.captures;
        ++stats_.piecewise_captures;
        graph.capture_seconds += Since(tc);
      } else {
        ++stats_.piecewise_replays;
      }
      for (const CudaGraphExec& seg : e.graph.segments) graph.replays += seg.empty() ? 0 : 1;
    } else {
      logits = model_->RunForward();
    }
    RETURN_IF_ERROR(logits.status());
    if (rows > 0) {
      if (OpProfile* prof = backend_->profile()) prof->Begin("Sample", stream);
      ASSIGN_OR_RETURN(Tensor work, backend_->Scratch(DType::kF32, Shape{rows, vocab}));
      RETURN_IF_ERROR(cuda::Sample(logits->ptr<float>(), rows, vocab, dev_rows, dev_mask, seen,
                                   outputs, work.ptr<float>(),
                                   reinterpret_cast<cuda::SampleOut*>(d + at_out), slot_tokens,
                                   stream));
      if (OpProfile* prof = backend_->profile()) prof->End(stream);
    }
  }
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.end.get(), stream));
  if (sample_rows > 0 && !copied) {
    const size_t bytes = sizeof(cuda::SampleOut) * sample_rows;
    if (st.host_mapped != nullptr) {
      // A kernel writes the results straight into the pinned staging (zero-copy): 6-8 us less
      // per step than a copy-engine transfer between the graph and the next step's work.
      RETURN_IF_ERROR(
          cuda::CopyWords(outs_dev, static_cast<char*>(st.host_mapped) + at_out, bytes, stream));
    } else {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(h + at_out, outs_dev, bytes, cudaMemcpyDeviceToHost, stream));
    }
  }
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.post.get(), stream));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(st.done.get(), stream));
  backend_->ProfileRelease();
  f.outs = reinterpret_cast<const cuda::SampleOut*>(h + at_out);
  f.staging = &st;
  f.t_launched = std::chrono::steady_clock::now();
  f.launch_seconds = Since(t0);
  ++launches_;
  last_slots_ = std::move(sampled_slots);
  flights_.push_back(std::move(f));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> CudaWorker::Collect() {
  if (flights_.empty()) return absl::FailedPreconditionError("Collect with no launched step");
  const auto t_wait = std::chrono::steady_clock::now();
  Flight f = std::move(flights_.front());
  flights_.pop_front();
  StepResult result;
  result.step_id = f.step_id;
  result.graph = f.graph;
  if (f.staging == nullptr) return result;  // an empty plan
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(f.staging->done.get()));
  const auto t_synced = std::chrono::steady_clock::now();
  // DSV4_STEP_DEVICE_TIME=1: the device's time for the metadata upload (up to the forward) and
  // for the results' copy back, for the phase medians.
  double upload_seconds = 0, return_seconds = 0;
  if (time_steps_) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, f.staging->begin.get(), f.staging->end.get()));
    result.device_seconds = ms * 1e-3;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, f.staging->pre.get(), f.staging->begin.get()));
    upload_seconds = ms * 1e-3;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, f.staging->end.get(), f.staging->post.get()));
    return_seconds = ms * 1e-3;
  }
  RETURN_IF_ERROR(backend_->ProfileCollect());
  for (const Flight::Row& row : f.rows) {
    const cuda::SampleOut& o = f.outs[row.out_row];
    SampledToken t;
    t.request_id = row.request_id;
    t.token = o.token;
    t.nonfinite = o.nonfinite != 0;
    if (row.logprobs > 0) {
      t.logprob = o.logprob;
      for (int k = 0; k < row.logprobs; ++k) t.top.emplace_back(o.top_ids[k], o.top_logprobs[k]);
    }
    result.sampled.push_back(std::move(t));
  }
  // The worker's own time for the step: its Launch call and this one.
  result.execute_seconds = f.launch_seconds + Since(t_wait);
  // (The first 64k steps: a long-running server with the switch on keeps a bounded record.)
  if (time_steps_ && phases_.size() < (size_t{1} << 16)) {
    auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    phases_.push_back({secs(f.t0, f.t_prepare), secs(f.t_prepare, f.t_prepared),
                       secs(f.t_prepared, f.t_launched), secs(t_wait, t_synced), Since(t_synced),
                       result.device_seconds, upload_seconds, return_seconds});
  }
  return result;
}

}  // namespace dsv4
