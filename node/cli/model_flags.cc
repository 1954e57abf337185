#include "node/cli/model_flags.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/paths.h"
#include "common/status.h"
#include "kernels/cpu_gemm.h"
#include "worker/worker_factory.h"

namespace dsv4::cli {

void ModelFlags::Register(CLI::App& app) {
  app.add_option("--model", model_dir, "model directory (config.json + safetensors); default: "
                                       "the embedded dsv4-tiny model");
  app.add_option("--device", device, "auto (a GPU when present), cpu, cuda or cuda:N");
  app.add_option("--precision", precision, "GPU weight precision: bf16 or fp32 (exact checks)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--synthetic-config", synthetic_config,
                 "run a config.json with deterministic synthetic weights (no checkpoint)");
  app.add_option("--weights-seed", seed, "seed of the synthetic weights");
  app.add_option("--weight-format", weight_format,
                 "auto: keep the checkpoint's formats on the GPU (FP8 projections, MXFP4 experts; "
                 "synthetic weights in those formats); bf16: dequantise at load (the baseline)")
      ->check(CLI::IsMember({"auto", "bf16"}));
  app.add_option("--threads", threads, "BLAS threads (0 = default)")->check(CLI::Range(0, 1024));
  app.add_option("--block-size", block_size, "tokens per KV block (0 = default)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_flag("--force-indexer-scoring", force_indexer_scoring,
               "always score the lightning indexer (disable the short-context shortcut)");
}

absl::StatusOr<std::string> ModelFlags::ResolveModelDir() const {
  if (!model_dir.empty()) return model_dir;
  std::string dir = DefaultModelDir();
  if (dir.empty()) {
    return absl::NotFoundError("no --model given and the embedded model was not found "
                               "(set DSV4_MODEL_DIR)");
  }
  return dir;
}

absl::StatusOr<ModelFlags::Plan> ModelFlags::Prepare(int slots, int64_t max_len) {
  Plan p;
  std::string config_path;
  if (!synthetic_config.empty()) {
    p.weights.synthetic = true;
    p.weights.seed = seed;
    config_path = synthetic_config;
  } else {
    ASSIGN_OR_RETURN(p.weights.model_dir, ResolveModelDir());
    config_path = p.weights.model_dir + "/config.json";
  }
  RETURN_IF_ERROR(ParseWeightFormat(weight_format, &p.weights));
  SetBlasThreads(threads);
  ASSIGN_OR_RETURN(p.device, ResolveDevice(device));
  ASSIGN_OR_RETURN(p.precision, ParsePrecision(precision));
  resolved_device_ = p.device.name();
  ASSIGN_OR_RETURN(p.config, LoadModelConfig(config_path));
  config_ = p.config;
  p.cache.block_size = block_size > 0 ? block_size : DefaultBlockSize(p.config);
  p.cache.num_slots = slots;
  if (max_len > p.config.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("a sequence of ", max_len, " tokens exceeds "
                                              "max_position_embeddings = ",
                                              p.config.max_position_embeddings));
  }
  p.cache.max_model_len = static_cast<int32_t>(max_len);
  p.cache.max_step_tokens =
      static_cast<int32_t>(std::min<int64_t>(max_step_tokens_, std::numeric_limits<int32_t>::max()));
  p.cache.num_blocks =
      static_cast<int32_t>(slots * ((max_len + p.cache.block_size - 1) / p.cache.block_size));
  LogInfo("model_loading", {{"config_path", config_path},
                            {"weights", p.weights.synthetic ? "synthetic" : "checkpoint"},
                            {"device", resolved_device_},
                            {"precision", p.device.cuda ? PrecisionName(p.precision) : "fp32"},
                            {"weight_format", weight_format},
                            {"config", p.config.Summary()}});
  return p;
}

absl::StatusOr<std::unique_ptr<Dsv4Model>> ModelFlags::Load(int slots, int64_t max_len) {
  ASSIGN_OR_RETURN(Plan p, Prepare(slots, max_len));
  return CreateModel(p.device, p.precision, p.config, p.weights, p.cache);
}

absl::StatusOr<std::unique_ptr<Worker>> ModelFlags::LoadWorker(int slots, int64_t max_len) {
  ASSIGN_OR_RETURN(Plan p, Prepare(slots, max_len));
  return CreateWorker(p.device, p.precision, p.config, p.weights, p.cache);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace dsv4::cli
