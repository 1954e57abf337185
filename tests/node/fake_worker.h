// Shared by the engine tests that drive a fake worker: the pool it reports and the validation of
// requests against it.
#pragma once

#include "node/request_validation.h"
#include "node/tokenizer/tokenizer.h"
#include "worker/worker.h"

namespace dsv4::testing {

// 64 blocks of 16 tokens, 8 state slots, 512-token sequences.
inline WorkerInfo FakeWorkerInfo() {
  WorkerInfo i;
  i.device = "fake";
  i.num_blocks = 64;
  i.num_slots = 8;
  i.block_size = 16;
  i.max_model_len = 512;
  return i;
}

inline absl::StatusOr<ValidatedRequest> ValidateForFakeWorker(const v1::GenerateRequest& req,
                                                              const Tokenizer& tokenizer) {
  const WorkerInfo info = FakeWorkerInfo();
  NodeLimits limits;
  limits.vocab_size = tokenizer.vocab_size();
  limits.max_model_len = info.max_model_len;
  limits.kv_capacity_tokens = int64_t{info.num_blocks} * info.block_size;
  return ValidateRequest(req, tokenizer, limits, 1);
}

}  // namespace dsv4::testing
