// Golden check: runs every prompt of a fixture directory (config.json, model.safetensors,
// golden.json, golden.safetensors; format in ../shared/fixtures/README.md) through Dsv4Model and
// compares with the transformers reference: prefill logits at all positions, decode logits through
// the cache (teacher-forced with the reference greedy ids, whose argmax must match), the last
// logits of a two-chunk prefill, and the same prompts run together as one ragged batch.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/backend.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {

struct GoldenItem {
  std::string name;      // "p3.decode_logits"
  double max_abs = 0;    // largest |ours - reference|
  bool pass = false;
  std::string detail;    // e.g. the first greedy-id mismatch
};

struct GoldenReport {
  double tolerance = 0;
  std::vector<GoldenItem> items;
  bool pass() const;
  double max_abs() const;
};

struct GoldenOptions {
  std::function<std::unique_ptr<Backend>()> make_backend;  // defaults to the CPU backend
  CacheConfig cache;                                       // num_blocks/slots 0 = sized for the fixture
  bool force_indexer_scoring = false;
  bool batched = true;  // also run all prompts as one ragged batch
  LoadOptions load;     // keep_formats false: FP8/MXFP4 dequantised at load (--weight-format bf16)
};

// Runs the check. Errors (unreadable fixture, model load failure) are a Status; numeric
// mismatches are reported as failed items.
absl::StatusOr<GoldenReport> RunGoldenCheck(const std::string& dir, const GoldenOptions& options);

}  // namespace dsv4
