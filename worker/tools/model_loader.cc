#include "worker/tools/model_loader.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/cpu_gemm.h"

namespace dsv4::cli {

absl::StatusOr<ModelLoader::Plan> ModelLoader::Prepare(int slots, int64_t max_len) {
  Plan p;
  std::string config_path;
  if (!flags_.synthetic_config.empty()) {
    p.weights.synthetic = true;
    p.weights.seed = flags_.seed;
    config_path = flags_.synthetic_config;
  } else {
    ASSIGN_OR_RETURN(p.weights.model_dir, flags_.ResolveModelDir());
    config_path = p.weights.model_dir + "/config.json";
  }
  RETURN_IF_ERROR(ParseWeightFormat(flags_.weight_format, &p.weights));
  SetBlasThreads(flags_.threads);
  ASSIGN_OR_RETURN(p.device, ResolveDevice(flags_.device));
  ASSIGN_OR_RETURN(p.precision, ParsePrecision(flags_.precision));
  p.batch_invariant = flags_.batch_invariant;
  resolved_device_ = p.device.name();
  ASSIGN_OR_RETURN(p.config, LoadModelConfig(config_path));
  config_ = p.config;
  p.cache.block_size = flags_.block_size > 0 ? flags_.block_size : DefaultBlockSize(p.config);
  p.cache.num_slots = slots;
  if (max_len > p.config.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("a sequence of ", max_len, " tokens exceeds "
                                              "max_position_embeddings = ",
                                              p.config.max_position_embeddings));
  }
  p.cache.max_model_len = static_cast<int32_t>(max_len);
  p.cache.max_step_tokens =
      static_cast<int32_t>(std::min<int64_t>(max_step_tokens_, std::numeric_limits<int32_t>::max()));
  p.cache.max_graph_tokens = max_graph_tokens_;
  p.cache.num_blocks =
      static_cast<int32_t>(slots * ((max_len + p.cache.block_size - 1) / p.cache.block_size));
  LogInfo("model_loading", {{"config_path", config_path},
                            {"weights", p.weights.synthetic ? "synthetic" : "checkpoint"},
                            {"device", resolved_device_},
                            {"precision", p.device.cuda ? PrecisionName(p.precision) : "fp32"},
                            {"weight_format", flags_.weight_format},
                            {"batch_invariant", flags_.batch_invariant},
                            {"config", p.config.Summary()}});
  return p;
}

absl::StatusOr<std::unique_ptr<Dsv4Model>> ModelLoader::Load(int slots, int64_t max_len) {
  ASSIGN_OR_RETURN(Plan p, Prepare(slots, max_len));
  return CreateModel(p.device, p.precision, p.config, p.weights, p.cache, p.batch_invariant);
}

absl::StatusOr<std::unique_ptr<Worker>> ModelLoader::LoadWorker(int slots, int64_t max_len) {
  ASSIGN_OR_RETURN(Plan p, Prepare(slots, max_len));
  return CreateWorker(p.device, p.precision, p.config, p.weights, p.cache, {}, p.batch_invariant);
}

}  // namespace dsv4::cli
