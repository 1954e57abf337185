#include "worker/cpu_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/penalties_ref.h"
#include "kernels/cpu_gemm.h"
#include "kernels/sampling_ref.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/cuda_plugin.h"
#include "worker/worker_factory.h"
#include "worker/model_steps.h"

namespace dsv4 {

SampledToken SampleToken(std::span<float> logits, const SamplingSpec& spec, int32_t output_index,
                         const std::unordered_map<int32_t, int32_t>& seen,
                         const std::unordered_map<int32_t, int32_t>& outputs) {
  SampledToken out;
  // NaN or Inf from the model (broken weights, an overflow): no token can be drawn.
  for (float v : logits) {
    if (!std::isfinite(v)) {
      out.nonfinite = true;
      out.token = -1;
      return out;
    }
  }
  // Log-probabilities are those of the raw model distribution.
  std::vector<float> raw;
  if (spec.logprobs > 0) raw.assign(logits.begin(), logits.end());
  ApplyPenaltiesRef(logits, seen, outputs, spec.repetition_penalty, spec.presence_penalty,
                    spec.frequency_penalty);
  if (output_index < spec.min_tokens) {
    for (int32_t id : spec.min_tokens_mask) {
      if (id >= 0 && id < static_cast<int32_t>(logits.size())) {
        logits[id] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  SamplingParams p;
  p.temperature = spec.temperature;
  p.top_k = spec.top_k;
  p.top_p = spec.top_p;
  p.min_p = spec.min_p;
  p.seed = spec.seed;
  out.token = SampleRef(logits, p, static_cast<uint64_t>(output_index));
  if (spec.logprobs > 0) {
    out.logprob = LogprobRef(raw, out.token);
    out.top = TopLogprobsRef(raw, spec.logprobs);
  }
  return out;
}

CpuWorker::CpuWorker() {
  info_.device = "cpu";
  info_.precision = "fp32";
}

CpuWorker::CpuWorker(std::unique_ptr<Dsv4Model> model, std::string device)
    : life_(Lifecycle::kReady), model_(std::move(model)) {
  info_.device = std::move(device);
  info_.precision = "fp32";
  DescribeModel();
}

void CpuWorker::DescribeModel() {
  info_.num_blocks = model_->cache().num_blocks;
  info_.num_slots = model_->cache().num_slots;
  info_.num_state_snapshots = model_->cache().num_state_snapshots;
  info_.block_size = model_->cache().block_size;
  info_.max_model_len = model_->cache().max_model_len;
}

absl::Status CpuWorker::Configure(const WorkerConfig& config) {
  RETURN_IF_ERROR(life_.Check("Configure", Lifecycle::kCreated));
  // The precision is the GPU's; the CPU computes in fp32, but a wrong value is still wrong.
  RETURN_IF_ERROR(ParsePrecision(config.precision).status());
  WeightsSpec weights;
  RETURN_IF_ERROR(ParseWeightFormat(config.weight_format, &weights));
  RETURN_IF_ERROR(CheckBatchInvariant(config));
  if (!config.synthetic && config.model_dir.empty()) {
    return absl::InvalidArgumentError("WorkerConfig.model_dir: no checkpoint and not synthetic");
  }
  if (config.parallel.distributed() && config.communicator == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WorkerConfig.communicator: tensor_parallel_size ", config.parallel.world_size,
        " needs the group's communicator"));
  }
  RETURN_IF_ERROR(CheckTensorParallel(config.model, config.parallel.world_size));
  load_.keep_formats = weights.keep_formats;
  load_.synthetic_released_formats = weights.keep_formats;
  load_.parallel = config.parallel;
  config_ = config;
  life_.Enter(Lifecycle::kConfigured);
  return absl::OkStatus();
}

absl::Status CpuWorker::Load(const LoadProgressFn& progress) {
  RETURN_IF_ERROR(life_.Check("Load", Lifecycle::kConfigured));
  SetBlasThreads(config_.threads);
  LoadOptions load = load_;
  if (progress) {
    load.on_layer = [&progress](int64_t done, int64_t total) {
      progress(LoadProgress{"weights", done, total});
    };
  }
  auto backend = std::make_unique<CpuBackend>(config_.communicator);
  if (config_.synthetic) {
    ASSIGN_OR_RETURN(model_, Dsv4Model::LoadSynthetic(config_.model, config_.synthetic_seed,
                                                      std::move(backend), config_.cache, load));
  } else {
    ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(config_.model_dir));
    ASSIGN_OR_RETURN(model_,
                     Dsv4Model::Load(config_.model, *ckpt, std::move(backend), config_.cache, load));
  }
  if (progress) progress(LoadProgress{"pools", 1, 1});
  DescribeModel();
  life_.Enter(Lifecycle::kLoaded);
  return absl::OkStatus();
}

absl::Status CpuWorker::WarmUp() {
  RETURN_IF_ERROR(life_.Check("WarmUp", Lifecycle::kLoaded));
  life_.Enter(Lifecycle::kReady);
  return absl::OkStatus();
}

void CpuWorker::Shutdown() {
  model_.reset();
  history_.clear();
  life_.Enter(Lifecycle::kShutDown);
}

absl::StatusOr<StepResult> CpuWorker::Execute(const StepPlan& plan) {
  RETURN_IF_ERROR(life_.Check("Execute", Lifecycle::kReady));
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t id : plan.released) history_.erase(id);
  StepResult result;
  result.step_id = plan.step_id;
  if (plan.seqs.empty()) return result;
  ASSIGN_OR_RETURN(std::vector<SequenceStep> steps, ModelSteps(plan));
  StepOptions options;
  options.force_indexer_scoring = plan.force_indexer_scoring;
  StepLogits logits;
  RETURN_IF_ERROR(model_->Step(steps, options, &logits));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    History& h = history_[s.request_id];
    if (s.start_pos == 0 || s.restore_from >= 0) h = History{};
    for (size_t k = 0; k < s.tokens.size(); ++k) {
      ++h.seen[s.tokens[k]];
      if (s.start_pos + static_cast<int32_t>(k) >= s.prompt_len) ++h.outputs[s.tokens[k]];
    }
    if (!s.sample) continue;
    const int32_t row = logits.seq_row_begin[i];
    std::span<float> l(logits.values.data() + static_cast<int64_t>(row) * logits.vocab,
                       static_cast<size_t>(logits.vocab));
    SampledToken t = SampleToken(l, *s.sampling, s.output_index, h.seen, h.outputs);
    t.request_id = s.request_id;
    result.sampled.push_back(std::move(t));
  }
  result.execute_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (auto* cpu = dynamic_cast<CpuBackend*>(&model_->backend())) {
    result.collective_seconds = cpu->TakeCollectiveSeconds();
  }
  return result;
}

}  // namespace dsv4
