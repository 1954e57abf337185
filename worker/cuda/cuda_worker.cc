#include "worker/cuda/cuda_worker.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/sampling.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<CudaWorker>> CudaWorker::Create(std::unique_ptr<Dsv4Model> model) {
  auto* backend = dynamic_cast<CudaBackend*>(&model->backend());
  if (backend == nullptr) return absl::InvalidArgumentError("CudaWorker needs a CudaBackend model");
  std::unique_ptr<CudaWorker> w(new CudaWorker());
  w->backend_ = backend;
  w->model_ = std::move(model);
  return w;
}

WorkerInfo CudaWorker::info() const {
  WorkerInfo w;
  w.device = absl::StrCat("cuda:", backend_->device());
  w.num_blocks = model_->cache().num_blocks;
  w.num_slots = model_->cache().num_slots;
  w.block_size = model_->cache().block_size;
  w.max_model_len = model_->cache().max_model_len;
  return w;
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

absl::StatusOr<StepResult> CudaWorker::Execute(const StepPlan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  StepResult result;
  result.step_id = plan.step_id;
  if (plan.seqs.empty()) return result;
  ASSIGN_OR_RETURN(std::vector<SequenceStep> steps, ModelSteps(plan));
  int64_t rows = 0, masked = 0, counted_tokens = 0, resets = 0;
  bool penalties = false;
  for (const ScheduledSeq& s : plan.seqs) {
    if (s.sampling != nullptr && UsesPenalties(*s.sampling)) {
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

  // Host staging: sampling rows, mask ids, count updates; one transfer.
  Packer pack;
  const size_t at_rows = pack.Add<cuda::SampleRow>(rows);
  const size_t at_mask = pack.Add<int32_t>(masked);
  const size_t at_reset = pack.Add<int32_t>(resets);
  const size_t at_crow = pack.Add<int32_t>(counted_tokens);
  const size_t at_ctok = pack.Add<int32_t>(counted_tokens);
  const size_t at_cout = pack.Add<uint8_t>(counted_tokens);
  const size_t at_out = pack.Add<cuda::SampleOut>(rows);
  if (staging_.bytes() < pack.size()) {
    const size_t cap = pack.size() * 2;
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(backend_->stream()));
    ASSIGN_OR_RETURN(staging_, AllocPinned(cap));
    ASSIGN_OR_RETURN(staging_dev_, AllocDevice(cap));
  }
  char* h = static_cast<char*>(staging_.get());
  char* d = static_cast<char*>(staging_dev_.get());
  auto* sample_rows = reinterpret_cast<cuda::SampleRow*>(h + at_rows);
  auto* mask = reinterpret_cast<int32_t*>(h + at_mask);
  auto* reset = reinterpret_cast<int32_t*>(h + at_reset);
  auto* crow = reinterpret_cast<int32_t*>(h + at_crow);
  auto* ctok = reinterpret_cast<int32_t*>(h + at_ctok);
  auto* cout = reinterpret_cast<uint8_t*>(h + at_cout);
  int64_t r = 0, m = 0, nr = 0, nc = 0;
  for (const ScheduledSeq& s : plan.seqs) {
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
    cuda::SampleRow& row = sample_rows[r++];
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
    row.seed = spec.seed;
    for (int32_t id : spec.min_tokens_mask) mask[m++] = id;
  }

  std::vector<int32_t> seq_rows;
  StepOptions options;
  options.force_indexer_scoring = plan.force_indexer_scoring;
  ASSIGN_OR_RETURN(Tensor logits, model_->StepToBackend(steps, options, &seq_rows));
  cudaStream_t stream = backend_->stream();
  const size_t upload = at_out;  // everything before the outputs
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, upload, cudaMemcpyHostToDevice, stream));
  auto* seen = static_cast<int32_t*>(seen_.get());
  auto* outputs = static_cast<int32_t*>(outputs_.get());
  const int64_t vocab = model_->config().vocab_size;
  if (penalties) {
    RETURN_IF_ERROR(cuda::UpdateCounts(reinterpret_cast<const int32_t*>(d + at_reset), nr,
                                       reinterpret_cast<const int32_t*>(d + at_crow),
                                       reinterpret_cast<const int32_t*>(d + at_ctok),
                                       reinterpret_cast<const uint8_t*>(d + at_cout), nc, vocab,
                                       seen, outputs, stream));
  }
  if (rows > 0) {
    ASSIGN_OR_RETURN(Tensor work, backend_->Scratch(DType::kF32, Shape{rows, vocab}));
    RETURN_IF_ERROR(cuda::Sample(logits.ptr<float>(), rows, vocab,
                                 reinterpret_cast<const cuda::SampleRow*>(d + at_rows),
                                 reinterpret_cast<const int32_t*>(d + at_mask), seen, outputs,
                                 work.ptr<float>(), reinterpret_cast<cuda::SampleOut*>(d + at_out),
                                 stream));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + at_out, d + at_out, sizeof(cuda::SampleOut) * rows,
                                         cudaMemcpyDeviceToHost, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const auto* outs = reinterpret_cast<const cuda::SampleOut*>(h + at_out);
  r = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.sample) continue;
    const cuda::SampleOut& o = outs[r++];
    SampledToken t;
    t.request_id = s.request_id;
    t.token = o.token;
    if (s.sampling->logprobs > 0) {
      t.logprob = o.logprob;
      for (int k = 0; k < std::min(s.sampling->logprobs, cuda::kMaxLogprobs); ++k) {
        t.top.emplace_back(o.top_ids[k], o.top_logprobs[k]);
      }
    }
    result.sampled.push_back(std::move(t));
  }
  result.execute_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace dsv4
