#include "node/cli/model_flags.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/paths.h"
#include "common/status.h"
#include "kernels/cpu_gemm.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/safetensors.h"

namespace dsv4::cli {

void ModelFlags::Register(CLI::App& app) {
  app.add_option("--model", model_dir, "model directory (config.json + safetensors); default: "
                                       "the embedded dsv4-tiny model");
  app.add_option("--device", device, "execution device")->check(CLI::IsMember({"cpu"}));
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

absl::StatusOr<std::unique_ptr<Dsv4Model>> ModelFlags::Load(int slots, int64_t max_len) const {
  ASSIGN_OR_RETURN(std::string dir, ResolveModelDir());
  SetBlasThreads(threads);
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "/config.json"));
  ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(dir));
  CacheConfig cache;
  cache.block_size = block_size > 0 ? block_size : DefaultBlockSize(config);
  cache.num_slots = slots;
  if (max_len > config.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("a sequence of ", max_len, " tokens exceeds "
                                              "max_position_embeddings = ",
                                              config.max_position_embeddings));
  }
  cache.num_blocks =
      static_cast<int32_t>(slots * ((max_len + cache.block_size - 1) / cache.block_size));
  LogInfo("model_loading", {{"dir", dir}, {"config", config.Summary()}});
  return Dsv4Model::Load(config, *ckpt, std::make_unique<CpuBackend>(), cache);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace dsv4::cli
