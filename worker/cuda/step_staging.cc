#include "worker/cuda/step_staging.h"

#include <algorithm>
#include <cstddef>

#include "common/status.h"

namespace dsv4 {
namespace {

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

absl::Status StepStaging::Init(bool time_steps) {
  for (Staging& st : sets_) {
    ASSIGN_OR_RETURN(st.done, CudaEvent::Create(cudaEventDisableTiming));
    if (time_steps) {
      ASSIGN_OR_RETURN(st.begin, CudaEvent::Create());
      ASSIGN_OR_RETURN(st.end, CudaEvent::Create());
      ASSIGN_OR_RETURN(st.pre, CudaEvent::Create());
      ASSIGN_OR_RETURN(st.post, CudaEvent::Create());
    }
  }
  return absl::OkStatus();
}

void StepStaging::Release() {
  for (Staging& st : sets_) st = Staging{};
}

StepCounts StepStaging::Count(const StepPlan& plan) {
  StepCounts c;
  for (const ScheduledSeq& s : plan.seqs) {
    if (s.sampling != nullptr && UsesPenalties(*s.sampling)) {
      c.penalties = true;
      c.counted_tokens += static_cast<int64_t>(s.tokens.size());
      c.resets += s.start_pos == 0 || s.restore_from >= 0 ? 1 : 0;
    }
    if (s.sample) {
      ++c.rows;
      c.masked += static_cast<int64_t>(s.sampling->min_tokens_mask.size());
    }
  }
  return c;
}

absl::StatusOr<StagedStep> StepStaging::Stage(const StepPlan& plan, const StepCounts& c,
                                              bool full, int64_t sample_rows, uint64_t parity,
                                              cudaStream_t stream) {
  StagedStep out;
  Packer pack;
  out.at_rows = pack.Add<cuda::SampleRow>(sample_rows);
  out.at_mask = pack.Add<int32_t>(c.masked);
  out.at_reset = pack.Add<int32_t>(c.resets);
  out.at_crow = pack.Add<int32_t>(c.counted_tokens);
  out.at_ctok = pack.Add<int32_t>(c.counted_tokens);
  out.at_cout = pack.Add<uint8_t>(c.counted_tokens);
  out.at_out = pack.Add<cuda::SampleOut>(sample_rows);
  out.sample_rows = sample_rows;
  Staging& st = sets_[parity % 2];
  if (st.host.bytes() < pack.size()) {
    const size_t cap = pack.size() * 2;
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
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
  out.set = &st;
  char* h = out.host = static_cast<char*>(st.host.get());
  out.dev = static_cast<char*>(st.dev.get());
  auto* rows_h = reinterpret_cast<cuda::SampleRow*>(h + out.at_rows);
  auto* mask = reinterpret_cast<int32_t*>(h + out.at_mask);
  auto* reset = reinterpret_cast<int32_t*>(h + out.at_reset);
  auto* crow = reinterpret_cast<int32_t*>(h + out.at_crow);
  auto* ctok = reinterpret_cast<int32_t*>(h + out.at_ctok);
  auto* cout = reinterpret_cast<uint8_t*>(h + out.at_cout);
  if (full) std::fill(rows_h, rows_h + sample_rows, InertRow());
  int64_t r = 0, m = 0, nr = 0, nc = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const bool counts = s.sampling != nullptr && UsesPenalties(*s.sampling);
    if (counts) {
      if (s.start_pos == 0 || s.restore_from >= 0) reset[nr++] = s.state_slot;
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
    cuda::SampleRow& row = rows_h[out_row];
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
    out.sampled.push_back({s.request_id, out_row, row.logprobs});
    out.sampled_slots[s.request_id] = s.state_slot;
  }
  out.resets = nr;
  out.counts = nc;
  return out;
}

}  // namespace dsv4
