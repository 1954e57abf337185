#include "worker/cuda_plugin.h"

#include "parallel/communicator.h"

#include "absl/strings/str_cat.h"
#include "common/plugin.h"
#include "common/status.h"

namespace dsv4 {
namespace {

// Loaded once; kept until exit so that objects it created never outlive their code.
absl::StatusOr<const Plugin*> LoadPlugin() {
  static const absl::StatusOr<Plugin>* plugin = [] {
    auto* p = new absl::StatusOr<Plugin>(Plugin::Open(DefaultCudaPluginPath()));
    if (p->ok()) {
      auto abi = (*p)->Function<Dsv4CudaAbiFn>("dsv4_cuda_plugin_abi");
      if (!abi.ok()) {
        *p = abi.status();
      } else if ((**abi)() != kCudaPluginAbi) {
        *p = absl::FailedPreconditionError(absl::StrCat(
            "CUDA plugin ", DefaultCudaPluginPath(), " has ABI ", (**abi)(), ", this binary needs ",
            kCudaPluginAbi, ": rebuild both from one tree"));
      }
    }
    return p;
  }();
  if (!plugin->ok()) return plugin->status();
  return &**plugin;
}

}  // namespace

absl::StatusOr<Precision> ParsePrecision(std::string_view s) {
  if (s == "bf16") return Precision::kBF16;
  if (s == "fp32") return Precision::kFP32;
  if (s == "fp8") return Precision::kFP8;
  return absl::InvalidArgumentError(
      absl::StrCat("precision must be bf16, fp8 or fp32, got '", AV(s), "'"));
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFP32: return "fp32";
    case Precision::kFP8: return "fp8";
    case Precision::kBF16: break;
  }
  return "bf16";
}

absl::StatusOr<int> CudaDeviceCount() {
  ASSIGN_OR_RETURN(const Plugin* plugin, LoadPlugin());
  using CountFn = int(char*, int);
  ASSIGN_OR_RETURN(CountFn * count, plugin->Function<CountFn>("dsv4_cuda_device_count"));
  char msg[256] = {0};
  const int n = count(msg, sizeof(msg));
  if (n < 0) return absl::UnavailableError(absl::StrCat("no CUDA device: ", msg));
  return n;
}

absl::StatusOr<std::unique_ptr<Worker>> CreateCudaWorker(int device) {
  ASSIGN_OR_RETURN(const Plugin* plugin, LoadPlugin());
  ASSIGN_OR_RETURN(Dsv4CreateCudaWorkerFn * create,
                   plugin->Function<Dsv4CreateCudaWorkerFn>("dsv4_create_cuda_worker"));
  absl::Status status;
  std::unique_ptr<Worker> w(create(device, &status));
  if (w == nullptr) return status.ok() ? absl::InternalError("CUDA worker creation failed") : status;
  return w;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, Precision precision,
                                                           bool batch_invariant) {
  ASSIGN_OR_RETURN(const Plugin* plugin, LoadPlugin());
  ASSIGN_OR_RETURN(Dsv4CreateCudaBackendFn * create,
                   plugin->Function<Dsv4CreateCudaBackendFn>("dsv4_create_cuda_backend"));
  absl::Status status;
  std::unique_ptr<Backend> b(
      create(device, static_cast<int>(precision), batch_invariant ? 1 : 0, &status));
  if (b == nullptr) return status.ok() ? absl::InternalError("CUDA backend creation failed") : status;
  return b;
}

absl::StatusOr<std::string> NcclUniqueId() {
  ASSIGN_OR_RETURN(const Plugin* plugin, LoadPlugin());
  ASSIGN_OR_RETURN(Dsv4NcclUniqueIdFn * fn, plugin->Function<Dsv4NcclUniqueIdFn>("dsv4_nccl_unique_id"));
  char buf[256];
  absl::Status status;
  const int n = fn(buf, sizeof(buf), &status);
  if (n < 0) return status.ok() ? absl::InternalError("nccl unique id failed") : status;
  return std::string(buf, static_cast<size_t>(n));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int world_size,
                                                                     const std::string& unique_id,
                                                                     int device) {
  ASSIGN_OR_RETURN(const Plugin* plugin, LoadPlugin());
  ASSIGN_OR_RETURN(Dsv4CreateNcclCommunicatorFn * fn,
                   plugin->Function<Dsv4CreateNcclCommunicatorFn>("dsv4_create_nccl_communicator"));
  absl::Status status;
  std::unique_ptr<Communicator> c(fn(rank, world_size, unique_id.data(),
                                     static_cast<int>(unique_id.size()), device, &status));
  if (c == nullptr) return status.ok() ? absl::InternalError("nccl communicator creation failed") : status;
  return c;
}

}  // namespace dsv4
