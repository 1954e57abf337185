// Device selection and worker construction for this process: "auto" takes the first GPU when the
// CUDA plugin loads and sees one, else the CPU; "cpu", "cuda" and "cuda:N" are explicit. A CPU
// worker runs the fp32 reference; a CUDA worker runs the GPU plugin in bf16 or fp32.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/cuda_plugin.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"

namespace dsv4 {

struct DeviceChoice {
  bool cuda = false;
  int index = 0;
  std::string name() const;  // "cpu" or "cuda:N"
};

// Parses and checks `device` (auto|cpu|cuda|cuda:N). An explicit cuda device that is not there
// is an error naming why (no plugin, no driver, index out of range).
absl::StatusOr<DeviceChoice> ResolveDevice(std::string_view device);

// A bare backend for driving Dsv4Model directly (CLI bench/generate, tests). batch_invariant:
// CudaBackendOptions::batch_invariant (the CPU backend always is).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const DeviceChoice& device,
                                                       Precision precision,
                                                       bool batch_invariant = false);

// Where the weights come from: a checkpoint directory, or synthetic weights (no file).
struct WeightsSpec {
  std::string model_dir;
  bool synthetic = false;
  uint64_t seed = 1;
  // --weight-format: auto keeps the formats the checkpoint stores (FP8, MXFP4) where the backend
  // computes with them, and makes synthetic matrices in the released formats; bf16 dequantises at
  // load and makes dense synthetic weights (the comparison baseline).
  bool keep_formats = true;
};

// Parses --weight-format (auto|bf16) into `spec`.
absl::Status ParseWeightFormat(std::string_view value, WeightsSpec* spec);

// WorkerConfig.batch_invariant holds with at most 2 ranks: a 2-rank all-reduce adds one pair per
// element, while with more the collective's summation order follows the message size, which is
// the step's token count.
absl::Status CheckBatchInvariant(const WorkerConfig& config);

absl::StatusOr<std::unique_ptr<Dsv4Model>> CreateModel(const DeviceChoice& device,
                                                       Precision precision,
                                                       const ModelConfig& config,
                                                       const WeightsSpec& weights,
                                                       const CacheConfig& cache,
                                                       bool batch_invariant = false);

// A worker on `device`, not yet configured (the lifecycle of worker.h).
absl::StatusOr<std::unique_ptr<Worker>> CreateEmptyWorker(const DeviceChoice& device);

// A ready worker for the serving engine (GPU sampling on CUDA): CreateEmptyWorker, then
// Configure, Load and WarmUp.
absl::StatusOr<std::unique_ptr<Worker>> CreateWorker(const DeviceChoice& device,
                                                     Precision precision,
                                                     const ModelConfig& config,
                                                     const WeightsSpec& weights,
                                                     const CacheConfig& cache,
                                                     const CudaGraphOptions& graphs = {},
                                                     bool batch_invariant = false);

}  // namespace dsv4
