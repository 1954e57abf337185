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
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"

namespace dsv4 {

constexpr int kCudaPluginAbi = 5;

enum class Precision { kBF16, kFP32 };
absl::StatusOr<Precision> ParsePrecision(std::string_view s);
const char* PrecisionName(Precision p);

// Graph switches of the CUDA worker (docs/cuda-graphs.md); the environment can turn each on too:
// DSV4_ENFORCE_EAGER=0|1, DSV4_PIECEWISE_EAGER_REGION=narrow|wide,
// DSV4_DEBUG_INDEXER_SHORTCUT_IN_CAPTURE=0|1 (any other value: creating the worker fails, naming it).
struct CudaGraphOptions {
  bool enforce_eager = false;        // kill switch: every step eager, whatever the plan says
  bool wide_eager_region = false;    // piecewise: each layer's whole attention block eager
  bool shortcut_in_capture = false;  // debug only: reproduces vLLM #52448 (regression self-check)
};

struct CudaWorkerSpec {
  int device = 0;
  Precision precision = Precision::kBF16;
  ModelConfig config;
  std::string model_dir;        // checkpoint directory; empty = synthetic weights
  uint64_t synthetic_seed = 0;
  bool keep_formats = true;     // --weight-format auto (WeightsSpec::keep_formats)
  CacheConfig cache;
  CudaGraphOptions graphs;
};

// Number of CUDA devices, or an error saying why there are none usable (no plugin, no driver).
absl::StatusOr<int> CudaDeviceCount();
absl::StatusOr<std::unique_ptr<Worker>> CreateCudaWorker(const CudaWorkerSpec& spec);
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, Precision precision);

}  // namespace dsv4

// The plugin's exports. Each returns nullptr and sets *status on failure.
extern "C" {
using Dsv4CudaAbiFn = int();
using Dsv4CreateCudaWorkerFn = dsv4::Worker*(const dsv4::CudaWorkerSpec* spec, absl::Status* status);
using Dsv4CreateCudaBackendFn = dsv4::Backend*(int device, int fp32, absl::Status* status);
}
