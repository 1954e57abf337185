// The CUDA plugin seen from the host: libdsv4_cuda.so is loaded with dlopen (never linked, see
// the cuBLAS/civetweb pitfall in docs/toolchain notes) and exports extern "C" factories for the
// GPU worker and the bare CUDA backend. Both sides are built from this tree with the same
// toolchain and share libstdc++ and the system abseil, so C++ objects cross the boundary; an ABI
// number guards against a stale plugin. The plugin stays loaded for the life of the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model/backend.h"
#include "worker/worker.h"

namespace dsv4 {

constexpr int kCudaPluginAbi = 11;

// kFP8: bf16, and FP8 e4m3 activations (1 x 128 groups) into the FP8-weight products of
// prefill-sized steps (CudaBackendOptions::fp8_activations).
enum class Precision { kBF16, kFP32, kFP8 };
absl::StatusOr<Precision> ParsePrecision(std::string_view s);
const char* PrecisionName(Precision p);

// Number of CUDA devices, or an error saying why there are none usable (no plugin, no driver).
absl::StatusOr<int> CudaDeviceCount();
// The GPU worker on device `device`, not yet configured (worker.h's lifecycle: Configure, Load,
// WarmUp). CudaGraphOptions (worker.h) come with its WorkerConfig.
absl::StatusOr<std::unique_ptr<Worker>> CreateCudaWorker(int device);
// batch_invariant: CudaBackendOptions::batch_invariant.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, Precision precision,
                                                           bool batch_invariant = false);

// NCCL through the plugin (parallel/nccl_communicator.h): a fresh unique id (rank 0 makes it, the
// control plane hands it to the others) and a rank's communicator on `device`.
absl::StatusOr<std::string> NcclUniqueId();
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int world_size,
                                                                     const std::string& unique_id,
                                                                     int device);

}  // namespace dsv4

// The plugin's exports. Each returns nullptr and sets *status on failure.
extern "C" {
using Dsv4CudaAbiFn = int();
using Dsv4CreateCudaWorkerFn = dsv4::Worker*(int device, absl::Status* status);
// precision: static_cast<int>(dsv4::Precision).
using Dsv4CreateCudaBackendFn = dsv4::Backend*(int device, int precision, int batch_invariant,
                                                absl::Status* status);
using Dsv4NcclUniqueIdFn = int(char* out, int len, absl::Status* status);
using Dsv4CreateNcclCommunicatorFn = dsv4::Communicator*(int rank, int world_size, const char* id,
                                                         int id_len, int device,
                                                         absl::Status* status);
}
