// extern "C" entry points of libdsv4_cuda.so (see worker/cuda_plugin.h for the host side).
#include "common/status.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_worker.h"
#include "worker/cuda_plugin.h"
#include "worker/checkpoint/safetensors.h"

#define DSV4_EXPORT __attribute__((visibility("default")))

namespace dsv4 {
namespace {

absl::StatusOr<std::unique_ptr<Worker>> BuildWorker(const CudaWorkerSpec& spec) {
  CudaBackendOptions options;
  options.device = spec.device;
  options.matrix_dtype = spec.precision == Precision::kFP32 ? DType::kF32 : DType::kBF16;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  std::unique_ptr<Dsv4Model> model;
  LoadOptions load;
  load.keep_formats = spec.keep_formats;
  load.synthetic_released_formats = spec.keep_formats;
  if (spec.model_dir.empty()) {
    ASSIGN_OR_RETURN(model, Dsv4Model::LoadSynthetic(spec.config, spec.synthetic_seed,
                                                     std::move(backend), spec.cache, load));
  } else {
    ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(spec.model_dir));
    ASSIGN_OR_RETURN(model,
                     Dsv4Model::Load(spec.config, *ckpt, std::move(backend), spec.cache, load));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaWorker> worker,
                   CudaWorker::Create(std::move(model), spec.graphs));
  return std::unique_ptr<Worker>(std::move(worker));
}

}  // namespace
}  // namespace dsv4

extern "C" {

DSV4_EXPORT int dsv4_cuda_plugin_abi() { return dsv4::kCudaPluginAbi; }

DSV4_EXPORT dsv4::Worker* dsv4_create_cuda_worker(const dsv4::CudaWorkerSpec* spec,
                                                  absl::Status* status) {
  auto w = dsv4::BuildWorker(*spec);
  if (!w.ok()) {
    *status = w.status();
    return nullptr;
  }
  return w->release();
}

DSV4_EXPORT dsv4::Backend* dsv4_create_cuda_backend(int device, int fp32, absl::Status* status) {
  dsv4::CudaBackendOptions options;
  options.device = device;
  options.matrix_dtype = fp32 != 0 ? dsv4::DType::kF32 : dsv4::DType::kBF16;
  auto b = dsv4::CudaBackend::Create(options);
  if (!b.ok()) {
    *status = b.status();
    return nullptr;
  }
  return b->release();
}

}  // extern "C"
