// The coordinator's CUDA-graph choice for each step. The worker executes the plan verbatim, so the
// mode and the padded token count are decided here, from the plan's shape only, identically on
// every rank:
//
//   uniform decode (every sequence feeds exactly one token) -> FULL graph (PIECEWISE under
//                                                              `piecewise`)
//   mixed / prefill                                         -> PIECEWISE graph (FULL under
//                                                              `full`, eager under
//                                                              `full_decode_only`)
//
// Both pad the step to the smallest capture size >= its token count (padded rows are inert). A step
// larger than every capture size runs eagerly and counts as an eager fallback.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/step_plan.h"

namespace dsv4 {

// The `--cudagraph-mode` values (vLLM's names).
enum class CudaGraphMode { kNone, kPiecewise, kFull, kFullDecodeOnly, kFullAndPiecewise };

// "none|piecewise|full|full_decode_only|full_and_piecewise"; InvalidArgument names the bad value.
absl::StatusOr<CudaGraphMode> ParseCudaGraphMode(std::string_view s);
const char* CudaGraphModeName(CudaGraphMode m);

struct GraphConfig {
  CudaGraphMode mode = CudaGraphMode::kFullAndPiecewise;
  std::vector<int32_t> capture_sizes;  // ascending, unique, positive
};

// The most tokens a step run as a graph may be padded to (CacheConfig::max_graph_tokens, for the
// worker's memory plan): steps of up to `max_step_tokens` in the modes that graph prefill and
// mixed steps, decode batches of up to `max_seqs` in kFullDecodeOnly; 0 without graphs.
int32_t MaxGraphTokens(const GraphConfig& config, int64_t max_step_tokens, int64_t max_seqs);

// The largest default capture size: beyond it a graph saves little next to the step's own work,
// and every size costs capture time and graph memory.
inline constexpr int32_t kMaxDefaultCaptureSize = 512;

// 1, 2, 4, then 8..256 in steps of 8, then 272..512 in steps of 16, keeping the sizes
// <= min(max_size, 512); max_size itself is appended when it is <= 512 and not already listed, so
// a step of exactly the budget still fits a graph. Empty for max_size < 1.
std::vector<int32_t> DefaultCaptureSizes(int32_t max_size);

// "1,2,4,8" -> sorted unique sizes. Items may have surrounding spaces; an empty, non-numeric,
// zero or negative item is InvalidArgument naming it, and so is an empty list.
absl::StatusOr<std::vector<int32_t>> ParseCaptureSizes(std::string_view s);
// "1,2,4,8" (for logs and tables).
std::string CaptureSizesString(const std::vector<int32_t>& sizes);

// The graph config from the command-line flags: `mode` as --cudagraph-mode, `sizes` as
// --cudagraph-capture-sizes ("" = DefaultCaptureSizes(default_max_size)); `enforce_eager` (the
// kill switch) forces mode none. Errors name the flag.
absl::StatusOr<GraphConfig> GraphConfigFromFlags(std::string_view mode, std::string_view sizes,
                                                 bool enforce_eager, int32_t default_max_size);

struct GraphChoice {
  GraphMode mode = GraphMode::kEager;
  int32_t padded_tokens = 0;  // capture size >= the plan's tokens; 0 when eager
  bool fallback = false;      // graphs are on but no capture size fits the step
};

// The graph for one step (see the table at the top). Eager without a fallback when the worker
// runs no graphs, the mode is none, or the plan has no tokens.
GraphChoice ChooseGraph(const StepPlan& plan, const GraphConfig& config,
                        bool worker_supports_graphs);

}  // namespace dsv4
