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
#include "parallel/communicator.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model_steps.h"
#include "worker/worker_factory.h"

namespace dsv4 {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CudaWorker::CudaWorker(int device) : device_(device) {}

CudaWorker::~CudaWorker() { Shutdown(); }

absl::Status CudaWorker::Configure(const WorkerConfig& config) {
  RETURN_IF_ERROR(life_.Check("Configure", Lifecycle::kCreated));
  ASSIGN_OR_RETURN(precision_, ParsePrecision(config.precision));
  WeightsSpec weights;
  RETURN_IF_ERROR(ParseWeightFormat(config.weight_format, &weights));
  RETURN_IF_ERROR(CheckBatchInvariant(config));
  if (!config.synthetic && config.model_dir.empty()) {
    return absl::InvalidArgumentError("WorkerConfig.model_dir: no checkpoint and not synthetic");
  }
  if (config.parallel.distributed() || config.parallel.always_reduce) {
    if (config.communicator == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WorkerConfig.communicator: tensor_parallel_size ", config.parallel.world_size,
          " needs the group's communicator"));
    }
    RETURN_IF_ERROR(CheckTensorParallel(config.model, config.parallel.world_size));
  }
  load_.keep_formats = weights.keep_formats;
  load_.synthetic_released_formats = weights.keep_formats;
  load_.parallel = config.parallel;
  CudaGraphOptions graphs = config.graphs;
  // Host-staged (Gloo) collectives cannot be captured: a GPU rank on a host communicator runs
  // every step eagerly; on NCCL its collectives are captured with the rest.
  if (config.communicator != nullptr && config.communicator->memory_space() == MemorySpace::kHost) {
    graphs.enforce_eager = true;
  }
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
  options.fp8_activations = precision_ == Precision::kFP8;
  options.batch_invariant = config_.batch_invariant;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  CudaBackend* be = backend.get();
  if (config_.communicator != nullptr) RETURN_IF_ERROR(be->AttachCommunicator(config_.communicator));
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
  info_.num_state_snapshots = model_->cache().num_state_snapshots;
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
  graphs_ = GraphRunner(backend_);
  RETURN_IF_ERROR(staging_.Init(time_steps_));
  return sampler_.Init(backend_, model_->cache().num_slots, model_->config().vocab_size);
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
  graphs_.Clear();
  staging_.Release();
  sampler_.Release();
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

void CudaWorker::ClearGraphs() { graphs_.Clear(); }

absl::Status CudaWorker::CheckDeferred(const StepPlan& plan) const {
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.deferred_token) continue;
    // The token comes from the previous launched step's sampling, into this slot.
    auto it = last_slots_.find(s.request_id);
    if (it == last_slots_.end() || it->second != s.state_slot) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", s.request_id,
          ": a deferred token, but the previous launched step did not sample it in slot ",
          s.state_slot));
    }
  }
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

// One step, through the rooms: the staging of its metadata (StepStaging), the model's metadata
// upload (PrepareStep), the count updates and the sampling (DeviceSampler), the forward as a graph
// or eagerly (GraphRunner, RunForwardAndSample), the results' copy back.
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
  RETURN_IF_ERROR(CheckDeferred(plan));
  const StepCounts counts = StepStaging::Count(plan);
  if (counts.penalties) RETURN_IF_ERROR(sampler_.EnsureCounts());

  // The graph to run: the plan's, unless this step cannot use it. FULL graphs sample one row per
  // padded sequence (row i = sequence i); otherwise one row per sampled sequence.
  const int32_t padded = plan.padded_tokens;
  const int32_t padded_seqs = std::min(padded, model_->cache().num_slots + 1);
  const GraphMode mode = graphs_.Choose(plan, padded_seqs, options_.enforce_eager, &f.graph);
  const bool full = mode == GraphMode::kFull;
  ASSIGN_OR_RETURN(StagedStep staged,
                   staging_.Stage(plan, counts, full, full ? padded_seqs : counts.rows,
                                  launches_, backend_->stream()));
  Staging& st = *staged.set;

  std::vector<int32_t> seq_rows;
  StepOptions options;
  options.force_indexer_scoring = plan.force_indexer_scoring;
  if (mode != GraphMode::kEager) {
    options.padded_tokens = padded;
    options.padded_seqs = padded_seqs;
    options.logits_per_seq = full;
  }
  f.t_prepare = std::chrono::steady_clock::now();
  cudaStream_t stream = backend_->stream();
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.pre.get(), stream));
  // The sampling rows and mask ids go up with the metadata, in one transfer.
  backend_->SetStepPayload(staged.payload(), staged.payload_bytes());
  RETURN_IF_ERROR(model_->PrepareStep(steps, options, &seq_rows));
  const char* payload = static_cast<const char*>(backend_->payload());
  const auto* dev_rows = reinterpret_cast<const cuda::SampleRow*>(payload);
  const auto* dev_mask =
      reinterpret_cast<const int32_t*>(payload + (staged.at_mask - staged.at_rows));
  f.t_prepared = std::chrono::steady_clock::now();
  // The penalty count updates (nothing without penalties).
  char* d = staged.dev;
  if (staged.counts_bytes() > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + staged.at_reset, staged.host + staged.at_reset,
                                         staged.counts_bytes(), cudaMemcpyHostToDevice, stream));
  }
  if (counts.penalties) {
    RETURN_IF_ERROR(sampler_.UpdateCounts(reinterpret_cast<const int32_t*>(d + staged.at_reset),
                                          staged.resets,
                                          reinterpret_cast<const int32_t*>(d + staged.at_crow),
                                          reinterpret_cast<const int32_t*>(d + staged.at_ctok),
                                          reinterpret_cast<const uint8_t*>(d + staged.at_cout),
                                          staged.counts));
  }
  RETURN_IF_ERROR(RunForwardAndSample(mode, padded, counts.rows, staged, dev_rows, dev_mask,
                                      &f.graph));
  // Prefix-cache snapshots at the chunks' ends: row copies after the forward, outside any graph.
  RETURN_IF_ERROR(model_->FinishStep());
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.post.get(), stream));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(st.done.get(), stream));
  backend_->ProfileRelease();
  f.rows = std::move(staged.sampled);
  f.outs = reinterpret_cast<const cuda::SampleOut*>(staged.host_outs());
  f.staging = &st;
  f.t_launched = std::chrono::steady_clock::now();
  f.launch_seconds = Since(t0);
  ++launches_;
  last_slots_ = std::move(staged.sampled_slots);
  flights_.push_back(std::move(f));
  return absl::OkStatus();
}

