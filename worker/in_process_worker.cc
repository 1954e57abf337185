#include "worker/in_process_worker.h"

#include "common/log.h"
#include "common/status.h"
#include "kernels/cpu_gemm.h"
#include "worker/worker_factory.h"

namespace dsv4 {

absl::StatusOr<std::unique_ptr<Worker>> CreateInProcessWorker(const WorkerConfig& config) {
  ASSIGN_OR_RETURN(const DeviceChoice device, ResolveDevice(config.device));
  ASSIGN_OR_RETURN(const Precision precision, ParsePrecision(config.precision));
  WeightsSpec weights;
  RETURN_IF_ERROR(ParseWeightFormat(config.weight_format, &weights));
  SetBlasThreads(config.threads);
  weights.model_dir = config.model_dir;
  weights.synthetic = config.synthetic;
  weights.seed = config.synthetic_seed;
  LogInfo("model_loading", {{"dir", config.source},
                            {"weights", config.synthetic ? "synthetic" : "checkpoint"},
                            {"weight_format", config.weight_format},
                            {"device", device.name()},
                            {"precision", device.cuda ? PrecisionName(precision) : "fp32"},
                            {"config", config.model.Summary()}});
  return CreateWorker(device, precision, config.model, weights, config.cache);
}

}  // namespace dsv4
