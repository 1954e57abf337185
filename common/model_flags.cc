#include "common/model_flags.h"

#include "common/paths.h"

namespace dsv4::cli {

void ModelFlags::Register(CLI::App& app) {
  app.add_option("--model", model_dir, "model directory (config.json + safetensors); default: "
                                       "the embedded dsv4-tiny model");
  app.add_option("--device", device, "auto (a GPU when present), cpu, cuda or cuda:N");
  app.add_option("--precision", precision,
                 "GPU precision: bf16; fp8 (bf16, and prefill-sized products with FP8 weights on "
                 "FP8 tensor cores with e4m3 activations in 1x128 groups, as DeepSeek's own "
                 "inference); fp32 (exact checks)")
      ->check(CLI::IsMember({"bf16", "fp8", "fp32"}));
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
  app.add_flag("--batch-invariant", batch_invariant,
               "GPU kernels whose every row is independent of the step's batch: a request gives "
               "the same bits alone or batched, chunked or from the prefix cache (slower)");
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

}  // namespace dsv4::cli
