// Flags shared by subcommands that load a model on this process.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker_factory.h"

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

  void Register(CLI::App& app);
  // Resolves the model directory (error if none is found).
  absl::StatusOr<std::string> ResolveModelDir() const;
  // Loads config + checkpoint (or synthetic weights) on the chosen device and builds the model
  // with room for `slots` sequences of up to `max_len` tokens.
  absl::StatusOr<std::unique_ptr<Dsv4Model>> Load(int slots, int64_t max_len);
  // The memory plan's step budget (CacheConfig::max_step_tokens) for the next Load/LoadWorker:
  // the tokens of the largest step the command will run; 0 = the default.
  void set_max_step_tokens(int64_t tokens) { max_step_tokens_ = tokens; }
  // The same model behind a serving worker (on-device sampling on CUDA).
  absl::StatusOr<std::unique_ptr<Worker>> LoadWorker(int slots, int64_t max_len);
  // The config of the last Load().
  const ModelConfig& config() const { return config_; }
  // The device the last Load() used ("cpu", "cuda:0").
  const std::string& resolved_device() const { return resolved_device_; }

 private:
  struct Plan {
    ModelConfig config;
    WeightsSpec weights;
    DeviceChoice device;
    Precision precision = Precision::kBF16;
    CacheConfig cache;
  };
  absl::StatusOr<Plan> Prepare(int slots, int64_t max_len);
  std::string resolved_device_;
  ModelConfig config_;
  int64_t max_step_tokens_ = 0;
};

// Prints "error: <status>" to stderr and returns 1.
int Fail(const absl::Status& status);

}  // namespace dsv4::cli
