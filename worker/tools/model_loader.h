// Loads the model that ModelFlags name on this process, for the model tools (bench, generate).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_flags.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"
#include "worker/worker_factory.h"

namespace dsv4::cli {

class ModelLoader {
 public:
  explicit ModelLoader(const ModelFlags& flags) : flags_(flags) {}
  // Loads config + checkpoint (or synthetic weights) on the chosen device and builds the model
  // with room for `slots` sequences of up to `max_len` tokens.
  absl::StatusOr<std::unique_ptr<Dsv4Model>> Load(int slots, int64_t max_len);
  // The memory plan's step budget for the next Load/LoadWorker (CacheConfig::max_step_tokens and
  // max_graph_tokens): the tokens of the largest step the command will run (0 = the default) and
  // of the largest it runs as a graph (0 = none).
  void set_step_budget(int64_t tokens, int32_t graph_tokens) {
    max_step_tokens_ = tokens;
    max_graph_tokens_ = graph_tokens;
  }
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
    bool batch_invariant = false;
    CacheConfig cache;
  };
  absl::StatusOr<Plan> Prepare(int slots, int64_t max_len);
  const ModelFlags& flags_;
  std::string resolved_device_;
  ModelConfig config_;
  int64_t max_step_tokens_ = 0;
  int32_t max_graph_tokens_ = -1;  // unknown until set_step_budget
};

}  // namespace dsv4::cli
