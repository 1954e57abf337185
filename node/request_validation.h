// Turns a public GenerateRequest into what the engine runs, checking every field a user can get
// wrong. Errors are INVALID_ARGUMENT (or OUT_OF_RANGE for lengths) whose message starts with the
// offending field's path, e.g. "sampling.top_p: must be in (0, 1], got 1.5".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/step_plan.h"
#include "dsv4/v1/dsv4.pb.h"
#include "node/output_processor.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4 {

struct NodeLimits {
  int64_t vocab_size = 0;
  int32_t max_model_len = 0;
  int64_t kv_capacity_tokens = 0;     // every block of the KV pool
  int32_t default_max_tokens = 1024;
  std::vector<int32_t> eos_token_ids;
  int32_t think_start_id = -1;
  int32_t think_end_id = -1;
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 256;
  int32_t max_stop_token_ids = 64;
  int32_t max_logprobs = 20;
  int64_t max_input_bytes = 1 << 20;
  int32_t max_messages = 1024;
  RepetitionMode repetition_mode = RepetitionMode::kObserve;
  RepetitionConfig repetition;
};

struct ValidatedRequest {
  std::string request_id;  // may be empty: the engine assigns one
  // Whose request it is (the caller's connection or TLS identity, service.h): request ids are
  // unique per owner and Abort reaches only the owner's requests. "" for in-process callers.
  std::string owner;
  std::vector<int32_t> prompt;
  std::shared_ptr<SamplingSpec> sampling;
  OutputOptions output;
  // Node-internal traffic (the warm-up request): not counted in metrics.
  bool internal = false;
};

// `seed_source` supplies seeds for requests that do not set one.
absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& req,
                                                 const Tokenizer& tokenizer,
                                                 const NodeLimits& limits, uint64_t default_seed);

}  // namespace dsv4
