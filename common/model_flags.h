// Flags that name a model and where it runs, shared by the subcommands that load one (serve's
// in-process worker, the model tools bench, generate, check-golden). Strings only: loading is the
// worker side's (worker/tools/model_loader.h, worker/in_process_worker.h).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"

namespace dsv4::cli {

struct ModelFlags {
  std::string model_dir;  // "" = the embedded default model
  std::string device = "auto";
  std::string precision = "bf16";
  std::string synthetic_config;  // config.json for synthetic weights (no checkpoint)
  uint64_t seed = 1;
  std::string weight_format = "auto";  // auto|bf16 (WeightsSpec::keep_formats)
  int threads = 0;        // BLAS threads; 0 = library default
  int block_size = 0;
  bool force_indexer_scoring = false;
  bool batch_invariant = false;  // GPU kernels whose rows do not depend on the step's batch

  void Register(CLI::App& app);
  // Resolves the model directory (error if none is found).
  absl::StatusOr<std::string> ResolveModelDir() const;
};

}  // namespace dsv4::cli
