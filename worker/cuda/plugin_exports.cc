// extern "C" entry points of libdsv4_cuda.so (see worker/cuda_plugin.h for the host side).
#include "common/status.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_worker.h"
#include "worker/cuda_plugin.h"

#define DSV4_EXPORT __attribute__((visibility("default")))

extern "C" {

DSV4_EXPORT int dsv4_cuda_plugin_abi() { return dsv4::kCudaPluginAbi; }

DSV4_EXPORT dsv4::Worker* dsv4_create_cuda_worker(int device, absl::Status* status) {
  if (device < 0) {
    *status = absl::InvalidArgumentError("CUDA worker: a negative device index");
    return nullptr;
  }
  return new dsv4::CudaWorker(device);
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
