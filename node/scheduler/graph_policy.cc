#include "node/scheduler/graph_policy.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4 {
namespace {

constexpr const char* kModeNames = "none|piecewise|full|full_decode_only|full_and_piecewise";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<CudaGraphMode> ParseCudaGraphMode(std::string_view s) {
  for (CudaGraphMode m : {CudaGraphMode::kNone, CudaGraphMode::kPiecewise, CudaGraphMode::kFull,
                          CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    if (s == CudaGraphModeName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CUDA graph mode '", AV(s), "' (expected ", kModeNames, ")"));
}

const char* CudaGraphModeName(CudaGraphMode m) {
  switch (m) {
    case CudaGraphMode::kNone: return "none";
    case CudaGraphMode::kPiecewise: return "piecewise";
    case CudaGraphMode::kFull: return "full";
    case CudaGraphMode::kFullDecodeOnly: return "full_decode_only";
    case CudaGraphMode::kFullAndPiecewise: return "full_and_piecewise";
  }
  return "none";
}

std::vector<int32_t> DefaultCaptureSizes(int32_t max_size) {
  const int32_t cap = std::min(max_size, kMaxDefaultCaptureSize);
  std::vector<int32_t> sizes;
  for (int32_t s : {1, 2, 4}) {
    if (s <= cap) sizes.push_back(s);
  }
  for (int32_t s = 8; s <= std::min(cap, 256); s += 8) sizes.push_back(s);
  for (int32_t s = 272; s <= cap; s += 16) sizes.push_back(s);
  if (max_size >= 1 && max_size <= kMaxDefaultCaptureSize && sizes.back() != max_size) {
    sizes.push_back(max_size);  // larger than every listed size (the list stops below it)
  }
  return sizes;
}

absl::StatusOr<std::vector<int32_t>> ParseCaptureSizes(std::string_view s) {
  if (Trim(s).empty()) return absl::InvalidArgumentError("no capture sizes given");
  std::vector<int32_t> sizes;
  size_t begin = 0;
  int index = 0;
  while (true) {
    const size_t comma = s.find(',', begin);
    const size_t len = comma == std::string_view::npos ? std::string_view::npos : comma - begin;
    const std::string_view item = Trim(s.substr(begin, len));
    int32_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("item ", index + 1, " of '", AV(s), "' is '",
                                                     AV(item), "', not a positive integer"));
    }
    sizes.push_back(v);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
    ++index;
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

std::string CaptureSizesString(const std::vector<int32_t>& sizes) {
  std::string out;
  for (int32_t s : sizes) absl::StrAppend(&out, out.empty() ? "" : ",", s);
  return out;
}

absl::StatusOr<GraphConfig> GraphConfigFromFlags(std::string_view mode, std::string_view sizes,
                                                 bool enforce_eager, int32_t default_max_size) {
  GraphConfig config;
  auto m = ParseCudaGraphMode(mode);
  if (!m.ok()) return Annotate(m.status(), "--cudagraph-mode");
  // The kill switch wins over the mode, but a bad mode is still an error: a typo in a config
  // file should not hide behind --enforce-eager and surface when the switch is removed.
  config.mode = enforce_eager ? CudaGraphMode::kNone : *m;
  if (Trim(sizes).empty()) {
    config.capture_sizes = DefaultCaptureSizes(default_max_size);
  } else {
    auto parsed = ParseCaptureSizes(sizes);
    if (!parsed.ok()) return Annotate(parsed.status(), "--cudagraph-capture-sizes");
    config.capture_sizes = *std::move(parsed);
  }
  return config;
}

GraphChoice ChooseGraph(const StepPlan& plan, const GraphConfig& config,
                        bool worker_supports_graphs) {
  const int64_t tokens = plan.num_tokens();
  if (!worker_supports_graphs || config.mode == CudaGraphMode::kNone || tokens == 0) return {};
  // Prefix-cache snapshots inside a chunk are taken by ops graphs do not capture (by design, not
  // a fallback).
  if (HasInStepSnapshots(plan)) return {};
  const bool uniform_decode =
      std::all_of(plan.seqs.begin(), plan.seqs.end(),
                  [](const ScheduledSeq& s) { return s.tokens.size() == 1; });
  GraphMode mode = GraphMode::kEager;
  switch (config.mode) {
    case CudaGraphMode::kNone: return {};
    case CudaGraphMode::kPiecewise: mode = GraphMode::kPiecewise; break;
    case CudaGraphMode::kFull: mode = GraphMode::kFull; break;
    case CudaGraphMode::kFullDecodeOnly:
      // Prefill and mixed steps are eager by configuration, not a fallback.
      if (!uniform_decode) return {};
      mode = GraphMode::kFull;
      break;
    case CudaGraphMode::kFullAndPiecewise:
      mode = uniform_decode ? GraphMode::kFull : GraphMode::kPiecewise;
      break;
  }
  const auto size = std::lower_bound(config.capture_sizes.begin(), config.capture_sizes.end(),
                                     tokens, [](int32_t s, int64_t t) { return s < t; });
  // Beyond every size: a decode batch that should have had a graph is a fallback (alerting: the
  // sizes are too small for the load); a long prefill or mixed step is expected to run eagerly.
  if (size == config.capture_sizes.end()) return {GraphMode::kEager, 0, uniform_decode};
  return {mode, *size, false};
}

int32_t MaxGraphTokens(const GraphConfig& config, int64_t max_step_tokens, int64_t max_seqs) {
  if (config.mode == CudaGraphMode::kNone || config.capture_sizes.empty()) return 0;
  const int64_t tokens =
      config.mode == CudaGraphMode::kFullDecodeOnly ? max_seqs : max_step_tokens;
  if (tokens <= 0) return 0;
  // The smallest size that holds `tokens`, or the largest size when none does (larger steps run
  // eagerly).
  const auto size = std::lower_bound(config.capture_sizes.begin(), config.capture_sizes.end(),
                                     tokens, [](int32_t s, int64_t t) { return s < t; });
  return size == config.capture_sizes.end() ? config.capture_sizes.back() : *size;
}

}  // namespace dsv4
