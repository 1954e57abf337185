// CUDA launcher: sampling on the GPU, one block per logits row, with the semantics of
// kernels/sampling_ref.h (penalties, min-tokens masking, greedy / temperature / top-k / min-p /
// top-p with Gumbel-max draws from the request's (seed, step) stream) plus raw log-probabilities.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::cuda {

constexpr int kMaxLogprobs = 20;

// Per row, in device memory.
struct SampleRow {
  float temperature;
  float top_p;
  float min_p;
  float repetition_penalty;
  float presence_penalty;
  float frequency_penalty;
  int32_t top_k;
  int32_t min_tokens;
  int32_t output_index;   // the request's step: RNG counter and the min-tokens test
  int32_t logprobs;       // top-n to return (<= kMaxLogprobs)
  int32_t counts_row;     // row of the penalty count tables, -1 = no penalties
  int32_t mask_offset;    // ids masked until min_tokens, in `mask_ids`
  int32_t mask_count;
  int32_t slot;  // state slot whose entry of `slot_tokens` gets the token, -1 = none
  uint64_t seed;
};

struct SampleOut {
  int32_t token;
  float logprob;
  int32_t top_ids[kMaxLogprobs];
  float top_logprobs[kMaxLogprobs];
  // 1 when the row's logits were broken: the chosen token's raw logit is NaN or Inf (a row of
  // NaN, or an overflow to +Inf), or, with log-probabilities, the row's log-sum-exp is (any NaN).
  // `token` is then only a valid id (the next step's input), not a sample, and the coordinator
  // fails the request.
  int32_t nonfinite;
};

// logits [rows, vocab] (read only); work [rows, vocab] scratch for the penalized row. seen/output
// counts [count rows, vocab] int32 (may be null when no row has counts_row >= 0). Each row's token
// also goes to slot_tokens[slot] when slot >= 0 (the next step's deferred input token; null = off).
absl::Status Sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params,
                    const int32_t* mask_ids, const int32_t* seen_counts,
                    const int32_t* output_counts, float* work, SampleOut* out, int32_t* slot_tokens,
                    cudaStream_t stream);

// Penalty bookkeeping: zero the count rows listed in `reset_rows` (n_reset), then add each fed
// token: seen[row[t]][token[t]] += 1, and output[...] += 1 when is_output[t]. Rows < 0 are skipped.
// A token < 0 is deferred: the one last sampled into slot row[t] (slot_tokens[row[t]]; the count
// rows are the state slots).
absl::Status UpdateCounts(const int32_t* reset_rows, int64_t n_reset, const int32_t* rows,
                          const int32_t* tokens, const uint8_t* is_output, int64_t n_tokens,
                          int64_t vocab, const int32_t* slot_tokens, int32_t* seen_counts,
                          int32_t* output_counts, cudaStream_t stream);

}  // namespace dsv4::cuda
