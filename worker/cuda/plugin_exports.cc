// extern "C" entry points of libdsv4_cuda.so (see worker/cuda_plugin.h for the host side).
#include <cstring>

#include "common/status.h"
#include "parallel/nccl_communicator.h"
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

DSV4_EXPORT dsv4::Backend* dsv4_create_cuda_backend(int device, int precision,
                                                     int batch_invariant, absl::Status* status) {
  using dsv4::Precision;
  if (precision != static_cast<int>(Precision::kBF16) &&
      precision != static_cast<int>(Precision::kFP32) &&
      precision != static_cast<int>(Precision::kFP8)) {
    *status = absl::InvalidArgumentError("CUDA backend: unknown precision code");
    return nullptr;
  }
  dsv4::CudaBackendOptions options;
  options.device = device;
  options.matrix_dtype =
      precision == static_cast<int>(Precision::kFP32) ? dsv4::DType::kF32 : dsv4::DType::kBF16;
  options.fp8_activations = precision == static_cast<int>(Precision::kFP8);
  options.batch_invariant = batch_invariant != 0;
  auto b = dsv4::CudaBackend::Create(options);
  if (!b.ok()) {
    *status = b.status();
    return nullptr;
  }
  return b->release();
}

DSV4_EXPORT int dsv4_nccl_unique_id(char* out, int len, absl::Status* status) {
  auto id = dsv4::NewNcclUniqueId();
  if (!id.ok()) {
    *status = id.status();
    return -1;
  }
  if (static_cast<int>(id->size()) > len) {
    *status = absl::InvalidArgumentError("nccl unique id: buffer too small");
    return -1;
  }
  std::memcpy(out, id->data(), id->size());
  return static_cast<int>(id->size());
}

DSV4_EXPORT dsv4::Communicator* dsv4_create_nccl_communicator(int rank, int world_size,
                                                              const char* id, int id_len,
                                                              int device, absl::Status* status) {
  dsv4::NcclOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.device = device;
  o.unique_id.assign(id, static_cast<size_t>(id_len));
  auto c = dsv4::NcclCommunicator::Create(o);
  if (!c.ok()) {
    *status = c.status();
    return nullptr;
  }
  return c->release();
}

}  // extern "C"
