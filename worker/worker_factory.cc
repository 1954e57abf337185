#include "worker/worker_factory.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/cpu_worker.h"
#include "worker/checkpoint/safetensors.h"

namespace dsv4 {

std::string DeviceChoice::name() const { return cuda ? absl::StrCat("cuda:", index) : "cpu"; }

absl::StatusOr<DeviceChoice> ResolveDevice(std::string_view device) {
  DeviceChoice d;
  if (device == "cpu") return d;
  if (device == "auto") {
    auto n = CudaDeviceCount();
    d.cuda = n.ok() && *n > 0;
    return d;
  }
  if (device == "cuda") {
    d.cuda = true;
  } else if (device.substr(0, 5) == "cuda:" &&
             absl::SimpleAtoi(AV(device.substr(5)), &d.index) && d.index >= 0) {
    d.cuda = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be auto, cpu, cuda or cuda:N, got '", AV(device), "'"));
  }
  ASSIGN_OR_RETURN(int n, CudaDeviceCount());
  if (d.index >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", d.name(), " requested but ", n, " CUDA device(s) are visible"));
  }
  return d;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const DeviceChoice& device,
                                                       Precision precision, bool batch_invariant) {
  if (!device.cuda) return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  return CreateCudaBackend(device.index, precision, batch_invariant);
}

absl::Status CheckBatchInvariant(const WorkerConfig& config) {
  if (config.batch_invariant && config.parallel.world_size > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_invariant: needs at most 2 tensor-parallel ranks, got ", config.parallel.world_size,
        " (the all-reduce of more ranks sums in an order that depends on the step's size)"));
  }
  if (config.batch_invariant && config.precision == "fp8") {
    return absl::InvalidArgumentError(
        "batch_invariant: does not combine with precision fp8 (FP8 activations from 128 rows "
        "on: a row's numbers would depend on the step's size)");
  }
  return absl::OkStatus();
}

absl::Status ParseWeightFormat(std::string_view value, WeightsSpec* spec) {
  if (value == "auto" || value == "bf16") {
    spec->keep_formats = value == "auto";
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--weight-format: \"", AV(value.substr(0, 32)), "\" is not auto or bf16"));
}

absl::StatusOr<std::unique_ptr<Dsv4Model>> CreateModel(const DeviceChoice& device,
                                                       Precision precision,
                                                       const ModelConfig& config,
                                                       const WeightsSpec& weights,
                                                       const CacheConfig& cache,
                                                       bool batch_invariant) {
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   CreateBackend(device, precision, batch_invariant));
  LoadOptions load;
  load.keep_formats = weights.keep_formats;
  load.synthetic_released_formats = weights.keep_formats;
  if (weights.synthetic) {
    return Dsv4Model::LoadSynthetic(config, weights.seed, std::move(backend), cache, load);
  }
  ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(weights.model_dir));
  return Dsv4Model::Load(config, *ckpt, std::move(backend), cache, load);
}

absl::StatusOr<std::unique_ptr<Worker>> CreateEmptyWorker(const DeviceChoice& device) {
  if (device.cuda) return CreateCudaWorker(device.index);
  return std::unique_ptr<Worker>(std::make_unique<CpuWorker>());
}

absl::StatusOr<std::unique_ptr<Worker>> CreateWorker(const DeviceChoice& device,
                                                     Precision precision,
                                                     const ModelConfig& config,
                                                     const WeightsSpec& weights,
                                                     const CacheConfig& cache,
                                                     const CudaGraphOptions& graphs,
                                                     bool batch_invariant) {
  WorkerConfig wc;
  wc.precision = PrecisionName(precision);
  wc.batch_invariant = batch_invariant;
  wc.weight_format = weights.keep_formats ? "auto" : "bf16";
  wc.model_dir = weights.synthetic ? "" : weights.model_dir;
  wc.synthetic = weights.synthetic;
  wc.synthetic_seed = weights.seed;
  wc.model = config;
  wc.cache = cache;
  wc.graphs = graphs;
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, CreateEmptyWorker(device));
  RETURN_IF_ERROR(BringUp(*worker, wc));
  return worker;
}

}  // namespace dsv4
