// StepPlan / StepResult: what the coordinator sends to every worker rank each step, and what
// rank 0 returns. Plain structs shared by the in-process workers and, later, the control-plane
// proto mapping. The coordinator makes every host-side decision (batch, chunking, graph choice);
// workers execute the plan verbatim, so all ranks stay identical.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsv4 {

// Per-request sampling parameters (validated by the coordinator).
struct SamplingSpec {
  float temperature = 0;          // 0 = greedy
  int32_t top_k = 0;              // 0 = off
  float top_p = 1;                // (0, 1]
  float min_p = 0;                // [0, 1]
  uint64_t seed = 0;              // random stream of the request: draws depend on (seed, index)
  float repetition_penalty = 1;   // > 0; 1 = off (prompt + output tokens)
  float presence_penalty = 0;     // output tokens
  float frequency_penalty = 0;    // output tokens
  int32_t min_tokens = 0;         // mask `min_tokens_mask` until this many outputs exist
  std::vector<int32_t> min_tokens_mask;  // end-of-sequence and stop token ids
  int32_t logprobs = 0;           // top-n alternatives to return (0 = none)
};

// Whether a request's sampling needs the counts of its tokens (prompt and output): the worker keeps
// them per slot, and the prefix cache cannot serve such a request from another's state.
inline bool UsesPenalties(const SamplingSpec& s) {
  return s.repetition_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f;
}

// Prefix caching: the sequence's state (sliding-window ring, compressor state) after `position`
// tokens is copied into state row `row` (a snapshot row, past the state slots) during the step.
struct StateSnapshotAt {
  int32_t position = 0;  // a block boundary with start_pos < position <= start_pos + tokens
  int32_t row = 0;
};

struct ScheduledSeq {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;     // this step's tokens: a prefill chunk or one decode token
  int32_t start_pos = 0;           // tokens already in the cache; 0 = a fresh sequence
  int32_t state_slot = 0;
  std::vector<int32_t> block_table;
  bool sample = false;             // the chunk reaches the end of the known tokens: sample one
  int32_t prompt_len = 0;          // positions >= prompt_len hold generated tokens
  int32_t output_index = 0;        // index of the token to sample among the outputs
  std::shared_ptr<const SamplingSpec> sampling;
  // Overlapped decode (Worker::Launch): `tokens` is one placeholder (kDeferredToken) standing for
  // the token that the previously launched step samples for this request, which the worker feeds
  // without the coordinator having seen it.
  bool deferred_token = false;
  // Prefix caching (node/scheduler/prefix_cache.h): a hit's first chunk starts from the state
  // saved in snapshot row `restore_from` (copied into state_slot before the step); -1 = none.
  int32_t restore_from = -1;
  // Block boundaries this chunk reaches whose state is kept for later hits.
  std::vector<StateSnapshotAt> snapshots;
};

constexpr int32_t kDeferredToken = -1;

enum class GraphMode { kEager, kPiecewise, kFull };
inline const char* GraphModeName(GraphMode m) {
  return m == GraphMode::kFull ? "full" : m == GraphMode::kPiecewise ? "piecewise" : "eager";
}

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<ScheduledSeq> seqs;
  std::vector<uint64_t> released;  // requests whose worker-side state can be dropped
  // Chosen by the coordinator (node/scheduler/graph_policy.h): FULL for uniform decode batches,
  // PIECEWISE for mixed and prefill batches, both padded to a capture size; padded rows are inert.
  GraphMode graph_mode = GraphMode::kEager;
  int32_t padded_tokens = 0;       // graph capture size >= num_tokens() (0 = unpadded, eager)
  bool force_indexer_scoring = false;

  int64_t num_tokens() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += static_cast<int64_t>(s.tokens.size());
    return n;
  }
};

// A snapshot before the end of its chunk is taken by the forward's own ops (RingSnapshot,
// CompressSnapshot), which graphs do not capture: such a step runs eagerly. One at the chunk's end
// is a row copy after the forward, which any step may have.
inline bool HasInStepSnapshots(const StepPlan& plan) {
  for (const ScheduledSeq& s : plan.seqs) {
    const int32_t end = s.start_pos + static_cast<int32_t>(s.tokens.size());
    for (const StateSnapshotAt& at : s.snapshots) {
      if (at.position < end) return true;
    }
  }
  return false;
}

struct SampledToken {
  uint64_t request_id = 0;
  int32_t token = 0;
  float logprob = 0;                              // when sampling->logprobs > 0
  std::vector<std::pair<int32_t, float>> top;     // top-n (token, logprob), most likely first
  // The logits row held NaN or Inf: `token` is meaningless and the coordinator fails the request.
  bool nonfinite = false;
};

// How the worker actually ran a step (it may fall back to eager when it cannot run the planned
// graph: a capture failed, the kill switch is on, or the batch does not fit the graph's buffers).
struct GraphRun {
  GraphMode mode = GraphMode::kEager;  // what ran
  bool fallback = false;               // a graph was planned but the step ran eagerly
  int32_t captures = 0;                // graphs (or piecewise segment sets) captured in this step
  double capture_seconds = 0;          // time spent capturing them
  int32_t capture_failures = 0;
  int32_t replays = 0;                 // graph launches (1 for FULL, the segment count for PIECEWISE)
};

struct StepResult {
  uint64_t step_id = 0;
  std::vector<SampledToken> sampled;  // one per ScheduledSeq with sample = true, in plan order
  double execute_seconds = 0;
  // The device's time for the step's forward and sampling (timing events around them: the
  // metadata upload and the results' copy back are outside, a FULL step's sampling-row upload
  // inside), when the worker measures it (the GPU worker with DSV4_STEP_DEVICE_TIME=1); 0
  // otherwise.
  double device_seconds = 0;
  GraphRun graph;
  // Time in the step's collectives (tensor-parallel all-reduces) on the rank that ran it.
  double collective_seconds = 0;
  // A group of worker ranks (node/control/remote_worker_group.h): each rank's own execute and
  // collective seconds, and the coordinator's part beyond the slowest rank. Empty/0 otherwise.
  std::vector<double> rank_seconds;
  std::vector<double> rank_collective_seconds;
  double control_seconds = 0;
};

}  // namespace dsv4
