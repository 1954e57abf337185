// StepStaging: the host side of one GPU step's metadata, one room of the GPU worker's step.
// Lays out and fills, per step, the sampling rows, the min-tokens mask ids and the penalty count
// updates in pinned host memory, with a device buffer of the same layout: the rows and mask ids
// travel with the model's metadata in one transfer (CudaBackend::SetStepPayload), the count
// updates in a second, and the step's results land back in the same set. Two sets, used by
// launches of alternating parity: the step in flight keeps its own while the next is staged.
// Not thread-safe: one engine thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/step_plan.h"
#include "kernels/cuda/sampling.h"
#include "worker/cuda/device_memory.h"

namespace dsv4 {

// One staging set.
struct Staging {
  PinnedBuffer host;
  DeviceBuffer dev;
  void* host_mapped = nullptr;  // the device's address of `host` (null: not mapped)
  CudaEvent done;               // after the results' copy back
  // DSV4_STEP_DEVICE_TIME=1: around the forward and sampling (begin, end), and around the whole
  // step's stream work (pre: before the metadata upload; post: after the results' copy back).
  CudaEvent begin, end, pre, post;
};

// What sizes a plan's staging.
struct StepCounts {
  int64_t rows = 0;            // sampled sequences
  int64_t masked = 0;          // min-tokens mask ids over them
  int64_t counted_tokens = 0;  // tokens of sequences that use penalties
  int64_t resets = 0;          // of those, sequences starting at position 0
  bool penalties = false;
};

// A sampled entry of the plan: where its result lands.
struct SampledRow {
  uint64_t request_id = 0;
  int64_t out_row = 0;
  int32_t logprobs = 0;
};

// A staged step: the set it uses, its layout (byte offsets, the same on host and device) and
// what it sampled.
struct StagedStep {
  Staging* set = nullptr;
  char* host = nullptr;
  char* dev = nullptr;
  size_t at_rows = 0, at_mask = 0, at_reset = 0, at_crow = 0, at_ctok = 0, at_cout = 0,
         at_out = 0;
  int64_t sample_rows = 0;  // result rows (FULL: one per padded sequence)
  int64_t resets = 0, counts = 0;
  std::vector<SampledRow> sampled;              // the plan's sampled entries, in order
  std::map<uint64_t, int32_t> sampled_slots;    // request -> state slot

  // The bytes that travel with the model's metadata: sampling rows and mask ids.
  const char* payload() const { return host + at_rows; }
  size_t payload_bytes() const { return at_reset - at_rows; }
  // The penalty count updates, uploaded on their own (empty without penalties).
  size_t counts_bytes() const { return at_out - at_reset; }
  // Where the results land: in the host buffer, and the device's view of it (null: not mapped).
  char* host_outs() const { return host + at_out; }
  void* mapped_outs() const {
    return set->host_mapped != nullptr ? static_cast<char*>(set->host_mapped) + at_out : nullptr;
  }
};

class StepStaging {
 public:
  // The sets' events (timing ones when `time_steps`).
  absl::Status Init(bool time_steps);
  static StepCounts Count(const StepPlan& plan);
  // Fills the set of `parity` for `plan` (its counts `c`): with `full`, one inert row per padded
  // sequence (`sample_rows` of them) and row i for sequence i, else one row per sampled sequence.
  // Grows the set when it is too small, after waiting for `stream` (the set may be in use).
  absl::StatusOr<StagedStep> Stage(const StepPlan& plan, const StepCounts& c, bool full,
                                   int64_t sample_rows, uint64_t parity, cudaStream_t stream);
  void Release();

 private:
  std::array<Staging, 2> sets_;
};

}  // namespace dsv4
