// The backends the model-level suites run on: the CPU reference, and the CUDA backend (from the
// plugin; the suites skip without a device) in its default mode or batch-invariant
// (CudaBackendOptions::batch_invariant), where every property that holds bit for bit on the CPU
// must hold bit for bit too.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/worker_factory.h"

namespace dsv4::testing {

enum class TestBackend { kCpu, kCudaFp32, kCudaFp32Invariant, kCudaBf16Invariant };

inline std::string TestBackendName(TestBackend b) {
  switch (b) {
    case TestBackend::kCpu: return "cpu";
    case TestBackend::kCudaFp32: return "cuda_fp32";
    case TestBackend::kCudaFp32Invariant: return "cuda_fp32_invariant";
    case TestBackend::kCudaBf16Invariant: return "cuda_bf16_invariant";
  }
  return "?";
}

inline bool IsCuda(TestBackend b) { return b != TestBackend::kCpu; }
// Whether results must be bit-exact across batching and chunking on this backend.
inline bool IsBatchInvariant(TestBackend b) { return b != TestBackend::kCudaFp32; }

inline absl::StatusOr<std::unique_ptr<Backend>> MakeTestBackend(TestBackend b) {
  switch (b) {
    case TestBackend::kCpu: return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
    case TestBackend::kCudaFp32: return CreateCudaBackend(0, Precision::kFP32);
    case TestBackend::kCudaFp32Invariant: return CreateCudaBackend(0, Precision::kFP32, true);
    case TestBackend::kCudaBf16Invariant: return CreateCudaBackend(0, Precision::kBF16, true);
  }
  return absl::InvalidArgumentError("unknown test backend");
}

}  // namespace dsv4::testing