// The staged step's forward and sampling in `mode`, and its results' copy to the host staging.
absl::Status CudaWorker::RunForwardAndSample(GraphMode mode, int32_t padded, int64_t rows,
                                             const StagedStep& staged,
                                             const cuda::SampleRow* dev_rows,
                                             const int32_t* dev_mask, GraphRun* run) {
  cudaStream_t stream = backend_->stream();
  Staging& st = *staged.set;
  const void* outs_dev = staged.dev + staged.at_out;
  bool copied = false;  // the results are in the host staging once the step's work is done
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.begin.get(), stream));
  if (mode == GraphMode::kFull) {
    void* host_outs = staged.mapped_outs();
    const int64_t sample_rows = staged.sample_rows;
    // The forward, the sampling and the results' copy, as issued eagerly or into a capture.
    auto issue = [&](cuda::SampleOut* outs) -> absl::Status {
      ASSIGN_OR_RETURN(Tensor logits, model_->RunForward());
      RETURN_IF_ERROR(sampler_.Sample(logits.ptr<float>(), sample_rows, dev_rows, dev_mask, outs));
      if (host_outs == nullptr) return absl::OkStatus();
      return sampler_.CopyOut(outs, sample_rows, host_outs, nullptr);
    };
    std::vector<uintptr_t> baked = {
        reinterpret_cast<uintptr_t>(dev_rows), reinterpret_cast<uintptr_t>(dev_mask),
        reinterpret_cast<uintptr_t>(sampler_.seen()),
        reinterpret_cast<uintptr_t>(sampler_.outputs())};
    RETURN_IF_ERROR(graphs_.RunFull(padded, sample_rows, std::move(baked), host_outs, issue, run,
                                    &outs_dev, &copied));
  } else {
    auto forward = [&]() { return model_->RunForward(); };
    absl::StatusOr<Tensor> logits =
        mode == GraphMode::kPiecewise
            ? graphs_.RunPiecewise(
                  padded, options_.wide_eager_region ? EagerRegion::kWide : EagerRegion::kNarrow,
                  forward, run)
            : forward();
    RETURN_IF_ERROR(logits.status());
    if (rows > 0) {
      if (OpProfile* prof = backend_->profile()) prof->Begin("Sample", stream);
      RETURN_IF_ERROR(sampler_.Sample(logits->ptr<float>(), rows, dev_rows, dev_mask,
                                      reinterpret_cast<cuda::SampleOut*>(staged.dev + staged.at_out)));
      if (OpProfile* prof = backend_->profile()) prof->End(stream);
    }
  }
  if (time_steps_) CUDA_RETURN_IF_ERROR(cudaEventRecord(st.end.get(), stream));
  if (staged.sample_rows > 0 && !copied) {
    RETURN_IF_ERROR(
        sampler_.CopyOut(outs_dev, staged.sample_rows, staged.mapped_outs(), staged.host_outs()));
  }
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
  for (const SampledRow& row : f.rows) {
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
  result.collective_seconds = backend_->TakeCollectiveSeconds();
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
