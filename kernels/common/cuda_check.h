// Status-returning checks for CUDA runtime and cuBLAS calls (plugin code only: needs the CUDA
// headers). Errors carry the failing call, the error's name and text, and file:line; the sticky
// error is cleared. CUDA_LOG_IF_ERROR is the form for destructors.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4 {

inline absl::Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the sticky error where possible
  const std::string msg = absl::StrCat(call, " failed: ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ") at ", file, ":", line);
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
}

inline absl::Status CublasStatus(cublasStatus_t err, const char* call, const char* file, int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: cuBLAS status ", static_cast<int>(err),
                                          " (", cublasGetStatusString(err), ") at ", file, ":",
                                          line));
}

}  // namespace dsv4

#define CUDA_RETURN_IF_ERROR(call)                                                        \
  do {                                                                                    \
    const cudaError_t dsv4_err_ = (call);                                                 \
    if (dsv4_err_ != cudaSuccess) return ::dsv4::CudaStatus(dsv4_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(call)                                                        \
  do {                                                                                      \
    const cublasStatus_t dsv4_err_ = (call);                                                \
    if (dsv4_err_ != CUBLAS_STATUS_SUCCESS)                                                 \
      return ::dsv4::CublasStatus(dsv4_err_, #call, __FILE__, __LINE__);                    \
  } while (0)

// After a kernel launch.
#define CUDA_RETURN_IF_LAUNCH_ERROR() CUDA_RETURN_IF_ERROR(cudaGetLastError())

#define CUDA_LOG_IF_ERROR(call)                                                             \
  do {                                                                                      \
    const cudaError_t dsv4_err_ = (call);                                                   \
    if (dsv4_err_ != cudaSuccess)                                                           \
      std::fprintf(stderr, "%s failed: %s at %s:%d\n", #call, cudaGetErrorString(dsv4_err_), \
                   __FILE__, __LINE__);                                                     \
  } while (0)
